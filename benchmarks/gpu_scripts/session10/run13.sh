#!/bin/bash
# Session 10 run 13 (H200): every row of cudnn_dropout.py in one invocation with XLA's command buffers off (with them
# on, XLA aborts in cuDNN's backward with dropout: runs 11-12), so the rows are comparable.
export PYTHONPATH=.
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout 420 python benchmarks/gpu_scripts/session10/cudnn_dropout.py \
    > $OUT/out.txt 2>&1
echo "rc $?"
grep -v "^    @\|Deprecat\|return rule\|^ *$" $OUT/out.txt | cut -c1-300 | head -20
