#!/bin/bash
# Session 7, run 10: after merging the key-major tile math into `_grad_tile` (review), the flash kernels compiled
# (tests) and the attention operator timed again (a same-code check that the merge changed no speed).
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 250 python -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_kernel.py tests/test_gpu.py \
  > $OUT/gpu_tests.txt 2>&1; tail -3 $OUT/gpu_tests.txt
timeout 150 python benchmarks/kernels.py --ops attention --only "p=0.1" --passes fwd+bwd --repeats 5 --impls pallas \
  > $OUT/attention_ops.txt 2> $OUT/attention_ops.err; grep "^|\|^#" $OUT/attention_ops.txt; tail -2 $OUT/attention_ops.err
