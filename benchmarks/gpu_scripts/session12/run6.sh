#!/bin/bash
# Session 12 run 6 (H100): kernels.py's attention rows (pallas vs XLA, rotated inputs) with the stored-dS pair, and the
# BERT-large S=512 B16 train step.
export PYTHONPATH=.
timeout 240 python benchmarks/kernels.py --ops attention --impls pallas > $OUT/kernels.txt 2>&1
echo "kernels rc $?"; grep -v "^ *$" $OUT/kernels.txt | grep "|\|copy\|GB/s" | cut -c1-200
timeout 150 python benchmarks/train_step.py --config large --kernels pallas --seq-len 512 --batch-size 16 \
    --steps 10 --repeats 3 --warmup 2 2>/dev/null | tail -1 > $OUT/step.json
echo "step rc $?"; cat $OUT/step.json | cut -c1-600
