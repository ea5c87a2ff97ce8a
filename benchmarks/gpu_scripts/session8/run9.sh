#!/bin/bash
# Session 8, run 9: the encoder layer fwd+bwd (BERT-large, dropout 0.1), XLA vs Pallas, with the final code (paired
# dropout mask; Q/K/V bias in flash attention at S=128, XLA's add at S=512).
export PYTHONPATH=.
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
for s in S128 S512; do
  timeout 260 python benchmarks/kernels.py --ops layer --only $s --passes fwd+bwd --repeats 3 \
    > $OUT/layer_$s.txt 2> $OUT/layer_$s.err; grep "^| layer\|^#" $OUT/layer_$s.txt; tail -1 $OUT/layer_$s.err
done
