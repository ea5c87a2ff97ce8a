# Session 28, run 8 (H100): bias+GELU without dropout (BERT's FFN) took longer than with it at 4096 wide in run 7
# (8192x4096: 129.6-130.4 against 124.4-124.6 us); its forward tiles are 2 rows of 4096 without dropout, 1 with
# (session 24 measured 1 against 2 on the H100 with dropout only). Forward rows per step and backward steps in
# flight, p = 0, three rotated rounds.
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
python benchmarks/gpu_scripts/session24/ab_gelu_z.py --rates 0 --rounds 3 --baselines 0 \
  --shapes 8192x4096,16384x4096,32768x4096 \
  --variants "main;main:block_rows=1;main:bwd_max_concurrent_steps=3;main:block_rows=1,bwd_max_concurrent_steps=3" \
  2>&1 | grep -v Warning > $OUT/ab.txt
cat $OUT/ab.txt
