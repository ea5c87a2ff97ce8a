#!/bin/bash
# Session 6, run 2: the layer's HLO (what the transposes/slices are), flash attention block sizes per kernel.
export PYTHONPATH=.
timeout 120 python benchmarks/gpu_scripts/session6/layer_hlo.py 64 128 > $OUT/layer_hlo.txt 2>&1
head -c 6000 $OUT/layer_hlo.txt
timeout 400 python benchmarks/gpu_scripts/session6/flash_tune.py > $OUT/flash_tune.txt 2> $OUT/flash_tune.err
cat $OUT/flash_tune.txt; tail -3 $OUT/flash_tune.err
