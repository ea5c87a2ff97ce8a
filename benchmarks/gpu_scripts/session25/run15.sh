# Session 25, run 15 (H200): ncu's stall reasons (average warps stalled per issued instruction, by reason) of BDRLN's
# default Mosaic GPU kernels at 8192 rows with dropout, where run 13 found each scheduler issuing every ~1.9 cycles.
D=benchmarks/gpu_scripts/session25
timeout 300 ncu --clock-control none -k regex:bdrln \
  --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__issue_active.avg.per_cycle_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum" \
  python $D/check_bdrln.py 8192x768 8192x1024 > $OUT/ncu_stalls.txt 2>&1; echo "rc $?" >> $OUT/ncu_stalls.txt
grep -c "bdrln" $OUT/ncu_stalls.txt; tail -3 $OUT/ncu_stalls.txt
