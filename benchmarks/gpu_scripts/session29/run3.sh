# Session 29, run 3: the embedding kernels' GPU tests on the new default blocks (32 batch rows per backward program,
# prefetch), then BERT-large's train step (B64 S128, --kernels pallas) with the embedding block on XLA's fusion and
# on its fused kernels, alternating (xla, pallas, xla, pallas), each 10 steps x 3 repeats after 2 warm-up steps.
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
python -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels.py -k embedding 2>&1 | tail -3 | tee $OUT/tests.txt
for round in 1 2; do
  for emb in xla pallas; do
    python benchmarks/gpu_scripts/session29/step_ab.py --embedding $emb --config large --kernels pallas --seq-len 128 \
      --batch-size 64 --steps 10 --repeats 3 --warmup 2 2>&1 | grep -v Warning | tee -a $OUT/step.txt
  done
done
