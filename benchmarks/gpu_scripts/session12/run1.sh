#!/bin/bash
# Session 12 run 1 (H200): the stored-dS pair compiled (GPU tests at S=512), per-kernel profile, rotated timing.
export PYTHONPATH=.
timeout 200 python -m pytest -q -m gpu tests/test_attention_kernel.py -k "512" -p no:randomly > $OUT/tests.txt 2>&1
echo "tests rc $?"; tail -3 $OUT/tests.txt
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout 200 python benchmarks/gpu_scripts/session12/ds_store.py profile \
    > $OUT/profile.txt 2>&1
echo "profile rc $?"
grep "^#\|kernels of\|  [0-9 .]* us \|failed" $OUT/profile.txt | cut -c1-150
timeout 150 python benchmarks/gpu_scripts/session12/ds_store.py time > $OUT/time.txt 2>&1
echo "time rc $?"; grep -v "^ *$" $OUT/time.txt | grep "^#\|copy\|fwd+bwd\|Error" | cut -c1-200
