# Session 28, run 7 (H100): bias+GELU's floors at both rates (run 4's log stopped at 32768x4096 with dropout: its
# command was piped into `head -5`, whose exit broke tee's and then Python's stdout).
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
python benchmarks/gpu_scripts/session28/floors.py --rounds 2 --rates 0.1,0 --bdrln "" 2>&1 | grep -v Warning > $OUT/floors.txt
tail -3 $OUT/floors.txt | cut -c1-150
