# Session 30, run 9 (H200): run 8 at the table size the model stores (BertConfig.padded_vocab_size: 30592 rows).
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=. PYTHONUNBUFFERED=1
python benchmarks/gpu_scripts/session30/mlm_padded.py --rows 1280,5120 --vocab 30592 2>&1 | grep -v Warning | tee $OUT/padded.txt
