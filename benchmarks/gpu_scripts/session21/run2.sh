# Session 21 run 2: device time per kernel (profiler), the shipped mask/reduction against this session's, alternating.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=benchmarks/gpu_scripts/session21/ab_bdrln.py
for round in 1 2; do
  python $S --mask element --reduce three --profile 20 2>&1 | grep -v Warning >> $OUT/profile.txt
  python $S --mask pair --reduce one --profile 20 2>&1 | grep -v Warning >> $OUT/profile.txt
done
grep -E "^#|kernels of|bdrln|reduce|fusion" $OUT/profile.txt | head -300
