#!/bin/bash
# Session 11 run 7 (H100): the tree with the dQ kernel first (delta in it) on the other GPU: the attention GPU tests
# compiled, then kernels.py's attention rows (pallas vs XLA).
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 240 python -m pytest -q -m gpu tests/test_attention_kernel.py -p no:cacheprovider > $OUT/tests.txt 2>&1
echo "tests rc $?"; tail -1 $OUT/tests.txt; grep -m5 "Error\|assert" $OUT/tests.txt | cut -c1-300
timeout 200 python benchmarks/kernels.py --ops attention --impls pallas > $OUT/kernels.txt 2>&1
echo "kernels rc $?"; grep "^|\|^#" $OUT/kernels.txt | cut -c1-220
