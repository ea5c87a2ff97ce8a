# Session 27, run 2 (H200): the issue's layer target and the README's train step on main's head (session 26's kernels
# by default; run 1's mask-ahead flags are off by default): the BERT-large encoder layer fwd+bwd (`--ops layer`,
# timed chains as in session 20's part 9), then the train step with the kernels at S = 128 and 512.
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
python benchmarks/kernels.py --ops layer --passes fwd+bwd --repeats 3 2>&1 | grep -v Warning | tee $OUT/layer.txt
for cfg in "128 64" "512 16"; do set -- $cfg
  python benchmarks/train_step.py --config large --kernels pallas --seq-len $1 --batch-size $2 --steps 10 --repeats 3 \
    --warmup 2 2>&1 | grep -v Warning | tail -4 | tee -a $OUT/step.txt
done
