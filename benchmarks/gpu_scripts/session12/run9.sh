#!/bin/bash
# Session 12 run 9 (H200): BERT-large train step with the encoder layers in a Python loop (the new default) against
# `--scan-layers` (the lax.scan, as before), alternating, at S=128 B64 and S=512 B16; then the model's GPU test.
export PYTHONPATH=.
for s in 128 512; do
  b=64; [ $s = 512 ] && b=16
  for form in loop scan loop scan; do
    flag=""; [ $form = scan ] && flag="--scan-layers"
    timeout 150 python benchmarks/train_step.py --config large --kernels pallas --seq-len $s --batch-size $b \
        --steps 10 --repeats 3 --warmup 2 $flag 2>/dev/null | tail -1 | python -c "import json,sys; r=json.loads(sys.stdin.read()); \
        print('S$s $form', r['device'], r['jax'], f\"{r['seq_per_s']:.1f} seq/s, {r['ms_per_step']:.2f} ms, spread {r['spread_ms']}, {r['peak_memory_gib']:.1f} GiB, compile {r['compile_s']:.1f} s, loss {r['loss']:.4f}\")"
  done
done
timeout 100 python -m pytest -q -m gpu tests/test_gpu.py -p no:randomly 2>&1 | tail -1
