# Session 26, run 7 (H200): every GPU test of the kernels on the new defaults (BDRLN's round-robin tiles and its
# backward's statistics in SMEM), then the standard kernel benchmark of BDRLN (XLA, Triton and Mosaic GPU in one
# process, device time), p = 0.1 and 0.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
python -m pytest -q -m gpu tests/test_mgpu.py tests/test_kernels.py tests/test_autotune.py tests/test_gpu.py 2>&1 \
  | tail -3 | tee $OUT/tests.txt
python benchmarks/kernels.py --ops bdrln --passes fwd+bwd --device-time 20 2>&1 | grep -v Warning | tee $OUT/bdrln.txt
