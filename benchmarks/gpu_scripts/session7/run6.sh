#!/bin/bash
# Session 7, run 6 (H100): bias+GELU's backends (run 5 timed out before them), the encoder layer (fwd+bwd), the train
# step, then the attention operator, on an H100.
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 120 python benchmarks/kernels.py --ops bias_gelu --passes fwd+bwd --repeats 3 --impls pallas,mgpu \
  > $OUT/bias_gelu.txt 2> $OUT/bias_gelu.err; grep "^|\|^#" $OUT/bias_gelu.txt; tail -2 $OUT/bias_gelu.err
timeout 200 python benchmarks/kernels.py --ops layer --passes fwd+bwd --repeats 3 \
  > $OUT/layer.txt 2> $OUT/layer.err; grep "^| layer\|^#" $OUT/layer.txt; tail -2 $OUT/layer.err
for s in "128 64" "512 16"; do set -- $s
  timeout 75 python benchmarks/train_step.py --config large --seq-len $1 --batch-size $2 --kernels auto \
    --steps 10 --repeats 3 --warmup 2 > $OUT/step_$1.json 2> $OUT/step_$1.err
  python -c "import json; d=json.load(open('$OUT/step_$1.json')); print('$1', round(d['ms_per_step'],2), round(d['seq_per_s'],1), d['spread_ms'], round(d['peak_memory_gib'],1))" 2>&1 | tail -1
done
timeout 150 python benchmarks/kernels.py --ops attention --passes fwd+bwd --repeats 3 --impls pallas \
  > $OUT/attention_ops.txt 2> $OUT/attention_ops.err; grep "^|\|^#" $OUT/attention_ops.txt; tail -2 $OUT/attention_ops.err
