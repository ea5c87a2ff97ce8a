# Session 27, run 10 (H200): the other GPU-marked kernel and model tests on the final kernels (c2af492's; run 6 ran
# tests/test_mgpu.py): tests/test_kernels.py, tests/test_autotune.py, tests/test_gpu.py.
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
timeout 580 python -m pytest -q -m gpu tests/test_kernels.py tests/test_autotune.py tests/test_gpu.py 2>&1 | tail -3 \
  | tee $OUT/tests.txt
