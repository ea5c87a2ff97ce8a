#!/bin/bash
# Session 11 run 2 (H200): (1) the atomic forms with Pallas's Triton atomics patched to relaxed ordering (run 1: the
# acquire-release atomics cost ~350-420 us at S=512); (2) S=128: the shipped one-kernel backward against the
# dK/dV + dQ pair with 32x64 key-major tiles (run 1: 127.9 vs 140.9 us), unpacked and packed with the bias, twice.
export PYTHONPATH=.
S=benchmarks/gpu_scripts/session11/atomic_dq.py
SEM=relaxed SHAPE=512 ONLY="ours shipped p=0.1|ours atomic km=1 64x128 w8 p=0.1|ours atomic km=0 32x64 w4 p=0.1|ours atomic km=1 64x64 w4 p=0.1" \
    timeout 200 python $S > $OUT/relaxed.txt 2>&1
echo "relaxed rc $?"; grep "^|\|^#\|^copy\|^atomics" $OUT/relaxed.txt
SHAPE=128 REPEAT=2 ONLY="packed+bias shipped p=0.1|packed+bias pair km=1 32x64 w4 p=0.1|packed+bias pair km=1 32x64 w4 fold p=0.1|ours shipped p=0.1|ours pair km=1 32x64 w4 p=0.1" \
    timeout 300 python $S > $OUT/s128.txt 2>&1
echo "s128 rc $?"; grep "^|\|^#\|^copy" $OUT/s128.txt
