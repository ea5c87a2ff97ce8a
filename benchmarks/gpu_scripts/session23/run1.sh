# Session 23, run 1 (H200): the compiled kernel tests (column_sums, BDRLN, bias+GELU, Mosaic GPU), then BDRLN fwd+bwd
# with one column_sums launch against three XLA sums, both backends, p = 0.1.
python -m pytest -q -m gpu tests/test_kernels.py tests/test_mgpu.py 2>&1 | tail -3 | tee $OUT/tests.txt
python benchmarks/gpu_scripts/session23/ab_colsums.py --rates 0.1 2>&1 | grep -v Warning | tee $OUT/colsums.txt
