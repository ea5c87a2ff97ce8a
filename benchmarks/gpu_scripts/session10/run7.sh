#!/bin/bash
# Session 10 run 7 (H200, the tree of 43e6625): BERT-base train step at S=128, batch 64, XLA vs the kernels (the README
# had only train.py's --kernels xla number for base), and BERT-large S=128 again.
export PYTHONPATH=.
for args in "--config base --kernels xla" "--config base --kernels auto" "--config large --kernels auto" \
            "--config base --kernels auto" "--config base --kernels xla"; do
  timeout 110 python benchmarks/train_step.py $args --seq-len 128 --batch-size 64 --steps 10 --repeats 3 --warmup 2 \
      2>/dev/null | tail -1 | python -c "import json,sys; r=json.loads(sys.stdin.read()); print('$args', r['device'], \
      r['jax'], f\"{r['seq_per_s']:.1f} seq/s, {r['ms_per_step']:.2f} ms, spread {r['spread_ms']}, {r['peak_memory_gib']:.1f} GiB\")"
done
