#!/bin/bash
# Session 7, run 8: the flash kernels after the review refactor (the key-major keep mask moved into `_keep`), compiled.
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 250 python -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_kernel.py tests/test_gpu.py \
  > $OUT/gpu_tests.txt 2>&1; tail -3 $OUT/gpu_tests.txt
