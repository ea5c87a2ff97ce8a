#!/bin/bash
# Session 12 run 4 (H200): dK/dV kernel tiles and launch settings with dS stored (ds_store.py sweep), per-kernel
# device time of one fwd+bwd call, B16 N16 S512 p=0.1 (packed, bias by XLA).
export PYTHONPATH=.
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout 400 python benchmarks/gpu_scripts/session12/ds_store.py sweep \
    > $OUT/sweep.txt 2>&1
echo "sweep rc $?"
grep "^#\|kernels of\|flash_attention\|failed" $OUT/sweep.txt | cut -c1-150
