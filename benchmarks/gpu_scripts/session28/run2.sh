# Session 28, run 2 (H200): run 1 again with BDRLN's floor backward as one fusion (run 1's custom-VJP floor had XLA
# emit its two backward outputs as two kernels, each re-reading dy: three launches, six arrays instead of five).
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
python benchmarks/gpu_scripts/session28/floors.py --rounds 2 2>&1 | grep -v Warning | tee $OUT/floors.txt
