#!/bin/bash
# Session 10 run 6 (H200, the tree of 43e6625: kernels as shipped): every GPU-marked test compiled, as a check of the
# whole tree (the last full run was session 8's run 3; session 9 changed the tuner's plumbing).
export PYTHONPATH=.
timeout 560 python -m pytest -q -m gpu tests/ -p no:cacheprovider 2>&1 | grep -E "passed|failed|FAILED|ERROR" | tail -15
