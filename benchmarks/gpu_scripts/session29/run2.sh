# Session 29, run 2: the embedding kernels with the backward's ids and statistics loaded before its loop (and the
# prefetch option): the embedding tests compiled again, then the block candidates by device time (both passes), and
# the defaults by device time.
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "embedding or model_pallas" 2>&1 | tail -4 | tee $OUT/tests.txt
python benchmarks/kernels.py --ops embedding --device-time 20 --tune 2>&1 | grep -v Warning | tee $OUT/tune.txt
