#!/bin/bash
# Session 8, run 5: the block-size autotuner (pallas_kernels/autotune.py) on the GPU: its tests, then the train step
# with the default table (JAXFORMER_AUTOTUNE=off) and with flash attention tuned at first trace (=tune, a fresh cache).
export PYTHONPATH=.
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
timeout 120 python -m pytest -q -p no:cacheprovider tests/test_autotune.py -s 2>&1 | grep -v "^jaxformer autotune: flash_attention stage" | tail -4
export JAXFORMER_AUTOTUNE_CACHE=$OUT/autotune.json
for s in "512 16" "128 64"; do set -- $s
  for m in off tune; do
    JAXFORMER_AUTOTUNE=$m timeout 200 python benchmarks/train_step.py --config large --seq-len $1 --batch-size $2 \
      --kernels auto --steps 10 --repeats 3 --warmup 2 > $OUT/step_$1_$m.json 2> $OUT/step_$1_$m.err
    grep "jaxformer autotune" $OUT/step_$1_$m.err | tail -1
    python -c "import json; d=json.load(open('$OUT/step_$1_$m.json')); print('step', '$1', '$m', round(d['ms_per_step'],2), round(d['seq_per_s'],1), d['spread_ms'], round(d['compile_s'],1))" 2>&1 | tail -1
  done
done
cat $OUT/autotune.json
