#!/bin/bash
# Session 7, run 2: key-major backward tiles (pair and one-kernel) compiled (tests) and timed per kernel against run
# 1's; then the layer (S128, S512) with the fastest candidates (with_blocks.py) against the code's defaults.
export PYTHONPATH=.
D=benchmarks/gpu_scripts/session7
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_kernel.py -k "variant" \
  > $OUT/gpu_tests.txt 2>&1; tail -3 $OUT/gpu_tests.txt
timeout 260 python $D/fused_tune.py 128 512 > $OUT/fused_tune.txt 2> $OUT/fused_tune.err; cat $OUT/fused_tune.txt
tail -3 $OUT/fused_tune.err
for v in default best; do
  pre=""; [ $v = best ] && pre="$D/with_blocks.py $OUT/best_blocks.json"
  timeout 170 python $pre benchmarks/kernels.py --ops layer --passes fwd+bwd --repeats 3 --impls pallas \
    > $OUT/layer_$v.txt 2> $OUT/layer_$v.err; echo $v; grep "^| layer" $OUT/layer_$v.txt; tail -2 $OUT/layer_$v.err
done
