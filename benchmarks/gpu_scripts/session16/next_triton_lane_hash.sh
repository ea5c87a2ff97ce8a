#!/bin/bash
# PREPARED FOR THE NEXT SESSION (not run in session 16): triton_lane_hash.patch writes `keep_mask_tile` (the dropout
# mask of every Triton kernel: flash attention's three draws per score, BDRLN, bias+GELU's Triton path) in the
# shared-expression pair form that bias+GELU's Mosaic GPU kernels measured faster with in session 16 (-17% fwd+bwd at
# p=0.1): each element hashes (first >> 1) + (lane >> 1), so a pair's two elements, which sit in one thread's
# registers (the MMA accumulator layout holds pairs of neighbouring columns), share one hash after CSE, instead of
# the shipped stack-and-reshape interleave of one hash per pair. Bit-identical masks (CPU:
# test_dropout_tile_mask_matches_per_element_mask, the attention/kernel tests in interpret mode); the Triton lowering
# of attention S=128/512 fwd+bwd, BDRLN and bias+GELU passes on CPU (jax 0.11.2, compute capability 90).
# Predicted: if the interleave costs layout conversions and the CSE happens, attention with dropout (S=128: 1.48x of
# XLA) gains some of the mask's share of its time; if the CSE fails, one hash per element: slower (session 8 measured
# the per-element form 377-387 vs 348 us at S=512). Run from the repository root of a tree WITHOUT the patch.
# One H200, ~8 min: the GPU tests of the patched tree, then patched / shipped alternating.
export PYTHONPATH=.
A="benchmarks/kernels.py --ops attention --only p=0.1 --passes fwd+bwd --impls pallas --repeats 5"
L="benchmarks/kernels.py --ops bdrln --only x768 --passes fwd+bwd --impls pallas --repeats 5"
rm -rf /tmp/patched && cp -r . /tmp/patched && (cd /tmp/patched && patch -p1 -s < benchmarks/gpu_scripts/session16/triton_lane_hash.patch) || exit 1
(cd /tmp/patched && timeout 200 python -m pytest -q -m gpu tests/test_attention_kernel.py tests/test_kernels.py -p no:cacheprovider 2>&1 | tail -3)
for tree in /tmp/patched . /tmp/patched .; do
  (cd $tree && timeout 100 python $A 2>&1 | grep -E "^#|^\| attention" | grep -v warn) ; echo "== $tree"
done
for tree in /tmp/patched .; do
  (cd $tree && timeout 80 python $L 2>&1 | grep -E "^\| bdrln" | grep -v warn) ; echo "== $tree"
done
