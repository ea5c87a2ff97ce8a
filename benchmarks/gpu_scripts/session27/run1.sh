# Session 27, run 1 (H200): bias+GELU's Mosaic GPU kernels drawing the dropout mask a step ahead (`Blocks.fwd_mask_ahead`,
# `bwd_mask_ahead`, off by default): the compiled tests (the 8192x4096 p = 0.1 case runs both flipped), then a
# three-round alternating A/B with dropout, each kernel's flag alone and both.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
python -m pytest -q -m gpu tests/test_mgpu.py -k bias_gelu 2>&1 | tail -2 | tee $OUT/tests.txt
python benchmarks/gpu_scripts/session24/ab_gelu_z.py --rates 0.1 --rounds 3 --baselines 0 \
  --variants "main;main:fwd_mask_ahead=1;main:bwd_mask_ahead=1;main:fwd_mask_ahead=1,bwd_mask_ahead=1" \
  2>&1 | grep -v Warning | tee $OUT/ab.txt
