#!/bin/bash
# Session 13 run 3 (2 x H200): tensor=2 (S=128, batch 64) loop vs scan, Pallas kernels.
export PYTHONPATH=.
T="python benchmarks/train_step.py --config large --kernels pallas --steps 10 --repeats 3 --warmup 2"
run() { name=$1; shift; echo "== $name: $*"; timeout 150 $T "$@" > $OUT/$name.log 2>&1; echo "rc $?";
        grep -v "^ *$" $OUT/$name.log | grep -iv "warn" | tail -1 | python -c "import json,sys; d=json.loads(sys.stdin.read()); print({k: d[k] for k in ('kernels','mesh','scan_layers','ms_per_step','seq_per_s','spread_ms','compile_s','peak_memory_gib_per_device','loss')})"; }
run tensor2_loop --seq-len 128 --batch-size 64 --mesh tensor=2 --no-scan-layers
run tensor2_scan --seq-len 128 --batch-size 64 --mesh tensor=2 --scan-layers
