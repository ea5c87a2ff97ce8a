# Session 21 run 3: device time per kernel: three sums / their stack / one variadic reduce; Triton rows per program.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=benchmarks/gpu_scripts/session21/ab_bdrln.py
for r in three variadic stack; do
  python $S --mask pair --reduce $r --rpp 16,32,64 --profile 20 2>&1 | grep -v Warning >> $OUT/profile.txt
done
python $S --mask pair --reduce variadic --rpp 16,32,64 --rates 0,0.1 2>&1 | grep -v Warning | tee $OUT/chains.txt
