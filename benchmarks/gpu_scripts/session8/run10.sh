#!/bin/bash
# Session 8, run 10 (H100): every GPU test on session 8's final code (paired dropout mask, autotuner, Q/K/V bias in
# flash attention), compiled on an H100.
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader; python -c "import jax; print(jax.__version__)"
timeout 330 python -m pytest -q -m gpu -p no:cacheprovider tests/ > $OUT/gpu_tests.txt 2>&1; tail -1 $OUT/gpu_tests.txt
grep "^FAILED" $OUT/gpu_tests.txt | head
