# Session 30, run 3 (H200): the rest of issue 4's operators on main's head by device time, for the close-out table:
# the MLM loss (the XLA reference and the vocabulary-chunked loss; last measured by timed chains in session 5), the
# unfused softmax + dropout, and bias+GELU without dropout (BERT's feed-forward) beside its dropout rows.
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $OUT/gpu.txt
python benchmarks/kernels.py --ops mlm_loss,softmax,bias_gelu --passes fwd+bwd --device-time 20 2>&1 | grep -v Warning | tee $OUT/devtime.txt
