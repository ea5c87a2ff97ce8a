#!/bin/bash
# Session 9 run 1 (H200): the autotuner on the row-wise kernels, compiled: GPU tests, then tuning at BERT shapes.
export PYTHONPATH=. JAXFORMER_AUTOTUNE_CACHE=$OUT/autotune.json
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
git log --oneline -1 2>/dev/null || true
timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/test_autotune.py \
  2>&1 | tail -15
JAXFORMER_AUTOTUNE=tune timeout 370 python benchmarks/gpu_scripts/session9/tune_rows.py \
  bdrln:8192x768 bdrln:8192x1024 bias_gelu:8192x3072 bias_gelu:8192x4096 > $OUT/tune_rows.txt 2> $OUT/tune_rows.err
echo "tune_rows rc $?"
cat $OUT/tune_rows.txt
grep -E "stage|autotune:" $OUT/tune_rows.err | cut -c1-200 | tail -60
cp $OUT/autotune.json $OUT/autotune_cache.json 2>/dev/null
