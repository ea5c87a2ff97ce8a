# Session 29, run 7 (H200): the final tree: tests/test_gpu.py (BERT-large forward + gradient in bf16 with the default
# kernels, the fused embedding block included), then the README's train-step table (BERT-large, --kernels xla and
# pallas, S=128 B64 and S=512 B16, 10 steps x 3 repeats after 2 warm-up steps).
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
python -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py 2>&1 | tail -3 | tee $OUT/tests.txt
for s_b in "128 64" "512 16"; do
  set -- $s_b
  for k in xla pallas; do
    python benchmarks/train_step.py --config large --kernels $k --seq-len $1 --batch-size $2 --steps 10 --repeats 3 \
      --warmup 2 2>&1 | grep -v Warning | grep '^{' | tee -a $OUT/step.txt
  done
done
