#!/bin/bash
# Session 6, run 7: the attention operator table with the session's flash defaults (3 stages), against XLA and, at
# p=0, jax.nn.dot_product_attention on cuDNN (the S=128 cuDNN rows of session 2 had wrong query lengths).
export PYTHONPATH=.
timeout 280 python benchmarks/kernels.py --ops attention --repeats 5 --impls pallas,jax.nn.dpa-cudnn \
  > $OUT/attention_ops.txt 2> $OUT/attention_ops.err
cat $OUT/attention_ops.txt; tail -3 $OUT/attention_ops.err
