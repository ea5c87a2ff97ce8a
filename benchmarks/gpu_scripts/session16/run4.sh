#!/bin/bash
# Session 16, run 4 (one H200, same machine session as runs 1-3, on the tree of 7aa0981): run 3's bias+GELU A/B again,
# fwd+bwd only (run 3's 100 s limit per tree cut three of four fwd+bwd rows), alternating patched / shipped trees.
export PYTHONPATH=.; K="benchmarks/kernels.py --ops bias_gelu --only p=0.1 --passes fwd+bwd --impls mgpu --repeats 5"; rm -rf /tmp/patched && cp -r . /tmp/patched && (cd /tmp/patched && patch -p1 -s < benchmarks/gpu_scripts/session15/mgpu_pair_hash.patch) || exit 1; for tree in /tmp/patched . /tmp/patched .; do (cd $tree && timeout 115 python $K 2>&1 | grep -E "^#|mgpu" | grep -v warn) ; echo "== $tree"; done 2>&1 | tee $OUT/console.txt
