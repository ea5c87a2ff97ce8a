#!/bin/bash
# Session 16, run 3 (prepared in session 15 as next_pair_hash.sh, run as written, on the tree of 7aa0981; the patch
# is in main since session 16, so this script no longer applies to main): session15/mgpu_pair_hash.patch, the bias+GELU Mosaic GPU kernels'
# dropout mask written so two lanes of a pair share their hash expression (`keep_mask_lanes`), which the compiler may
# then draw once per pair. CPU: interpret-mode math and CUDA lowering pass on jax 0.10.2 and 0.11.2 (session 15).
# Predicted (session 15, kernels-h200.md): if the hash is CSE'd, half of the ~34 us the mask adds to the 8192x3072
# forward (and as much in the backward): fwd+bwd at p=0.1 ~122 -> ~90 us; if not, no change.
# Run from the repository root of a tree WITHOUT the patch (the device tree has no .git: copies are made here).
export PYTHONPATH=.
K="benchmarks/kernels.py --ops bias_gelu --only p=0.1 --passes fwd,fwd+bwd --impls mgpu --repeats 5"
rm -rf /tmp/patched && cp -r . /tmp/patched && (cd /tmp/patched && patch -p1 -s < benchmarks/gpu_scripts/session15/mgpu_pair_hash.patch) || exit 1
(cd /tmp/patched && timeout 150 python -m pytest -q -m gpu tests/test_mgpu.py -p no:cacheprovider 2>&1 | tail -3)
for tree in /tmp/patched . /tmp/patched .; do
  (cd $tree && timeout 100 python $K 2>&1 | grep -E "^#|mgpu" | grep -v warn) ; echo "== $tree"
done
