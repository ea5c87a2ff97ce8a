#!/bin/bash
# Session 12 run 10 (H200): the --kernels xla baseline with the layer loop (the new default for both paths) and with
# the scan, BERT-large S=128 B64 and S=512 B16, BERT-base S=128 B64 both kernel paths with the loop; then the model's
# GPU test (BERT-large forward+gradient, pallas vs xla).
export PYTHONPATH=.
run() {  # label, args...
  local label=$1; shift
  timeout 150 python benchmarks/train_step.py --steps 10 --repeats 3 --warmup 2 "$@" 2>/dev/null | tail -1 | python -c "import json,sys; r=json.loads(sys.stdin.read()); \
      print('$label', r['device'], r['jax'], f\"{r['seq_per_s']:.1f} seq/s, {r['ms_per_step']:.2f} ms, spread {r['spread_ms']}, {r['peak_memory_gib']:.1f} GiB, compile {r['compile_s']:.1f} s\")"
}
run "large S128 xla loop" --config large --kernels xla --seq-len 128 --batch-size 64
run "large S128 xla scan" --config large --kernels xla --seq-len 128 --batch-size 64 --scan-layers
run "large S512 xla loop" --config large --kernels xla --seq-len 512 --batch-size 16
run "base S128 pallas loop" --config base --kernels pallas --seq-len 128 --batch-size 64
run "base S128 xla loop" --config base --kernels xla --seq-len 128 --batch-size 64
timeout 100 python -m pytest -q -m gpu tests/test_gpu.py -p no:randomly > $OUT/tests.txt 2>&1
echo "tests rc $?"; grep "passed\|failed" $OUT/tests.txt | tail -2
