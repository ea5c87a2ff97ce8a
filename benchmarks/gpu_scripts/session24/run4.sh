# Session 24, run 4 (H200): (a) without dropout, session 23's kernels against main's z-form and its backward with 2
# steps in flight, 4 rotated rounds (run 2 had main's backward 10% slower at 32768x4096, run 3's sweep did not);
# (b) with dropout, the z-form forward with 1 (default) or 2 rows of 4096 per step.
S=benchmarks/gpu_scripts/session24/ab_gelu_z.py
python $S --rates 0 --shapes 32768x4096,8192x4096 --rounds 4 --baselines 0 \
  --variants "old;main;main:bwd_max_concurrent_steps=2" 2>&1 | grep -v Warning | tee $OUT/ab_p0.txt
python $S --rates 0.1 --shapes 8192x4096,32768x4096 --rounds 4 --baselines 0 \
  --variants "main;main:block_rows=2" 2>&1 | grep -v Warning | tee $OUT/ab_rows.txt
