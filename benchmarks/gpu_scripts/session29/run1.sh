# Session 29, run 1: the embedding block's fused kernels on the GPU: every embedding test compiled (the gpu-marked
# BERT shapes and the small ones, which compile on a GPU too) and the model's pallas == xla test, then the operator
# against XLA's fusion: timed chains, device time, the block candidates, and a profile of one fwd+bwd.
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "embedding or model_pallas" 2>&1 | tail -15 | tee $OUT/tests.txt
python benchmarks/kernels.py --ops embedding --repeats 5 2>&1 | grep -v Warning | tee $OUT/timed.txt
python benchmarks/kernels.py --ops embedding --device-time 20 2>&1 | grep -v Warning | tee $OUT/devtime.txt
python benchmarks/kernels.py --ops embedding --repeats 3 --tune 2>&1 | grep -v Warning | tee $OUT/tune.txt
python benchmarks/kernels.py --ops embedding --passes fwd+bwd --repeats 1 --profile 5 --top 12 2>&1 | grep -v Warning > $OUT/profile.txt
tail -60 $OUT/profile.txt
