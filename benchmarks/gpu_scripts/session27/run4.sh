# Session 27, run 4 (H200): each kernel's device time against the row count (2048-32768 rows), with and without
# dropout, for a fixed + per-row fit: bias+GELU at 4096 wide looked to pay a fixed ~5 us for dropout in its forward
# at 8192 rows (session 26's run 10: the dropout surcharge per element 0.22 ns at 8192 rows, 0.08 at 32768).
# (First tried with --rounds 2: session 22's `parse` kept only its fixed shapes; it now takes any RxD.)
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
python benchmarks/gpu_scripts/session24/ab_gelu_z.py --rates 0.1,0 --rounds 1 --baselines 0 --variants "main" \
  --shapes 2048x4096,4096x4096,8192x4096,16384x4096,32768x4096 2>&1 | grep -v Warning | tee $OUT/gelu_rows.txt
python benchmarks/gpu_scripts/session25/ab_bdrln.py --rates 0.1,0 --rounds 1 --variants "main" \
  --shapes 2048x1024,4096x1024,8192x1024,16384x1024,32768x1024 2>&1 | grep -v Warning | tee $OUT/bdrln_rows.txt
