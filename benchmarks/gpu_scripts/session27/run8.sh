# Session 27, run 8 (H200): BDRLN's forward with its three parameters read once per program through SMEM
# (`Blocks.fwd_params_smem`, off by default) instead of every warp reading every column from GMEM (48 KB -> 12 KB
# per program at 1024 wide before its first tile). Predicted: -0.5 to -1.5 us of the forward's ~3.7 us fixed cost
# (run 6). The compiled BDRLN tests (the variants flip it), then a three-round A/B at both rates.
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
python -m pytest -q -m gpu tests/test_mgpu.py -k bdrln 2>&1 | tail -2 | tee $OUT/tests.txt
python benchmarks/gpu_scripts/session25/ab_bdrln.py --rates 0.1,0 --rounds 3 --variants "main;fwd_params_smem=1" \
  --shapes 8192x768,8192x1024,16384x768,16384x1024,32768x768,32768x1024 2>&1 | grep -v Warning | tee $OUT/ab.txt
