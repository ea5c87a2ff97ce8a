# Session 23, run 13 (H200): main's head (the forward's mask a step ahead up to 768 wide): the compiled BDRLN Mosaic
# GPU tests, then BDRLN fwd+bwd with dropout, Mosaic GPU, both sums forms.
python -m pytest -q -m gpu tests/test_mgpu.py -k "bdrln" 2>&1 | tail -1 | tee $OUT/tests.txt
python benchmarks/gpu_scripts/session23/ab_colsums.py --rates 0.1 --impls mgpu 2>&1 | grep -v Warning | tee $OUT/colsums.txt
