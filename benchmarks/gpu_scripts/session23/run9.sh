# Session 23, run 9 (H200): the forward's 2 tiles in flight at 1024 wide (the new default): the compiled BDRLN Mosaic
# GPU tests, the A/B at p = 0, then fwd+bwd on every shape with the defaults (both sums forms, Mosaic GPU).
python -m pytest -q -m gpu tests/test_mgpu.py -k "bdrln" 2>&1 | tail -1 | tee $OUT/tests.txt
python benchmarks/gpu_scripts/session23/ab_fwd_steps.py --rate 0 --shapes 8192x1024,16384x1024,32768x1024 2>&1 | grep -v Warning | tee $OUT/fwd_steps_p0.txt
python benchmarks/gpu_scripts/session23/ab_colsums.py --rates 0.1 --impls mgpu 2>&1 | grep -v Warning | tee $OUT/colsums.txt
