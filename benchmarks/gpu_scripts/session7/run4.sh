#!/bin/bash
# Session 7, run 4: the S=512 rows run 3 timed out on (attention operator fwd+bwd, the layer fwd+bwd), same code.
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python benchmarks/kernels.py --ops attention --only S512 --passes fwd+bwd --repeats 5 --impls pallas \
  > $OUT/attention_ops.txt 2> $OUT/attention_ops.err; grep "^|\|^#" $OUT/attention_ops.txt; tail -2 $OUT/attention_ops.err
timeout 250 python benchmarks/kernels.py --ops layer --only S512 --passes fwd+bwd --repeats 3 \
  > $OUT/layer.txt 2> $OUT/layer.err; grep "^| layer\|^#" $OUT/layer.txt; tail -2 $OUT/layer.err
