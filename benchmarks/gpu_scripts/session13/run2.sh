#!/bin/bash
# Session 13 run 2 (2 x H200): run 1 again with the Pallas kernels (run 1 ran train_step.py's default, --kernels xla),
# plus S=512 data=2 loop vs scan (16 sequences per GPU).
export PYTHONPATH=.
T="python benchmarks/train_step.py --config large --kernels pallas --steps 10 --repeats 3 --warmup 2"
run() { name=$1; shift; echo "== $name: $*"; timeout 150 $T "$@" > $OUT/$name.log 2>&1; echo "rc $?";
        grep -v "^ *$" $OUT/$name.log | grep -iv "warn" | tail -1 | python -c "import json,sys; d=json.loads(sys.stdin.read()); print({k: d[k] for k in ('kernels','mesh','scan_layers','ms_per_step','seq_per_s','spread_ms','compile_s','peak_memory_gib_per_device','loss')})"; }
run data2_loop --seq-len 128 --batch-size 128 --mesh data=2 --no-scan-layers
run data2_scan --seq-len 128 --batch-size 128 --mesh data=2 --scan-layers
run fsdp2_loop --seq-len 128 --batch-size 128 --mesh fsdp=2 --no-scan-layers
run fsdp2_scan --seq-len 128 --batch-size 128 --mesh fsdp=2 --scan-layers
run 1gpu_loop --seq-len 128 --batch-size 64 --no-scan-layers
run s512_data2_loop --seq-len 512 --batch-size 32 --mesh data=2 --no-scan-layers
run s512_data2_scan --seq-len 512 --batch-size 32 --mesh data=2 --scan-layers
