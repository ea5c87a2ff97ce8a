# Session 25, run 4: the kernels' own barriers (`auto_barriers=False`), BDRLN's default now; bias+GELU's A/B of the
# same: the compiled Mosaic GPU tests of both operators (both forms), then bias+GELU fwd+bwd, main (Pallas'
# barriers) against `auto_barriers=0`, alternating.
python -m pytest -q -m gpu tests/test_mgpu.py 2>&1 | tail -2 | tee $OUT/tests.txt
python benchmarks/gpu_scripts/session24/ab_gelu_z.py --rounds 2 --baselines 0 --variants "main;main:auto_barriers=0" \
  2>&1 | grep -v Warning | tee $OUT/ab_gelu.txt
