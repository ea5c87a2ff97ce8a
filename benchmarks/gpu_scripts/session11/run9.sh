#!/bin/bash
# Session 11 run 9 (H200): fold_parts.py, where folding the Q/K/V bias into the S=512 kernels costs, per kernel.
export PYTHONPATH=.
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout 300 python benchmarks/gpu_scripts/session11/fold_parts.py \
    > $OUT/out.txt 2>&1
echo "rc $?"
grep "^#\|kernels of\|  [0-9 .]* us \|failed" $OUT/out.txt | cut -c1-160
