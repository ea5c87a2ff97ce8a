# Session 26, run 11 (H100): bias+GELU's Mosaic GPU kernels with round-robin tiles (`Blocks.interleave`, as BDRLN's
# since run 7) against a contiguous run per program on the H100, two alternating rounds, both rates (no baselines).
export XLA_PYTHON_CLIENT_PREALLOCATE=false
python benchmarks/gpu_scripts/session24/ab_gelu_z.py --rates 0.1,0 --rounds 2 --baselines 0 --variants "main;main:interleave=1" \
  2>&1 | grep -v Warning | tee $OUT/ab.txt
