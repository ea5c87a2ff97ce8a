#!/bin/bash
# Session 10 run 10 (H100, the tree of f279233: kernels as 43e6625): every GPU-marked test compiled, as a check of the
# whole tree (the H100 last ran 60 of 67 in session 8, cut by the time limit).
export PYTHONPATH=.
timeout 580 python -m pytest -q -m gpu tests/ -p no:cacheprovider 2>&1 | grep -E "passed|failed|FAILED|ERROR" | tail -15
