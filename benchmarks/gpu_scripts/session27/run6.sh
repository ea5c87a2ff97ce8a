# Session 27, run 6 (H200): BDRLN's backward with its statistics prefetched where a program's statistics do not
# fill 128-byte TMA copies (run 4 failed to compile 2048x1024 with the default blocks; 12288 rows, a B96 S128 batch,
# failed the same way on the "auto" backend): the compiled Mosaic GPU tests, then run 4's row sweep of BDRLN.
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
python -m pytest -q -m gpu tests/test_mgpu.py 2>&1 | tail -2 | tee $OUT/tests.txt
python benchmarks/gpu_scripts/session25/ab_bdrln.py --rates 0.1,0 --rounds 1 --variants "main" \
  --shapes 2048x1024,4096x1024,8192x1024,16384x1024,32768x1024,2048x768,4096x768,8192x768,16384x768,32768x768 \
  2>&1 | grep -v Warning | tee $OUT/bdrln_rows.txt
