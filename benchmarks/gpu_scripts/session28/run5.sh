# Session 28, run 5 (H200): runs 2 and 3 again with the floor adding uint32 words (run 3 showed XLA's bf16 `2x` at
# 73-78% of the copy probe, session 20's bf16 shortfall, so bias+GELU's bf16 floor forward was no floor), with and
# without dropout; totals without the D2D copy of BDRLN's p = 0 gradient (returned twice by the benchmark's step).
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
python benchmarks/gpu_scripts/session28/floors.py --rounds 2 --rates 0.1,0 2>&1 | grep -v Warning | tee $OUT/floors.txt
