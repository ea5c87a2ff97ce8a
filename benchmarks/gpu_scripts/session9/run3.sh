#!/bin/bash
# Session 9 run 3 (H100): the train step with the default (H200-measured) block tables, then with every kernel
# (flash attention, BDRLN/layernorm, bias+GELU) tuned at first trace on this GPU (a fresh cache), then the default
# again (drift). Usage: S=128 B=64 bash run3.sh
export PYTHONPATH=. JAXFORMER_AUTOTUNE_CACHE=$OUT/autotune.json
S=${S:-128}; B=${B:-64}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
for run in off:140 tune:330 off:110; do m=${run%:*}
  JAXFORMER_AUTOTUNE=$m timeout ${run#*:} python benchmarks/train_step.py --config large --seq-len $S --batch-size $B \
    --kernels auto --steps 10 --repeats 3 --warmup 2 > $OUT/step_${S}_$m.json 2> $OUT/step_${S}_$m.err
  grep "jaxformer autotune: [a-z_]* {" $OUT/step_${S}_$m.err | cut -c1-300
  python -c "import json; d=json.load(open('$OUT/step_${S}_$m.json')); print('step', '$S', '$m', round(d['ms_per_step'],2), round(d['seq_per_s'],1), d['spread_ms'], round(d['compile_s'],1))" 2>&1 | tail -1
done
grep -h "jaxformer autotune" $OUT/step_${S}_tune.err | cut -c1-200 > $OUT/tune_lines.txt
