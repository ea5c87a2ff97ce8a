# Session 26, run 12 (H200): the compiled Mosaic GPU row-kernel tests on the final tree (BDRLN's other variants now
# cover the statistics prefetch in both tile orders), then the blocks around the new defaults with dropout: BDRLN's
# tiles in flight and the forward's mask ahead under round-robin tiles, and bias+GELU's rows per step and backward
# tiles in flight.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
python -m pytest -q -m gpu tests/test_mgpu.py 2>&1 | tail -2 | tee $OUT/tests.txt
python benchmarks/gpu_scripts/session25/ab_bdrln.py --rates 0.1 --rounds 2 --shapes 8192x768,8192x1024,16384x1024 \
  --variants "main;max_concurrent_steps=3;fwd_mask_ahead=1;bwd_max_concurrent_steps=3" 2>&1 | grep -v Warning \
  | tee $OUT/ab_bdrln.txt
python benchmarks/gpu_scripts/session24/ab_gelu_z.py --rates 0.1 --rounds 2 --baselines 0 --shapes 8192x3072,8192x4096 \
  --variants "main;main:block_rows=1;main:block_rows=4;main:bwd_max_concurrent_steps=2" 2>&1 | grep -v Warning \
  | tee $OUT/ab_gelu.txt
