# Session 26, run 6 (H200): each BDRLN Mosaic GPU kernel alone, caches flushed before it (ncu's default), contiguous
# against round-robin tiles, three times each, with dropout: run 5's back-to-back timings moved each kernel with the
# other's tile order too (what the last kernel left in L2), so this separates the kernels.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
S=benchmarks/gpu_scripts/session25
specs=""
for shape in 8192x768 16384x768 8192x1024 16384x1024 32768x1024; do
  for r in 1 2 3; do specs="$specs $shape $shape:fwd_interleave=1,bwd_interleave=1"; done
done
timeout 400 ncu --clock-control none -k regex:bdrln --metrics gpu__time_duration.sum \
  python $S/check_bdrln.py $specs > $OUT/ncu_times.txt 2>&1; echo "rc $?" >> $OUT/ncu_times.txt
grep -E "^[0-9]+x[0-9]+|gpu__time_duration|bdrln_(fwd|bwd)" $OUT/ncu_times.txt | head -5; tail -2 $OUT/ncu_times.txt
