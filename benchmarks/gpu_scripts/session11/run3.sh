#!/bin/bash
# Session 11 run 3 (H200): delta formed in the dQ kernel (dQ kernel first; delta_in_dq.patch) compiled: the attention
# GPU tests, then S=512 fwd+bwd A/B against the previous tree (the patch reversed), alternating, and per-kernel
# profiles of both (command buffers off for the profile only).
export PYTHONPATH=.
S=benchmarks/gpu_scripts/session11/atomic_dq.py
[ -z "$NOTESTS" ] && timeout 240 python -m pytest -q -m gpu tests/test_attention_kernel.py -x > $OUT/tests.txt 2>&1
echo "tests rc $?"; tail -1 $OUT/tests.txt; grep -m5 "Error\|assert" $OUT/tests.txt | cut -c1-300
rm -rf /tmp/old && cp -r . /tmp/old && (cd /tmp/old && patch -s -p1 -R < benchmarks/gpu_scripts/session11/delta_in_dq.patch) || exit 1
ROWS="xla reference p=0.1|ours shipped p=0.1|packed+bias shipped p=0.1"
for tree in new old new old; do
  d=.; [ $tree = old ] && d=/tmp/old
  (cd $d && SHAPE=512 ONLY="$ROWS" timeout 100 python $S 2>&1) > $OUT/ab_$tree.txt
  echo "== $tree rc $?"; grep "^|\|^copy" $OUT/ab_$tree.txt
done
for tree in new old; do
  d=.; [ $tree = old ] && d=/tmp/old
  (cd $d && SHAPE=512 ONLY="ours shipped p=0.1" PROFILE=1 XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout 100 \
      python $S 2>&1) > $OUT/prof_$tree.txt
  echo "== profile $tree rc $?"; grep -v "^    @\|Deprecat\|return rule\|^ *$\|^#\|^copy\|Warning\|warn" $OUT/prof_$tree.txt | cut -c1-160 | head -14
done
