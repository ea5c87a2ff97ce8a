#!/bin/bash
# Session 11 run 8 (H200): BERT-large S=512 B16 train step with delta in the dQ kernel (39dbc87) against the previous
# tree (delta_in_dq.patch reversed), alternating twice: the predicted gain (24 layers x 5-11 us, 0.2-0.5%) is below
# the step's resolution; this checks that nothing regressed and refreshes the README's S=512 number.
export PYTHONPATH=.
rm -rf /tmp/old && cp -r . /tmp/old && (cd /tmp/old && patch -s -p1 -R < benchmarks/gpu_scripts/session11/delta_in_dq.patch) || exit 1
for tree in new old new old; do
  d=.; [ $tree = old ] && d=/tmp/old
  (cd $d && timeout 110 python benchmarks/train_step.py --config large --kernels pallas --seq-len 512 --batch-size 16 \
      --steps 10 --repeats 3 --warmup 2 2>/dev/null | tail -1 | python -c "import json,sys; r=json.loads(sys.stdin.read()); \
      print('$tree', r['device'], r['jax'], f\"{r['seq_per_s']:.1f} seq/s, {r['ms_per_step']:.2f} ms, spread {r['spread_ms']}, {r['peak_memory_gib']:.1f} GiB\")")
done
