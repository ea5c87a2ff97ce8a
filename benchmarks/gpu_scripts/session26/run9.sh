# Session 26, run 9 (H100): BDRLN's round-robin tiles (the new default) against contiguous runs per program, two
# alternating rounds, with dropout; the compiled BDRLN tests; then the standard benchmark at 32768x1024, where
# `"auto"` runs Triton on an H100 with dropout (`TRITON_FROM_ROWS`).
export XLA_PYTHON_CLIENT_PREALLOCATE=false
python -m pytest -q -m gpu tests/test_mgpu.py -k bdrln 2>&1 | tail -2 | tee $OUT/tests.txt
python benchmarks/gpu_scripts/session25/ab_bdrln.py --rates 0.1 --shapes 8192x768,8192x1024,16384x1024,32768x1024 \
  --variants "main;fwd_interleave=0,bwd_interleave=0" 2>&1 | grep -v Warning | tee $OUT/ab.txt
python benchmarks/kernels.py --ops bdrln --only 32768x1024 --passes fwd+bwd --device-time 20 2>&1 | grep -v Warning \
  | tee $OUT/bdrln.txt
