#!/bin/bash
# Session 9 run 8 (H100): the tuner with kernels.py's run lengths (2, 10) and a confirming re-timing of its winner;
# BDRLN tuned afresh, then default vs chosen timed by kernels.py (as run 7).
export PYTHONPATH=. JAXFORMER_AUTOTUNE_CACHE=$OUT/autotune.json JAXFORMER_AUTOTUNE=tune
timeout 520 python benchmarks/gpu_scripts/session9/tune_rows.py bdrln:8192x1024 > $OUT/tune.txt 2> $OUT/tune.err
cat $OUT/tune.txt; grep -h "jaxformer autotune" $OUT/tune.err | cut -c1-160
