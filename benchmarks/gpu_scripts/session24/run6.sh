# Session 24, run 6 (H200): the README's BERT-large train-step table on main's head (session 22's run 10 script).
for a in "128 64" "512 16"; do set -- $a
  for k in xla pallas; do
    python benchmarks/train_step.py --config large --kernels $k --seq-len $1 --batch-size $2 --steps 10 --repeats 3 \
      --warmup 2 2>&1 | grep -v Warning | tail -1 | tee -a $OUT/step.txt
  done
done
