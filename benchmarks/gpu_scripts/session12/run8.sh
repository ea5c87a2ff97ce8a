#!/bin/bash
# Session 12 run 8 (H200): the BERT-large S=128 B64 train step per kernel (zero-fills of the scan's stacked residuals
# among them), then the step with the layer scan against the layers unrolled, alternating (step_profile.py).
export PYTHONPATH=.
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout 150 python benchmarks/gpu_scripts/session12/step_profile.py \
    profile 128 64 > $OUT/profile.txt 2>&1
echo "profile rc $?"; grep -v "^ *$" $OUT/profile.txt | grep -v "Warning\|warn" | head -80 | cut -c1-170
timeout 420 python benchmarks/gpu_scripts/session12/step_profile.py ab 128 64 > $OUT/ab.txt 2>&1
echo "ab rc $?"; grep "^#\|  scan\|  unrolled\|Error" $OUT/ab.txt | cut -c1-250
