# Session 25, run 12 (H200): every GPU test of the kernels on the final tree (the 1024-wide backward's parameters in
# SMEM, the autotune cache's older entries).
python -m pytest -q -m gpu tests/test_mgpu.py tests/test_kernels.py tests/test_autotune.py tests/test_gpu.py 2>&1 \
  | tail -3 | tee $OUT/tests.txt
