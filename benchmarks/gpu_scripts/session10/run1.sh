#!/bin/bash
# Session 10 run 1 (H200): BDRLN / layernorm with exact column tiles (768 = 512 + 256) compiled and checked against
# the reference (GPU tests), then timed against the former padded 1024-wide tile and XLA (ab_tiles.py).
export PYTHONPATH=.
timeout 240 python -m pytest -q -m gpu tests/test_kernels.py -k "gpu_bdrln" 2>&1 | tail -3
timeout 330 python benchmarks/gpu_scripts/session10/ab_tiles.py bdrln:8192x768 ln:8192x768 bdrln:32768x768 \
    2>&1 | grep -v "Deprecat\|return rule\|^ *$"
