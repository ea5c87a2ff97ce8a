# Session 28, run 3 (H200): run 2 without dropout (the operators at p = 0; BDRLN's floor backward x + r + y, one
# output, as its kernels write dx = d_residual once).
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
python benchmarks/gpu_scripts/session28/floors.py --rounds 2 --rates 0 2>&1 | grep -v Warning | tee $OUT/floors.txt
