#!/bin/bash
# Session 11 run 4 (H200): bwd_sweep.py, per-kernel device times of the S=512 backward's dQ tiles and dK/dV settings.
export PYTHONPATH=.
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout 400 python benchmarks/gpu_scripts/session11/bwd_sweep.py \
    > $OUT/out.txt 2>&1
echo "rc $?"
grep "^#\|^default\|kernels of\|flash_attention\|failed" $OUT/out.txt | cut -c1-200
