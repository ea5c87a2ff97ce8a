# Session 22, run 2: the compiled row-wise tests on the new defaults (one register sum at 1024 wide, Mosaic GPU from
# 8192 rows there), then BDRLN's device-time table, every backend.
python -m pytest -q -m gpu tests/test_mgpu.py tests/test_kernels.py 2>&1 | tail -5 | tee $OUT/tests.txt
python benchmarks/gpu_scripts/session21/ab_rowwise.py --ops bdrln --impls triton,mgpu 2>&1 | grep -v Warning | tee $OUT/rowwise.txt
