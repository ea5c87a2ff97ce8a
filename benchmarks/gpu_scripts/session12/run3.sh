#!/bin/bash
# Session 12 run 3 (H200): kernels.py's attention rows (pallas vs XLA, rotated inputs) and the BERT-large S=512 encoder
# layer fwd+bwd (pallas vs XLA, same invocation) with the stored-dS pair as the default; then the model GPU tests.
export PYTHONPATH=.
timeout 220 python benchmarks/kernels.py --ops attention --impls pallas > $OUT/kernels.txt 2>&1
echo "kernels rc $?"; grep -v "^ *$" $OUT/kernels.txt | grep "|\|copy\|GB/s" | cut -c1-200
timeout 200 python benchmarks/kernels.py --ops layer --only S512 --passes fwd+bwd --repeats 3 > $OUT/layer.txt 2>&1
echo "layer rc $?"; grep -v "^ *$" $OUT/layer.txt | grep "|\|copy\|GB/s" | cut -c1-200
timeout 150 python -m pytest -q -m gpu tests/test_gpu.py -p no:randomly > $OUT/tests.txt 2>&1
echo "tests rc $?"; grep "passed\|failed\|FAIL" $OUT/tests.txt | tail -8
