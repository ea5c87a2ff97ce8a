#!/bin/bash
# Session 11 run 6 (H200): the new S=128 default (dQ + dK/dV pair, s128_pair_default.patch) compiled against the
# reference (the default-block GPU tests), kernels.py's attention rows, and the BERT-large S=128 B64 train step A/B
# against the previous default (the patch reversed), alternating new/old twice.
export PYTHONPATH=.
timeout 120 python -m pytest -q -m gpu tests/test_attention_kernel.py -k variant0 -p no:cacheprovider > $OUT/tests.txt 2>&1
echo "tests rc $?"; tail -1 $OUT/tests.txt
timeout 200 python benchmarks/kernels.py --ops attention --impls pallas > $OUT/kernels.txt 2>&1
echo "kernels rc $?"; grep "^|\|^#" $OUT/kernels.txt | cut -c1-220
rm -rf /tmp/old && cp -r . /tmp/old && (cd /tmp/old && patch -s -p1 -R < benchmarks/gpu_scripts/session11/s128_pair_default.patch) || exit 1
for tree in new old new old; do
  d=.; [ $tree = old ] && d=/tmp/old
  (cd $d && timeout 75 python benchmarks/train_step.py --config large --kernels pallas --seq-len 128 --batch-size 64 \
      --steps 10 --repeats 3 --warmup 2 2>/dev/null | tail -1 | python -c "import json,sys; r=json.loads(sys.stdin.read()); \
      print('$tree', r['device'], r['jax'], f\"{r['seq_per_s']:.1f} seq/s, {r['ms_per_step']:.2f} ms, spread {r['spread_ms']}, {r['peak_memory_gib']:.1f} GiB\")")
done
