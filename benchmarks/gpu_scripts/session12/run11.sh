#!/bin/bash
# Session 12 run 11 (H200; typed as one command): the model's GPU test with the layer loop, under a longer timeout
# than run 10 gave it (its three BERT-large compiles now take ~150 s).
export PYTHONPATH=.
timeout 280 python -m pytest -q -m gpu tests/test_gpu.py -p no:randomly --durations=3 > $OUT/tests.txt 2>&1
echo "tests rc $?"; grep "passed\|failed\|s call" $OUT/tests.txt | tail -4
