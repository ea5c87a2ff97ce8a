#!/bin/bash
# Session 12 run 5 (H100): every GPU-marked test with the stored-dS pair as the S=512 default.
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 540 python -m pytest -q -m gpu tests/ -p no:randomly > $OUT/tests.txt 2>&1
echo "tests rc $?"; grep "passed\|failed\|FAIL\|Error" $OUT/tests.txt | tail -12
