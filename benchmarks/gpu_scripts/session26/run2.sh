# Session 26, run 2 (H200): BDRLN's backward with the program's row statistics TMA'd into SMEM once
# (`Blocks.bwd_stats_smem`, the default) against the GMEM prefetch a step ahead (run 1's ncu: ptxas sank that load to
# the end of the step, where the loop carry waited for it); compiled tests, racecheck, the A/B at both rates, and
# ncu's per-instruction stall samples of the new 8192x1024 backward.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
S=benchmarks/gpu_scripts/session25
python -m pytest -q -m gpu tests/test_mgpu.py -k bdrln 2>&1 | tail -2 | tee $OUT/tests.txt
timeout 150 compute-sanitizer --tool racecheck --racecheck-report all python $S/check_bdrln.py \
  "2048x1024:programs=64,bwd_programs=64" "2048x768:programs=64,bwd_programs=64" 2>&1 | grep -v Warning \
  | tail -12 > $OUT/racecheck.txt
tail -3 $OUT/racecheck.txt
python $S/ab_bdrln.py --rates 0.1,0 --rounds 3 \
  --shapes 8192x768,16384x768,32768x768,8192x1024,16384x1024,32768x1024 \
  --variants "main;bwd_stats_smem=0" 2>&1 | grep -v Warning | tee $OUT/ab.txt
timeout 200 ncu --clock-control none -k regex:bdrln_bwd --section SourceCounters --section WarpStateStats \
  -o $OUT/bwd1024 python $S/check_bdrln.py 8192x1024 > $OUT/ncu_log.txt 2>&1; echo "rc $?" >> $OUT/ncu_log.txt
ncu -i $OUT/bwd1024.ncu-rep --page source --csv --print-source sass > $OUT/bwd1024_sass.csv 2> $OUT/ncu_src_err.txt
rm -f $OUT/bwd1024.ncu-rep; wc -l $OUT/bwd1024_sass.csv
