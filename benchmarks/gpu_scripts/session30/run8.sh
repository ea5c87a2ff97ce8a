# Session 30, run 8 (H200): the MLM loss at the model's padded vocabulary (30528 table rows, vocab_size 30522).
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=. PYTHONUNBUFFERED=1
python benchmarks/gpu_scripts/session30/mlm_padded.py --rows 1280,5120 2>&1 | grep -v Warning | tee $OUT/padded.txt
