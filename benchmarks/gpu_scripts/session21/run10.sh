# Session 21 run 10: the final tree: Mosaic GPU tests (new default blocks), then BDRLN device time, every backend.
export PYTHONPATH=. PYTHONUNBUFFERED=1
python -m pytest -q -m gpu tests/test_mgpu.py -p no:warnings 2>&1 | tail -3 | tee $OUT/tests_mgpu.txt
python benchmarks/gpu_scripts/session21/ab_rowwise.py --ops bdrln 2>&1 | grep -v Warning | tee $OUT/rowwise.txt
