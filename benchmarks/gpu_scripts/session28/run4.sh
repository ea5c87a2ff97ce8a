# Session 28, run 4 (H100): run 5 on the H100.
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
python benchmarks/gpu_scripts/session28/floors.py --rounds 2 --rates 0.1,0 2>&1 | grep -v Warning | tee $OUT/floors.txt
