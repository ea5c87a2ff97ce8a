#!/bin/bash
# Session 15 run 1b (same H200 machine session as run 1, which its 600 s limit cut before these): bias+GELU's GPU
# tests (cut by their 60 s limit while collecting: no result) and benchmarks/kernels.py for bias+GELU at p=0 and
# p=0.1 (cut by its 200 s limit after the 8192x3072 rows).
cat $OUT/../kernels_bias_gelu.log 2>/dev/null | tail -3
timeout 60 python -m pytest -q -m gpu tests/ -k "bias_gelu" -p no:cacheprovider 2>&1 | tail -3
PYTHONPATH=. timeout 200 python benchmarks/kernels.py --ops bias_gelu --passes fwd,fwd+bwd --repeats 5 \
  --json $OUT/bias_gelu.json > $OUT/kernels_bias_gelu.log 2>&1
echo "kernels rc $?"; grep -v "^\s*$" $OUT/kernels_bias_gelu.log | grep -iv warn | tail -40
