#!/bin/bash
# Session 11 run 1 (H200): the atomic-dQ backward compiled: the attention GPU tests (new cases included), then
# fwd+bwd timings of the shipped backward and the atomic forms (atomic_dq.py).
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 240 python -m pytest -q -m gpu tests/test_attention_kernel.py -x > $OUT/tests.txt 2>&1
echo "tests rc $?"; tail -4 $OUT/tests.txt; grep -m5 "Error\|assert" $OUT/tests.txt | cut -c1-300
timeout 320 python benchmarks/gpu_scripts/session11/atomic_dq.py > $OUT/out.txt 2>&1
echo "bench rc $?"
grep -v "^    @\|Deprecat\|return rule\|^ *$" $OUT/out.txt | cut -c1-300 | head -60
