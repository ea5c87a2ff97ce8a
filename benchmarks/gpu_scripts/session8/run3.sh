#!/bin/bash
# Session 8, run 3: dropout draws one hash per two neighbouring elements (16 bits each; keep_mask_tile in every
# Triton kernel, keep_mask per element in the Mosaic GPU ones). Every GPU test compiled, then the A/B of the mask's
# generation (ab_keep.py: same mask, per pair vs per element), then the attention operator table at p=0.1.
export PYTHONPATH=.
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
timeout 300 python -m pytest -q -m gpu -p no:cacheprovider tests/ > $OUT/gpu_tests.txt 2>&1; tail -3 $OUT/gpu_tests.txt
grep "^FAILED" $OUT/gpu_tests.txt | head
timeout 170 python benchmarks/gpu_scripts/session8/ab_keep.py > $OUT/ab_keep.txt 2>&1; grep "^|" $OUT/ab_keep.txt
timeout 110 python benchmarks/kernels.py --ops attention --only "p=0.1" --passes fwd+bwd --repeats 5 --impls pallas \
  > $OUT/attention_ops.txt 2> $OUT/attention_ops.err; grep "^|\|^#" $OUT/attention_ops.txt
