#!/bin/bash
# Session 11 run 5 (H200): every GPU-marked test on the tree with the dQ kernel first (delta in it); then S=128:
# the shipped one-kernel backward against the dK/dV + dQ pair with 32x64 key-major tiles, unpacked, packed, and
# packed with the bias (folded), twice (runs 1-2 found the pair faster unpacked, equal packed with the bias).
export PYTHONPATH=.
timeout 440 python -m pytest -q -m gpu tests/ -p no:cacheprovider > $OUT/tests.txt 2>&1
echo "tests rc $?"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests.txt | tail -8
SHAPE=128 REPEAT=2 ONLY="ours shipped p=0.1|ours pair km=1 32x64 w4 p=0.1|packed shipped p=0.1|packed pair km=1 32x64 w4 p=0.1|packed+bias shipped p=0.1|packed+bias pair km=1 32x64 w4 fold p=0.1" \
    timeout 140 python benchmarks/gpu_scripts/session11/atomic_dq.py > $OUT/s128.txt 2>&1
echo "s128 rc $?"; grep "^|\|^copy" $OUT/s128.txt
