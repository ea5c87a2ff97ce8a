# Session 23, run 6 (H200): the compiled tests of the files this session's changes reach, then BDRLN through the
# standard benchmark's device time (main's head: column_sums, the defaults).
python -m pytest -q -m gpu tests/test_kernels.py tests/test_mgpu.py tests/test_autotune.py tests/test_gpu.py 2>&1 | tail -3 | tee $OUT/tests.txt
python benchmarks/kernels.py --ops bdrln --passes fwd+bwd --device-time 20 2>&1 | grep -v Warning | tee $OUT/kernels_device_time.txt
