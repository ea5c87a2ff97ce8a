#!/bin/bash
# Session 15 run 1c (one H200, a fresh machine session): bias+GELU fwd+bwd at p=0.1, every shape and implementation.
PYTHONPATH=. timeout 280 python benchmarks/kernels.py --ops bias_gelu --only "p=0.1" --passes fwd+bwd --repeats 5 \
  --json $OUT/bias_gelu_p01.json > $OUT/kernels_bias_gelu_p01.log 2>&1
echo "kernels rc $?"; grep -v "^\s*$" $OUT/kernels_bias_gelu_p01.log | grep -iv warn | tail -20
