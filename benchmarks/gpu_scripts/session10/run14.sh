#!/bin/bash
# Session 10 run 14 (H200): where ours and cuDNN's attention with dropout spend their time, per kernel (profiled,
# one unchained fwd+bwd call, 20 calls; command buffers off as in run 13). S=512 and S=128 rows.
export PYTHONPATH=.
XLA_FLAGS=--xla_gpu_enable_command_buffer= PROFILE=1 ONLY=p=0.1 timeout 400 python \
    benchmarks/gpu_scripts/session10/cudnn_dropout.py > $OUT/out.txt 2>&1
echo "rc $?"
grep -v "^    @\|Deprecat\|return rule\|^ *$" $OUT/out.txt | cut -c1-200 | head -70
