# Session 24, run 5 (H200): main's head (2e25349): the GPU tests of the kernels, then bias+GELU fwd+bwd, session 23's
# kernels against main's, XLA and Triton once per case, two rotated rounds.
python -m pytest -q -m gpu tests/test_mgpu.py tests/test_kernels.py tests/test_autotune.py tests/test_gpu.py 2>&1 \
  | tail -3 | tee $OUT/tests.txt
python benchmarks/gpu_scripts/session24/ab_gelu_z.py --rounds 2 2>&1 | grep -v Warning | tee $OUT/ab_gelu_z.txt
