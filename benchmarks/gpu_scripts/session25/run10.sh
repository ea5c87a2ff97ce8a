# Session 25, run 10 (H200): the new default at 1024 wide with dropout (the bias and LN scale in SMEM, all three
# column sums in registers) against the old (in registers, one sum), three alternating rounds; the compiled BDRLN
# tests on this default.
python -m pytest -q -m gpu tests/test_mgpu.py -k bdrln 2>&1 | tail -2 | tee $OUT/tests.txt
python benchmarks/gpu_scripts/session25/ab_bdrln.py --rates 0.1 --rounds 3 \
  --shapes 8192x1024,16384x1024,32768x1024 --variants "main;bwd_params_smem=0,bwd_register_sums=1" 2>&1 \
  | grep -v Warning | tee $OUT/ab.txt
