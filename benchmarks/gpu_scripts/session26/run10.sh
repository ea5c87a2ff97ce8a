# Session 26, run 10 (H200): bias+GELU's Mosaic GPU kernels with round-robin tiles (`Blocks.interleave`, as BDRLN's
# since run 7) against a contiguous run per program, three alternating rounds, both rates; the compiled tests first.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
python -m pytest -q -m gpu tests/test_mgpu.py -k bias_gelu 2>&1 | tail -2 | tee $OUT/tests.txt
python benchmarks/gpu_scripts/session24/ab_gelu_z.py --rates 0.1,0 --rounds 3 --variants "main;main:interleave=1" \
  2>&1 | grep -v Warning | tee $OUT/ab.txt
