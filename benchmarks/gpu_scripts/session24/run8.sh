# Session 24, run 8 (H100): run 7 had main's backward with dropout 6-8% slower than session 23's at 4096 wide on the
# H100 (memory-bound there): the backward's steps in flight 2/3, and the forward's rows per step, per rate.
python benchmarks/gpu_scripts/session24/ab_gelu_z.py --rounds 2 --baselines 0 --shapes 8192x4096,32768x4096,8192x3072 \
  --variants "old;main:bwd_max_concurrent_steps=2;main:bwd_max_concurrent_steps=3;main:block_rows=1,bwd_max_concurrent_steps=2" \
  2>&1 | grep -v Warning | tee $OUT/ab_h100.txt
