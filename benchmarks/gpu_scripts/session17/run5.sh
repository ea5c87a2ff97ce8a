#!/bin/bash
# Session 17, run 5 (one H200): the packed GPU test's errors under the three references (bias_grad_errs.py), the
# packed GPU tests with the per-path reference, then the GPU tests run 2's time limit cut (softmax, Mosaic GPU).
export PYTHONPATH=.
timeout 200 python benchmarks/gpu_scripts/session17/bias_grad_errs.py 2>&1 | grep -v -i warn
timeout 200 python -m pytest -q -m gpu tests/test_attention_kernel.py -k "packed_compiled" -p no:cacheprovider -rf --tb=line 2>&1 | grep -E "passed|failed|^FAILED|Error"
timeout 150 python -m pytest -q -m gpu tests/test_mgpu.py tests/test_kernels.py -k "mgpu or softmax" -p no:cacheprovider -rf --tb=line 2>&1 | grep -E "passed|failed|^FAILED|Error"
