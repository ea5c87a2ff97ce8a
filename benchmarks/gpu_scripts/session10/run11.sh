#!/bin/bash
# Session 10 run 11 (H200): cuDNN's fused attention with its own dropout, timed as a speed anchor (cudnn_dropout.py).
export PYTHONPATH=.
timeout 400 python benchmarks/gpu_scripts/session10/cudnn_dropout.py > $OUT/out.txt 2>&1
echo "rc $?"
grep -v "^    @\|Deprecat\|return rule\|^ *$" $OUT/out.txt | cut -c1-400 | head -40
