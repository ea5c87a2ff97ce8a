#!/bin/bash
# Session 17, run 3 (one H200): bias_add_check.py (is the bias rounded before the unfolded add on the GPU? which forms
# go into the cuBLAS bias epilogue?), then, on this tree (_add_bias rounding the bias by lax.reduce_precision), the
# packed S=512 with-bias GPU tests that failed on main in run 2, and the CPU-side bias-add test run on the GPU.
export PYTHONPATH=.
timeout 120 python benchmarks/gpu_scripts/session17/bias_add_check.py 2>&1 | grep -v -i warn
timeout 300 python -m pytest -q -m gpu tests/test_attention_kernel.py -k "packed_compiled and 512 and True" -p no:cacheprovider -rf --tb=line 2>&1 | grep -E "passed|failed|^FAILED|Error"
timeout 60 python -m pytest -q tests/test_attention_kernel.py -k "unfolded_bias_add" -p no:cacheprovider -rf --tb=line 2>&1 | grep -E "passed|failed|^FAILED|Error"
