#!/bin/bash
# Session 12 run 2 (H200): BERT-large S=512 B16 train step with the stored-dS pair as the default (this tree) against
# the same tree with store_ds off (old: the recomputing dQ kernel), alternating twice; then every attention GPU test.
export PYTHONPATH=.
rm -rf /tmp/old && cp -r . /tmp/old && sed -i 's/    store_ds = not fused and not wide/    store_ds = False/' \
    /tmp/old/pallas_kernels/attention/kernel.py && grep -q "store_ds = False$" /tmp/old/pallas_kernels/attention/kernel.py || exit 1
for tree in new old new old; do
  d=.; [ $tree = old ] && d=/tmp/old
  (cd $d && timeout 110 python benchmarks/train_step.py --config large --kernels pallas --seq-len 512 --batch-size 16 \
      --steps 10 --repeats 3 --warmup 2 2>/dev/null | tail -1 | python -c "import json,sys; r=json.loads(sys.stdin.read()); \
      print('$tree', r['device'], r['jax'], f\"{r['seq_per_s']:.1f} seq/s, {r['ms_per_step']:.2f} ms, spread {r['spread_ms']}, {r['peak_memory_gib']:.1f} GiB\")")
done
timeout 250 python -m pytest -q -m gpu tests/test_attention_kernel.py tests/test_autotune.py -p no:randomly > $OUT/tests.txt 2>&1
echo "tests rc $?"; grep "passed\|failed\|FAIL" $OUT/tests.txt | tail -8
