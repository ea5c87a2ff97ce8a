#!/bin/bash
# Session 14 run 2 (one H200): the compiled BERT-large S=128 B64 train step's HLO (layer loop, Pallas kernels, the
# shipped lax.split), and what its 24-way gradient concatenate fusions are (concat_hlo.py).
PYTHONPATH=. timeout 300 python benchmarks/train_step.py --config large --kernels pallas --seq-len 128 --batch-size 64 \
    --steps 2 --repeats 1 --warmup 1 --dump-hlo $OUT/step_s128.hlo.txt 2>&1 | tail -1 | cut -c1-300
PYTHONPATH=. python benchmarks/gpu_scripts/session14/concat_hlo.py $OUT/step_s128.hlo.txt > $OUT/concat_fusions.txt
head -c 9000 $OUT/concat_fusions.txt
gzip $OUT/step_s128.hlo.txt
