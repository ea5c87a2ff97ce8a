# Session 24, run 10 (H200): the Triton bias+GELU kernels in the same z-form (`_math.gelu_terms` / `gelu_grad`, now
# shared with the Mosaic GPU kernels): their compiled tests, then the h-form (1e28d7c) against the z-form, and main's
# Mosaic GPU kernels after the move of their math into `_math`.
python -m pytest -q -m gpu tests/test_kernels.py tests/test_mgpu.py -k "gelu" 2>&1 | tail -1 | tee $OUT/tests.txt
python benchmarks/gpu_scripts/session24/ab_gelu_z.py --rounds 2 --baselines 0 --variants "old_triton;triton;main" \
  2>&1 | grep -v Warning | tee $OUT/ab_triton.txt
