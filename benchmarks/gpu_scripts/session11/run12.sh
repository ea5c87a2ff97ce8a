#!/bin/bash
# Session 11 run 12 (H200): every GPU-marked test on the final kernels (delta in the dQ kernel, the bias gradient
# from the kernels' column sums on the matrix unit).
export PYTHONPATH=.
timeout 500 python -m pytest -q -m gpu tests/ -p no:cacheprovider > $OUT/tests.txt 2>&1
echo "tests rc $?"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests.txt | tail -8
