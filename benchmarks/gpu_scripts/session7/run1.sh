#!/bin/bash
# Session 7, run 1: the one-kernel flash backward compiled (tests), its block sizes against the pair (per-kernel
# device time), then the layer (S128) and the train step (S128) with it (default) and with the pair (pair_bwd.py).
export PYTHONPATH=.
D=benchmarks/gpu_scripts/session7
nvidia-smi --query-gpu=name --format=csv,noheader; python -c "import jax; print(jax.__version__)"
timeout 150 python -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_kernel.py tests/test_gpu.py \
  > $OUT/gpu_tests.txt 2>&1; tail -3 $OUT/gpu_tests.txt
timeout 200 python $D/fused_tune.py 128 512 > $OUT/fused_tune.txt 2> $OUT/fused_tune.err; cat $OUT/fused_tune.txt
for v in fused pair; do
  pre=""; [ $v = pair ] && pre="$D/pair_bwd.py"
  timeout 150 python $pre benchmarks/kernels.py --ops layer --only S128 --passes fwd+bwd --repeats 3 \
    > $OUT/layer_$v.txt 2> $OUT/layer_$v.err; echo $v; grep "^| layer" $OUT/layer_$v.txt; tail -2 $OUT/layer_$v.err
done
for v in fused pair; do
  pre=""; [ $v = pair ] && pre="$D/pair_bwd.py"
  timeout 80 python $pre benchmarks/train_step.py --config large --seq-len 128 --batch-size 64 --kernels auto \
    --steps 10 --repeats 3 --warmup 2 > $OUT/step_$v.json 2> $OUT/step_$v.err
  python -c "import json; d=json.load(open('$OUT/step_$v.json')); print('$v', round(d['ms_per_step'],2), round(d['seq_per_s'],1), d['spread_ms'], round(d['peak_memory_gib'],1))" 2>&1 | tail -1
done
