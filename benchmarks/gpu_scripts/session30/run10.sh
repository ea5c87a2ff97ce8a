# Session 30, run 10 (H200): the review mend's MLM kernels (the masks from _indices / _tile_mask) compiled: their
# gpu-marked tests (BERT-large's decoder at 1280 rows, rows whole and columns partial, and 1000 rows, both partial).
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=. PYTHONUNBUFFERED=1
python -m pytest -q -p no:cacheprovider -m gpu tests/test_mlm_loss.py 2>&1 | tail -3 | tee $OUT/tests.txt
