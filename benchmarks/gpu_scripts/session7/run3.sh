#!/bin/bash
# Session 7, run 3: the new defaults (one-kernel key-major backward at T <= 128, key-major dK/dV pair above) compiled
# (all GPU tests of attention and the model), the attention operator table, the layer table and the train step.
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_kernel.py tests/test_gpu.py \
  > $OUT/gpu_tests.txt 2>&1; tail -3 $OUT/gpu_tests.txt
timeout 120 python benchmarks/kernels.py --ops attention --repeats 5 --impls pallas \
  > $OUT/attention_ops.txt 2> $OUT/attention_ops.err; grep "^|\|^#" $OUT/attention_ops.txt; tail -2 $OUT/attention_ops.err
timeout 150 python benchmarks/kernels.py --ops layer --passes fwd,fwd+bwd --repeats 3 \
  > $OUT/layer.txt 2> $OUT/layer.err; grep "^| layer\|^#" $OUT/layer.txt; tail -2 $OUT/layer.err
for s in "128 64" "512 16"; do set -- $s
  timeout 75 python benchmarks/train_step.py --config large --seq-len $1 --batch-size $2 --kernels auto \
    --steps 10 --repeats 3 --warmup 2 > $OUT/step_$1.json 2> $OUT/step_$1.err
  python -c "import json; d=json.load(open('$OUT/step_$1.json')); print('$1', round(d['ms_per_step'],2), round(d['seq_per_s'],1), d['spread_ms'], round(d['peak_memory_gib'],1))" 2>&1 | tail -1
done
