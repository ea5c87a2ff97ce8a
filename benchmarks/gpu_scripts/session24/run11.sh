# Session 24, run 11 (H100): main's head: the GPU tests of the kernels' files on the H100.
python -m pytest -q -m gpu tests/test_mgpu.py tests/test_kernels.py tests/test_autotune.py tests/test_gpu.py 2>&1 \
  | tail -3 | tee $OUT/tests.txt
