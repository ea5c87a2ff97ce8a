# Session 26, run 5 (H200): BDRLN's tiles dealt round-robin to the programs in the backward too
# (`Blocks.bwd_interleave`; its statistics' SMEM copy then one (steps, 4) box of a (steps, programs·4) view),
# each kernel alone and both, at both rates; compiled tests first. Run 4: the forward's round-robin tiles took
# 1.0 / 2.2 / 3 us off fwd+bwd at 8192 / 16384 / 32768 rows of 1024 (the backward kernel's time fell too).
export XLA_PYTHON_CLIENT_PREALLOCATE=false
S=benchmarks/gpu_scripts/session25
python -m pytest -q -m gpu tests/test_mgpu.py -k bdrln 2>&1 | tail -2 | tee $OUT/tests.txt
python $S/ab_bdrln.py --rates 0.1,0 --rounds 3 --shapes 8192x768,16384x768,8192x1024,16384x1024,32768x1024 \
  --variants "main;fwd_interleave=1;bwd_interleave=1;fwd_interleave=1,bwd_interleave=1" 2>&1 | grep -v Warning \
  | tee $OUT/ab.txt
