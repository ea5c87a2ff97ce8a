#!/bin/bash
# Session 10 run 8 (H200): what the README's plain test command does on a one-GPU machine (the CPU suite's meshes
# want 8 devices), and the same tests with JAX_PLATFORMS=cpu (8 virtual CPU devices, as in CI).
export PYTHONPATH=.
timeout 250 python -m pytest -q tests/test_kernels.py tests/test_sharding.py -x -p no:cacheprovider 2>&1 | tail -3
JAX_PLATFORMS=cpu timeout 250 python -m pytest -q tests/test_kernels.py -k "per_batch_shard or divisible" \
    -p no:cacheprovider 2>&1 | tail -1
