# Session 22, run 12: BDRLN's Mosaic GPU kernels with more programs per SM (ab_programs.py), then the rewritten
# scripts (common.py) once each on one shape, against their earlier runs.
D=benchmarks/gpu_scripts/session22
python $D/ab_programs.py --rates 0.1 2>&1 | grep -v Warning | tee $OUT/programs.txt
python $D/ab_fwd_store.py --shapes 8192x768 --rates 0.1 2>&1 | grep -v Warning | tee $OUT/check_fwd_store.txt
python $D/ab_sums.py --shapes 8192x1024 --rates 0.1 --counts 1 2>&1 | grep -v Warning | tee $OUT/check_sums.txt
python $D/ab_approx.py --shapes 8192x3072 --rates 0.1 2>&1 | grep -v Warning | tee $OUT/check_approx.txt
