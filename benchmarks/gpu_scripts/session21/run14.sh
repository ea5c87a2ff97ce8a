# Session 21 run 14: BERT-base's step with BDRLN on Mosaic GPU at 8192 rows or not (alternating); BDRLN device time.
export PYTHONPATH=. PYTHONUNBUFFERED=1
A="benchmarks/train_step.py --config base --kernels pallas --seq-len 128 --batch-size 64 --steps 10 --repeats 3 --warmup 2"
for round in 1 2; do
  for mode in variadic rows8192; do
    echo "== $mode round $round" | tee -a $OUT/step_ab.txt
    python benchmarks/gpu_scripts/session21/ab_step.py $mode $A 2>&1 | grep -v Warning | tail -1 | tee -a $OUT/step_ab.txt
  done
done
python benchmarks/gpu_scripts/session21/ab_rowwise.py --ops bdrln --impls triton,mgpu 2>&1 | grep -v Warning | tee $OUT/rowwise.txt
