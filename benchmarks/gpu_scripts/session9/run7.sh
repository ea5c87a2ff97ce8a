#!/bin/bash
# Session 9 run 7 (H100): the tuner now times candidates as benchmarks/kernels.py does (unrolled chain, barriers,
# L2 rotation); tune BDRLN and bias+GELU afresh, then time default vs chosen with kernels.py's longer chains.
export PYTHONPATH=. JAXFORMER_AUTOTUNE_CACHE=$OUT/autotune.json JAXFORMER_AUTOTUNE=tune
timeout 520 python benchmarks/gpu_scripts/session9/tune_rows.py bdrln:8192x1024 bias_gelu:8192x4096:0 > $OUT/tune.txt 2> $OUT/tune.err
cat $OUT/tune.txt; grep -h "jaxformer autotune" $OUT/tune.err | cut -c1-160
