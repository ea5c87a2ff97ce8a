# Session 27, run 3 (H200, run 2's machine session and tree): the train step with `--kernels xla`, for run 2's
# speed-ups, then the kernels' S = 512 step once more (its layer time moved in run 2).
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
for cfg in "xla 128 64" "xla 512 16" "pallas 512 16"; do set -- $cfg
  python benchmarks/train_step.py --config large --kernels $1 --seq-len $2 --batch-size $3 --steps 10 --repeats 3 \
    --warmup 2 2>&1 | grep -v Warning | tail -4 | tee -a $OUT/step.txt
done
