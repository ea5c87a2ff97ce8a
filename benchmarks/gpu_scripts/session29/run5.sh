# Session 29, run 5 (H200): what a cheaper dropout mask would buy BDRLN and bias+GELU at the shapes short of 85%:
# the shipped hash, one multiply round, no finaliser (an upper bound), one process each, then the shipped hash again.
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
for h in fmix32 one-round none fmix32; do
  python benchmarks/gpu_scripts/session29/mask_cost.py --hash $h 2>&1 | grep -v Warning | tee -a $OUT/mask_cost.txt
done
