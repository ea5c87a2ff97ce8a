# Session 21 run 9: the train step, BDRLN's partial sums as three XLA sums (29c03cd) or one variadic reduction, alternating.
export PYTHONPATH=. PYTHONUNBUFFERED=1
A="benchmarks/train_step.py --config large --kernels pallas --seq-len 128 --batch-size 64 --steps 10 --repeats 3 --warmup 2"
for round in 1 2; do
  for mode in three variadic; do
    echo "== $mode round $round" | tee -a $OUT/step_ab.txt
    python benchmarks/gpu_scripts/session21/ab_step.py $mode $A 2>&1 | grep -v Warning | tail -1 | tee -a $OUT/step_ab.txt
  done
done
