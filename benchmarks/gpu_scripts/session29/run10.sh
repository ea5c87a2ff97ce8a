# Session 29, run 10 (H100): run 4 again on the final embedding defaults (the looped forward): the embedding tests compiled (gpu-marked
# BERT shapes and the small ones) and the model's pallas == xla, then the operator against XLA by device time.
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "embedding or model_pallas" 2>&1 | tail -3 | tee $OUT/tests.txt
python benchmarks/kernels.py --ops embedding --device-time 20 2>&1 | grep -v Warning | tee $OUT/devtime.txt
