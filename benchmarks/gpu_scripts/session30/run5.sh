# Session 30, run 5 (H200): the fused MLM loss (pallas_kernels/mlm_loss/kernel.py, fused.py) compiled: its gpu-marked
# tests and the whole model's pallas == xla; the operator against XLA and the chunked loss by device time, with two
# tile variants; then BERT-large's train step (S=128 B64, --kernels pallas) with the chunked and the fused MLM loss,
# alternating twice.
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $OUT/gpu.txt
python -m pytest -q -p no:cacheprovider -m gpu tests/test_mlm_loss.py tests/test_gpu.py 2>&1 | tail -4 | tee $OUT/tests.txt
python benchmarks/kernels.py --ops mlm_loss --passes fwd,fwd+bwd --device-time 20 2>&1 | grep -v Warning | tee $OUT/devtime.txt
for round in 1 2; do
  for mlm in chunked fused; do
    python benchmarks/gpu_scripts/session30/step_ab.py --mlm $mlm --config large --kernels pallas --seq-len 128 \
      --batch-size 64 --steps 10 --repeats 3 --warmup 2 2>&1 | grep -v Warning | grep '^{\|^#' | tee -a $OUT/step.txt
  done
done
