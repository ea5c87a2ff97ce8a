# Session 25, run 4: the kernels' own barriers (`auto_barriers=False`), BDRLN's default now; bias+GELU's A/B of the
# same: the compiled Mosaic GPU tests of both operators (both forms), then bias+GELU fwd+bwd, main (Pallas'
# barriers) against `auto_barriers=0`, alternating.
python -m pytest -q -m gpu tests/test_mgpu.py 2>&1 | tail -2 | tee $OUT/tests.txt
python benchmarks/gpu_scripts/session24/ab_gelu_z.py --rounds 2 --baselines 0 --variants "main;main:auto_barriers=0" \
  2>&1 | grep -v Warning | tee $OUT/ab_gelu.txt
# BDRLN's column sums in registers (0-2) at 1024 wide now that its SMEM accumulators carry no barriers.
python benchmarks/gpu_scripts/session25/ab_bdrln.py --rates 0.1,0 --shapes 8192x1024,32768x1024 \
  --variants "main;bwd_register_sums=0;bwd_register_sums=1;bwd_register_sums=2" 2>&1 | grep -v Warning \
  | tee $OUT/ab_sums.txt
