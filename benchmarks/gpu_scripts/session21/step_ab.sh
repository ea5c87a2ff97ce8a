# Session 21: the train step with two BDRLN variants alternating, two rounds (runs 9 and 14; ab_step.py's modes).
#   bash benchmarks/gpu_scripts/session21/step_ab.sh CONFIG MODES_A MODES_B   (writes $OUT/step_ab.txt)
export PYTHONPATH=. PYTHONUNBUFFERED=1
A="benchmarks/train_step.py --config $1 --kernels pallas --seq-len 128 --batch-size 64 --steps 10 --repeats 3 --warmup 2"
for round in 1 2; do
  for mode in "$2" "$3"; do
    echo "== $mode round $round" | tee -a $OUT/step_ab.txt
    python benchmarks/gpu_scripts/session21/ab_step.py $mode $A 2>&1 | grep -v Warning | tail -1 | tee -a $OUT/step_ab.txt
  done
done
