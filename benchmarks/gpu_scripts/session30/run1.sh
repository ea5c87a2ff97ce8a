# Session 30, run 1 (H200): issue 4's close-out on main's head, one machine session. The embedding and whole-model
# kernel tests compiled (session 29's review mend was checked in interpret mode only), then every issue-4 target
# measured again on one tree: BDRLN and bias+GELU with dropout against XLA and the floor (session 28's floors.py),
# the embedding block and attention by device time, the BERT-large encoder layer by device time.
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $OUT/gpu.txt
python -c "import jax, sys; print('jax', jax.__version__, 'python', sys.version.split()[0])" | tee -a $OUT/gpu.txt
python -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels.py -k "embedding or model_pallas" 2>&1 | tail -3 | tee $OUT/tests.txt
python benchmarks/gpu_scripts/session28/floors.py --rounds 2 --rates 0.1 2>&1 | grep -v Warning | tee $OUT/floors.txt
python benchmarks/kernels.py --ops embedding,attention --passes fwd+bwd --device-time 20 2>&1 | grep -v Warning | tee $OUT/devtime.txt
python benchmarks/kernels.py --ops layer --passes fwd+bwd --device-time 10 2>&1 | grep -v Warning | tee $OUT/layer.txt
