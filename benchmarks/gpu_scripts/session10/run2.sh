#!/bin/bash
# Session 10 run 2 (H200, the tree of 43e6625 plus this script): (1) the autotuner's GPU tests with the session-9
# changes not yet run compiled (ROTATE_BYTES read at call time, the tests' tune_env without rotation copies, the
# failed-measurement retry); (2) where BDRLN's fwd+bwd time goes at 8192x768 vs 8192x1024, per kernel (profiled).
export PYTHONPATH=.
timeout 330 python -m pytest -q -m gpu tests/test_autotune.py 2>&1 | tail -3
for shape in 8192x768 8192x1024; do
  timeout 110 python benchmarks/kernels.py --ops bdrln --only "$shape p=0.1" --passes fwd+bwd --impls pallas \
      --repeats 5 --profile 20 --top 6 2>/dev/null | grep -v "^ *$"
done
