#!/bin/bash
# Session 8, run 8: the XLA-add path of flash_attention_qkv(bias=) (fold_bias=False, S=512) sums the bias gradient in
# fp32 (a custom VJP; run 7: autodiff's bf16 sum was 2.05% off at 2048 rows, 3 tests failed). Packed + model GPU tests.
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 240 python -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_kernel.py tests/test_gpu.py \
  -k "packed or gpu.py" > $OUT/gpu_tests.txt 2>&1; tail -1 $OUT/gpu_tests.txt; grep "^FAILED" $OUT/gpu_tests.txt | head
