#!/bin/bash
# Session 10 run 15 (H200): review mend: the tuner keeps the default's and the winner's compiled timing chains
# (`autotune.step_clock`) for the re-timing instead of compiling them again; its GPU tests and kernels.py's clock.
export PYTHONPATH=.
timeout 300 python -m pytest -q -m gpu tests/test_autotune.py -p no:cacheprovider 2>&1 | tail -1
timeout 150 python benchmarks/kernels.py --ops bdrln --only "8192x1024 p=0.1" --passes fwd+bwd --impls pallas \
    --repeats 5 2>/dev/null | grep "| bdrln\|copy bandwidth"
