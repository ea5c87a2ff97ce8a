#!/bin/bash
# Session 8, run 1: the review commit ba450e2 (dK/dV helpers) compiled on the GPU (attention + model GPU tests), then
# JAX's own Mosaic GPU flash attention (no mask, no dropout) against ours at p=0, and the BDRLN table as a baseline.
export PYTHONPATH=.
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
timeout 250 python -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_kernel.py tests/test_gpu.py \
  > $OUT/gpu_tests.txt 2>&1; tail -3 $OUT/gpu_tests.txt
timeout 170 python benchmarks/kernels.py --ops attention --passes fwd,fwd+bwd --only "p=0.0" --repeats 5 \
  > $OUT/attention_p0.txt 2> $OUT/attention_p0.err; grep "^|\|^#" $OUT/attention_p0.txt; tail -4 $OUT/attention_p0.err
timeout 120 python benchmarks/kernels.py --ops bdrln --passes fwd,fwd+bwd --repeats 5 \
  > $OUT/bdrln.txt 2> $OUT/bdrln.err; grep "^|\|^#" $OUT/bdrln.txt; tail -2 $OUT/bdrln.err
