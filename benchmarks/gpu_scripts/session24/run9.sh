# Session 24, run 9 (H100): main's head with the per-GPU default blocks: the bias+GELU Mosaic GPU tests, then main
# against session 23's kernels, two rotated rounds.
python -m pytest -q -m gpu tests/test_mgpu.py -k "bias_gelu" 2>&1 | tail -1 | tee $OUT/tests.txt
python benchmarks/gpu_scripts/session24/ab_gelu_z.py --rounds 2 --baselines 0 2>&1 | grep -v Warning \
  | tee $OUT/ab_gelu_z.txt
