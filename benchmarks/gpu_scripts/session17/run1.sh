#!/bin/bash
# Session 17, run 1 (one H200): session 16's prepared A/B (next_triton_lane_hash.sh), split in two calls to fit the
# 600 s limit. The patched tree's GPU tests of the kernels that draw keep_mask_tile, then attention p=0.1 fwd+bwd,
# patched / shipped alternating. Run from the repository root of a tree WITHOUT the patch.
export PYTHONPATH=.
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
python -c "import jax; print(jax.__version__, jax.devices())"
P=benchmarks/gpu_scripts/session17/triton_lane_hash.patch
A="benchmarks/kernels.py --ops attention --only p=0.1 --passes fwd+bwd --impls pallas --repeats 5"
rm -rf /tmp/patched && cp -r . /tmp/patched && (cd /tmp/patched && patch -p1 -s < $P) || exit 1
t0=$(date +%s)
(cd /tmp/patched && timeout 200 python -m pytest -q -m gpu tests/test_attention_kernel.py tests/test_kernels.py -p no:cacheprovider > $OUT/gpu_tests_patched.txt 2>&1); tail -3 $OUT/gpu_tests_patched.txt
grep "^FAILED" $OUT/gpu_tests_patched.txt | head
echo "tests $(( $(date +%s) - t0 )) s"
i=0
for tree in /tmp/patched . /tmp/patched .; do
  i=$((i+1)); t0=$(date +%s)
  (cd $tree && timeout 90 python $A > $OUT/attn_$i.txt 2>&1; grep -E "^#|^\| attention" $OUT/attn_$i.txt | grep -v warn)
  echo "== $tree ($(( $(date +%s) - t0 )) s)"
done
