# Session 28, run 6 (H200): BDRLN's Mosaic GPU blocks swept again on main's kernels (session 21's sweep predates
# sessions 25-26's barriers, round-robin tiles and SMEM statistics) at the four shapes short of 85% with dropout
# (0.1-3.0 us short in run 5): programs per SM, tiles in flight, rows per forward step; two rotated rounds.
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
python benchmarks/gpu_scripts/session25/ab_bdrln.py --rates 0.1 --rounds 2 \
  --shapes 8192x768,8192x1024,16384x768,16384x1024 \
  --variants "main;programs=132;bwd_programs=132;bwd_max_concurrent_steps=3;max_concurrent_steps=2;max_concurrent_steps=3;max_concurrent_steps=4;block_rows=8" \
  2>&1 | grep -v Warning | tee $OUT/sweep.txt
