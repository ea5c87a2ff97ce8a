# Session 22, run 8 (H100): the compiled row-wise tests, then BDRLN's and bias+GELU's device time on main's head.
python -m pytest -q -m gpu tests/test_mgpu.py tests/test_kernels.py 2>&1 | tail -3 | tee $OUT/tests.txt
python benchmarks/gpu_scripts/session21/ab_rowwise.py --ops bdrln --impls triton,mgpu --rates 0.1 2>&1 | grep -v Warning | tee $OUT/rowwise.txt
python benchmarks/gpu_scripts/session22/ab_approx.py 2>&1 | grep -v Warning | tee $OUT/approx.txt
