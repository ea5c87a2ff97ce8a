# Session 26, run 1 (H200): BDRLN's backward with the fold's SMEM scoped after the pipeline (every column sum in
# registers), which leaves SMEM for 3-4 tiles in flight at two programs per SM; the compiled BDRLN tests, the A/B of
# tiles in flight, then ncu's per-instruction stall samples (SourceCounters) of the 8192x1024 backward.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
S=benchmarks/gpu_scripts/session25
python -m pytest -q -m gpu tests/test_mgpu.py -k bdrln 2>&1 | tail -2 | tee $OUT/tests.txt
python $S/ab_bdrln.py --rates 0.1 --rounds 2 --shapes 8192x1024,16384x1024,32768x1024,8192x768,16384x768 \
  --variants "main;bwd_max_concurrent_steps=3;bwd_max_concurrent_steps=4" 2>&1 | grep -v Warning | tee $OUT/ab.txt
timeout 150 compute-sanitizer --tool racecheck --racecheck-report all python $S/check_bdrln.py \
  "2048x1024:programs=64,bwd_programs=64" "2048x1024:programs=64,bwd_programs=64,bwd_max_concurrent_steps=3" \
  "2048x768:programs=64,bwd_programs=64,bwd_max_concurrent_steps=3" 2>&1 | grep -v Warning | tail -30 > $OUT/racecheck.txt
tail -4 $OUT/racecheck.txt
timeout 200 ncu --clock-control none -k regex:bdrln_bwd --section SourceCounters --section WarpStateStats \
  -o $OUT/bwd1024 python $S/check_bdrln.py 8192x1024 > $OUT/ncu_log.txt 2>&1; echo "rc $?" >> $OUT/ncu_log.txt
ncu -i $OUT/bwd1024.ncu-rep --page source --csv --print-source sass > $OUT/bwd1024_sass.csv 2> $OUT/ncu_src_err.txt
ls -la $OUT; wc -l $OUT/bwd1024_sass.csv; head -3 $OUT/bwd1024_sass.csv | cut -c1-600; tail -3 $OUT/ncu_log.txt
