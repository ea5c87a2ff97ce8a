# Session 22, run 13: BDRLN's Mosaic GPU defaults per rate (two register sums at 1024 wide without dropout): the
# compiled BDRLN tests, then device time at p = 0.
python -m pytest -q -m gpu tests/test_mgpu.py -k "bdrln" 2>&1 | tail -1 | tee $OUT/tests.txt
python benchmarks/gpu_scripts/session21/ab_rowwise.py --ops bdrln --impls mgpu --rates 0 --shapes 8192x1024,16384x1024,32768x1024 2>&1 | grep -v Warning | tee $OUT/rowwise.txt
