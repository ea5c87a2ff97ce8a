# Session 24, run 14 (H200): the review mend (5247bbf) compiled: bias+GELU's and column_sums' GPU tests.
python -m pytest -q -m gpu tests/test_kernels.py tests/test_mgpu.py -k "gelu or column_sums" 2>&1 | tail -1 \
  | tee $OUT/tests.txt
