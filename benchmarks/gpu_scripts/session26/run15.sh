# Session 26, run 15 (H200): the review mend compiled: BDRLN's statistics copies (mean and rstd) on one barrier of
# two arrivals, one wait; the compiled BDRLN tests, compute-sanitizer's racecheck, and a two-round A/B against
# the prefetch as a timing check.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
S=benchmarks/gpu_scripts/session25
python -m pytest -q -m gpu tests/test_mgpu.py -k bdrln 2>&1 | tail -2 | tee $OUT/tests.txt
timeout 120 compute-sanitizer --tool racecheck --racecheck-report all python $S/check_bdrln.py \
  "2048x1024:programs=64,bwd_programs=64" "2048x768:programs=64,bwd_programs=64" 2>&1 | grep -v Warning \
  | tail -6 > $OUT/racecheck.txt
tail -2 $OUT/racecheck.txt
python $S/ab_bdrln.py --rates 0.1 --rounds 2 --shapes 8192x1024,16384x768 --variants "main;bwd_stats_smem=0" 2>&1 \
  | grep -v Warning | tee $OUT/ab.txt
