# Session 22, run 6: bias+GELU's Mosaic GPU defaults (approx_math, 1 row of 4096 per forward step with dropout, 3
# backward steps in flight): compiled tests, device time, then BERT-large's train step at S = 128 and 512.
python -m pytest -q -m gpu tests/test_mgpu.py tests/test_kernels.py tests/test_autotune.py 2>&1 | tail -3 | tee $OUT/tests.txt
python benchmarks/gpu_scripts/session22/ab_approx.py 2>&1 | grep -v Warning | tee $OUT/approx.txt
for a in "128 64" "512 16"; do set -- $a
  python benchmarks/train_step.py --config large --kernels pallas --seq-len $1 --batch-size $2 --steps 10 --repeats 3 --warmup 2 2>&1 | grep -v Warning | tail -1 | tee -a $OUT/step.txt
done
