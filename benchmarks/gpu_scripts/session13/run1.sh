#!/bin/bash
# Session 13 run 1 (2 x H200): the encoder layers in a loop vs a scan under 2-device meshes (data=2, fsdp=2),
# BERT-large S=128, 64 sequences per GPU, Pallas kernels; one GPU with the loop as the baseline of the same machine.
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
python -c "import jax; print(jax.__version__, jax.devices())"
T="python benchmarks/train_step.py --config large --seq-len 128 --steps 10 --repeats 3 --warmup 2"
run() { name=$1; shift; echo "== $name: $*"; timeout 150 $T "$@" > $OUT/$name.log 2>&1; echo "rc $?";
        grep -v "^ *$" $OUT/$name.log | grep -iv "warn" | tail -4 | cut -c1-250; }
run 1gpu_loop --batch-size 64 --no-scan-layers
run data2_loop --batch-size 128 --mesh data=2 --no-scan-layers
run data2_scan --batch-size 128 --mesh data=2 --scan-layers
run fsdp2_loop --batch-size 128 --mesh fsdp=2 --no-scan-layers
run fsdp2_scan --batch-size 128 --mesh fsdp=2 --scan-layers
