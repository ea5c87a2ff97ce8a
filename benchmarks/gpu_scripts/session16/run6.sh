#!/bin/bash
# Session 16, run 6 (one H200, jax 0.11.2): BDRLN's Mosaic GPU kernels after their TILED stores went through
# `_mgpu.store` (on jax < 0.12 the same assignment as before; on 0.12 `plgpu.store(optimized=False)`, which 0.12's
# lowering then accepts): the GPU tests of both Mosaic GPU kernels, then BDRLN Mosaic GPU vs Triton vs XLA at 8192x768.
export PYTHONPATH=.
timeout 150 python -m pytest -q -m gpu tests/test_mgpu.py -p no:cacheprovider 2>&1 | tail -3
timeout 150 python benchmarks/kernels.py --ops bdrln --only "8192x768" --passes fwd+bwd --impls pallas,mgpu --repeats 5 \
  2>&1 | grep -E "^#|^\| bdrln" | grep -v warn
