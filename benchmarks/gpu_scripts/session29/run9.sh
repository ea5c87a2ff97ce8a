# Session 29, run 9 (H200): the final embedding defaults (forward: 8 one-row tiles per program, run 8's best): the
# embedding tests compiled, then the operator against XLA by device time and by timed chains.
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
python -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "embedding or model_pallas" 2>&1 | tail -2 | tee $OUT/tests.txt
python benchmarks/kernels.py --ops embedding --device-time 20 2>&1 | grep -v Warning | tee $OUT/devtime.txt
python benchmarks/kernels.py --ops embedding --repeats 5 2>&1 | grep -v Warning | tee $OUT/timed.txt
