#!/bin/bash
# Session 7, run 5 (H100): every GPU test compiled on an H100, then the per-GPU backend choice of the row-wise kernels
# (bias+GELU, BDRLN: XLA vs Triton vs Mosaic GPU), fwd+bwd.
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader; python -c "import jax; print(jax.__version__)"
timeout 300 python -m pytest -q -m gpu -p no:cacheprovider tests/ > $OUT/gpu_tests.txt 2>&1; tail -3 $OUT/gpu_tests.txt
timeout 260 python benchmarks/kernels.py --ops bias_gelu,bdrln --passes fwd+bwd --repeats 3 --impls pallas,mgpu \
  > $OUT/rowwise.txt 2> $OUT/rowwise.err; grep "^|\|^#" $OUT/rowwise.txt; tail -2 $OUT/rowwise.err
