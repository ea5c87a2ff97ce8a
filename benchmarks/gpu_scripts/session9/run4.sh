#!/bin/bash
# Session 9 run 4 (H100): run 3's tuning timed out after caching flash attention (S128), BDRLN and bias+GELU
# (8192 rows); starting from that cache, tune what is left and time the step tuned vs the default tables.
export PYTHONPATH=. JAXFORMER_AUTOTUNE_CACHE=$OUT/autotune.json
cp benchmarks/gpu_scripts/session9/logs/run3_autotune_h100.json $OUT/autotune.json
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
for run in 128:64:tune:220 128:64:off:90 512:16:tune:170 512:16:off:90; do IFS=: read S B m T <<< "$run"
  JAXFORMER_AUTOTUNE=$m timeout $T python benchmarks/train_step.py --config large --seq-len $S --batch-size $B \
    --kernels auto --steps 10 --repeats 3 --warmup 2 > $OUT/step_${S}_$m.json 2> $OUT/step_${S}_$m.err
  grep "jaxformer autotune: [a-z_]* {" $OUT/step_${S}_$m.err | cut -c1-250
  python -c "import json; d=json.load(open('$OUT/step_${S}_$m.json')); print('step', '$S', '$m', round(d['ms_per_step'],2), round(d['seq_per_s'],1), d['spread_ms'], round(d['compile_s'],1))" 2>&1 | tail -1
done
