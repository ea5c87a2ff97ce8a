# Session 25, run 11 (H100): BDRLN's new 1024-wide default with dropout (parameters in SMEM, three register sums)
# against the old, two alternating rounds; the compiled BDRLN tests; then the standard benchmark at 32768x1024, where
# `"auto"` runs Triton on an H100 with dropout (`TRITON_FROM_ROWS`).
python -m pytest -q -m gpu tests/test_mgpu.py -k bdrln 2>&1 | tail -2 | tee $OUT/tests.txt
python benchmarks/gpu_scripts/session25/ab_bdrln.py --rates 0.1 --shapes 8192x1024,16384x1024,32768x1024 \
  --variants "main;bwd_params_smem=0,bwd_register_sums=1" 2>&1 | grep -v Warning | tee $OUT/ab.txt
python benchmarks/kernels.py --ops bdrln --only 32768x1024 --passes fwd+bwd --device-time 20 2>&1 | grep -v Warning \
  | tee $OUT/bdrln.txt
