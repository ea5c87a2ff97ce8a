# Session 22, run 15 (H100): the autotuner choosing the row-wise kernels' backend under "auto": the compiled
# autotune tests, then BDRLN at 32768x1024 with dropout tuned from a fresh cache (session 21-22: Triton 6% faster
# than the rule's Mosaic GPU on the H100 there).
python -m pytest -q -m gpu tests/test_autotune.py 2>&1 | tail -2 | tee $OUT/tests.txt
python benchmarks/gpu_scripts/session22/tune_backend.py --rates 0.1 2>&1 | grep -v Warning | tee $OUT/tune_backend.txt
