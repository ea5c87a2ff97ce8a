#!/bin/bash
# Session 10 run 9 (H200, the tree of 7b09e17, kernels as 43e6625): BERT-base train step at S=512, batch 16, XLA vs the kernels
# (run 7 measured S=128).
export PYTHONPATH=.
for args in "--config base --kernels xla" "--config base --kernels auto" \
            "--config base --kernels auto" "--config base --kernels xla"; do
  timeout 110 python benchmarks/train_step.py $args --seq-len 512 --batch-size 16 --steps 10 --repeats 3 --warmup 2 \
      2>/dev/null | tail -1 | python -c "import json,sys; r=json.loads(sys.stdin.read()); print('$args', r['device'], \
      r['jax'], f\"{r['seq_per_s']:.1f} seq/s, {r['ms_per_step']:.2f} ms, spread {r['spread_ms']}, {r['peak_memory_gib']:.1f} GiB\")"
done
