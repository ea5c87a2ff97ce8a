#!/bin/bash
# Session 8, run 2: the one-kernel backward's order of products restored (run 1: 7 failures at S=128, wrong dV from
# run to run); the GPU tests, then the S=128 variants twice more (a race would show again); the mask-cost probe
# (keep_cost.py); JAX's Mosaic GPU flash attention at p=0 on float16 inputs (its scratch is float16).
export PYTHONPATH=.
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_kernel.py tests/test_gpu.py \
  > $OUT/gpu_tests.txt 2>&1; tail -3 $OUT/gpu_tests.txt
for i in 2 3; do
  timeout 90 python -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_kernel.py -k "128" 2>&1 | tail -2
done
timeout 150 python benchmarks/gpu_scripts/session8/keep_cost.py > $OUT/keep_cost.txt 2>&1; grep "^|" $OUT/keep_cost.txt
timeout 120 python benchmarks/kernels.py --ops attention --passes fwd,fwd+bwd --only "f16" --repeats 5 \
  > $OUT/attention_f16.txt 2> $OUT/attention_f16.err; grep "^|\|^#" $OUT/attention_f16.txt; grep skip $OUT/attention_f16.err | head -3
