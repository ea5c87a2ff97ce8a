#!/bin/bash
# Session 11 run 11 (H200): the bias gradient from the kernels' column sums (bias_grad_sums_mma.patch) compiled: the
# attention GPU tests; then bias_grad.py's per-kernel profile on the tree and on the tree with the patch reversed.
export PYTHONPATH=.
timeout 240 python -m pytest -q -m gpu tests/test_attention_kernel.py -k packed -p no:cacheprovider > $OUT/tests.txt 2>&1
echo "tests rc $?"; tail -1 $OUT/tests.txt; grep -m5 "Error\|assert" $OUT/tests.txt | cut -c1-300
rm -rf /tmp/old && cp -r . /tmp/old && (cd /tmp/old && patch -s -p1 -R < benchmarks/gpu_scripts/session11/bias_grad_sums_mma.patch) || exit 1
for tree in new old; do
  d=.; [ $tree = old ] && d=/tmp/old
  (cd $d && XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout 120 python \
      benchmarks/gpu_scripts/session11/bias_grad.py 2>&1) > $OUT/prof_$tree.txt
  echo "== $tree rc $?"; grep "kernels of\|  [0-9 .]* us " $OUT/prof_$tree.txt | cut -c1-150
done
