# Session 28, run 4 (H100): runs 2 and 3 on the H100, with and without dropout.
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
python benchmarks/gpu_scripts/session28/floors.py --rounds 2 --rates 0.1,0 2>&1 | grep -v Warning | tee $OUT/floors.txt
