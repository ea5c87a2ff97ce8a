# Session 27, run 5 (H200): where bias+GELU's forward spends its fixed ~4.4 us with dropout (run 4: 9.2 us per 2048
# rows of 4096 plus 4.4, against ~0 fixed without dropout): ncu's warp states and per-instruction samples of the
# forward at 2048 rows (the fixed part ~1/3 of it) and 32768 rows, with and without dropout.
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
S=benchmarks/gpu_scripts/session27
for spec in 2048x4096:0.1 2048x4096:0 32768x4096:0.1; do
  name=${spec/:/_p}
  timeout 150 ncu --clock-control none -k regex:bias_gelu_fwd --section SourceCounters --section WarpStateStats \
    --section SpeedOfLight --section InstructionStats --section LaunchStats -o $OUT/$name python $S/check_gelu.py $spec \
    > $OUT/ncu_log_$name.txt 2>&1
  echo "rc $?" >> $OUT/ncu_log_$name.txt
  ncu -i $OUT/$name.ncu-rep --page source --csv --print-source sass > $OUT/${name}_sass.csv 2>&1
  ncu -i $OUT/$name.ncu-rep --page details >> $OUT/ncu_log_$name.txt 2>&1
  rm -f $OUT/$name.ncu-rep
  python benchmarks/gpu_scripts/session26/sass_stalls.py $OUT/${name}_sass.csv --reason stall_no_instruction --top 4 \
    > $OUT/${name}_stalls.txt 2>&1
done
grep -E "max relative|Duration|Registers|Executed Instructions |No Instruction|Warp Cycles Per Issued" $OUT/ncu_log_*.txt
head -30 $OUT/*_stalls.txt
