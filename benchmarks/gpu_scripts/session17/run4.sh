#!/bin/bash
# Session 17, run 4 (one H200): the packed GPU tests' errors under both references (bias_grad_errs.py), then the
# packed GPU tests with the corrected reference (tests/test_attention_kernel.py of this tree).
export PYTHONPATH=.
timeout 200 python benchmarks/gpu_scripts/session17/bias_grad_errs.py 2>&1 | grep -v -i warn
timeout 300 python -m pytest -q -m gpu tests/test_attention_kernel.py -k "packed_compiled" -p no:cacheprovider -rf --tb=line 2>&1 | grep -E "passed|failed|^FAILED|Error"
