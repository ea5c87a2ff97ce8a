#!/bin/bash
# Session 7, run 9: the embedding block (gathers + sum + LN + dropout) under XLA, timed and profiled per kernel.
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python benchmarks/kernels.py --ops embedding --repeats 5 --profile 5 --top 12 \
  > $OUT/embedding.txt 2> $OUT/embedding.err; cat $OUT/embedding.txt; tail -2 $OUT/embedding.err
