# Session 21 run 13: BDRLN's Mosaic GPU backward with its column sums as register carries: compiled tests, device time.
export PYTHONPATH=. PYTHONUNBUFFERED=1
python -m pytest -q -m gpu tests/test_mgpu.py -k bdrln -p no:warnings 2>&1 | tail -3 | tee $OUT/tests_mgpu.txt
python benchmarks/gpu_scripts/session21/ab_rowwise.py --ops bdrln --impls mgpu --register-sums 2>&1 | grep -v Warning | tee $OUT/rowwise.txt
