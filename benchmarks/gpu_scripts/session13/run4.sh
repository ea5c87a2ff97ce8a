#!/bin/bash
# Session 13 run 4 (2 x H200): the loop under data=2 and fsdp=2 at XLA's default optimization level (runs 2-3 used "auto" = O2, measured faster with the scan in session 4).
export PYTHONPATH=.
T="python benchmarks/train_step.py --config large --kernels pallas --steps 10 --repeats 3 --warmup 2"
run() { name=$1; shift; echo "== $name: $*"; timeout 150 $T "$@" > $OUT/$name.log 2>&1; echo "rc $?";
        grep -v "^ *$" $OUT/$name.log | grep -iv "warn" | tail -1 | python -c "import json,sys; d=json.loads(sys.stdin.read()); print({k: d[k] for k in ('kernels','mesh','scan_layers','ms_per_step','seq_per_s','spread_ms','compile_s','peak_memory_gib_per_device','loss','opt_level')})"; }
run data2_loop_default --seq-len 128 --batch-size 128 --mesh data=2 --no-scan-layers --xla-opt-level default
run fsdp2_loop_default --seq-len 128 --batch-size 128 --mesh fsdp=2 --no-scan-layers --xla-opt-level default
run data2_loop_O2 --seq-len 128 --batch-size 128 --mesh data=2 --no-scan-layers
