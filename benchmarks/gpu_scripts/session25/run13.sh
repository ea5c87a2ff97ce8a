# Session 25, run 13 (H200, Firecracker: compute-sanitizer and ncu read the hardware): racecheck over BDRLN's Mosaic
# GPU kernels with their own barriers (the defaults at 1024 and 768 wide with dropout, and every column sum in SMEM,
# whose accumulators each thread reads and writes), then ncu's counters of the default kernels at 8192 rows.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
D=benchmarks/gpu_scripts/session25
timeout 300 compute-sanitizer --tool racecheck --racecheck-report all python $D/check_bdrln.py \
  "2048x1024:programs=64,bwd_programs=64" "2048x1024:programs=64,bwd_programs=64,bwd_register_sums=0" \
  "2048x768:programs=64,bwd_programs=64" 2>&1 | grep -v Warning | tail -40 > $OUT/racecheck.txt; echo "rc ${PIPESTATUS[0]}" >> $OUT/racecheck.txt
tail -12 $OUT/racecheck.txt
timeout 240 ncu --clock-control none -k regex:bdrln --section SpeedOfLight --section Occupancy --section LaunchStats \
  --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis python $D/check_bdrln.py 8192x768 \
  8192x1024 > $OUT/ncu.txt 2>&1; echo "rc $?" >> $OUT/ncu.txt
grep -c "bdrln" $OUT/ncu.txt; tail -5 $OUT/ncu.txt
