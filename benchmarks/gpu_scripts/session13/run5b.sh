#!/bin/bash
# Session 13 run 5b (one H200): the optimized HLO of the BERT-large S=128 B64 train step (layer loop, Pallas kernels),
# to read what run 5's input_add_reduce_fusions are (not kept in the repository: 12.7 MB).
PYTHONPATH=. timeout 300 python benchmarks/train_step.py --config large --kernels pallas --seq-len 128 --batch-size 64 \
    --steps 2 --repeats 1 --warmup 1 --dump-hlo $OUT/step_s128.hlo.txt 2>&1 | tail -2 | cut -c1-300
gzip $OUT/step_s128.hlo.txt
