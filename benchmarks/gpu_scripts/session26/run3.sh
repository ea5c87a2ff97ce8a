# Session 26, run 3 (H200): ncu's per-instruction stall samples (SourceCounters) of BDRLN's Mosaic GPU forward at
# 8192x1024 and 8192x768 with dropout (run 2: the backward now runs at ~85% of the copy rate at 8192 rows, the
# forward at 69-74%).
export XLA_PYTHON_CLIENT_PREALLOCATE=false
S=benchmarks/gpu_scripts/session25
for shape in 8192x1024 8192x768; do
  timeout 200 ncu --clock-control none -k regex:bdrln_fwd --section SourceCounters --section WarpStateStats \
    --section SpeedOfLight -o $OUT/fwd$shape python $S/check_bdrln.py $shape > $OUT/ncu_log$shape.txt 2>&1
  echo "rc $?" >> $OUT/ncu_log$shape.txt
  ncu -i $OUT/fwd$shape.ncu-rep --page source --csv --print-source sass > $OUT/fwd${shape}_sass.csv 2>&1
  ncu -i $OUT/fwd$shape.ncu-rep --page details >> $OUT/ncu_log$shape.txt 2>&1
  rm -f $OUT/fwd$shape.ncu-rep
done
wc -l $OUT/*.csv; grep -E "Duration|Throughput|Warp Cycles|Issued" $OUT/ncu_log*.txt | head -30
