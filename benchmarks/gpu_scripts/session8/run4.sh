#!/bin/bash
# Session 8, run 4: with the paired dropout mask (one hash per two elements): the train step at S=128 and S=512, the
# BDRLN table with dropout (XLA vs Triton vs Mosaic GPU, fwd+bwd) and the S=128 layer (fwd+bwd).
export PYTHONPATH=.
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
for s in "128 64" "512 16"; do set -- $s
  timeout 80 python benchmarks/train_step.py --config large --seq-len $1 --batch-size $2 --kernels auto \
    --steps 10 --repeats 3 --warmup 2 > $OUT/step_$1.json 2> $OUT/step_$1.err
  python -c "import json; d=json.load(open('$OUT/step_$1.json')); print('step', '$1', round(d['ms_per_step'],2), round(d['seq_per_s'],1), d['spread_ms'], round(d['peak_memory_gib'],1))" 2>&1 | tail -1
done
timeout 170 python benchmarks/kernels.py --ops bdrln --only "p=0.1" --passes fwd,fwd+bwd --repeats 5 \
  > $OUT/bdrln.txt 2> $OUT/bdrln.err; grep "^|\|^#" $OUT/bdrln.txt; tail -2 $OUT/bdrln.err
timeout 170 python benchmarks/kernels.py --ops layer --only S128 --passes fwd+bwd --repeats 3 \
  > $OUT/layer.txt 2> $OUT/layer.err; grep "^| layer\|^#" $OUT/layer.txt; tail -2 $OUT/layer.err
