#!/bin/bash
# Session 7, run 7 (H100): why the S=512 layer is 1.33x on the H100 (1.51x on the H200): per-kernel device times of
# the XLA and the Pallas layer, fwd+bwd.
export PYTHONPATH=.
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv,noheader
timeout 250 python benchmarks/kernels.py --ops layer --only S512 --passes fwd+bwd --repeats 3 --profile 5 --top 30 \
  > $OUT/layer_profile.txt 2> $OUT/layer_profile.err; cat $OUT/layer_profile.txt; tail -2 $OUT/layer_profile.err
