# Session 24, run 3 (H200): the block sweep of the z-form bias+GELU kernels (fewer registers: 3 programs per SM fit).
python benchmarks/gpu_scripts/session24/bg_sweep.py 2>&1 | grep -v Warning | tee $OUT/bg_sweep.txt
