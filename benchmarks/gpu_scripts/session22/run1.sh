# Session 22, run 1: the compiled tests of BDRLN's Mosaic GPU kernels with 0-3 register sums, then device time.
set -x
python -m pytest -q -m gpu tests/test_mgpu.py -k bdrln 2>&1 | tail -5 | tee $OUT/tests_mgpu.txt
python benchmarks/gpu_scripts/session22/ab_sums.py 2>&1 | tee $OUT/sums1024.txt
python benchmarks/gpu_scripts/session22/ab_sums.py --shapes 8192x768,32768x768 --rates 0.1 --counts 2,3 2>&1 | tee $OUT/sums768.txt
