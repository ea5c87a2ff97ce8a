# Session 21 run 1: the compiled tests of BDRLN's Mosaic GPU kernels (pair mask) and the auto backend, then the A/B.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=benchmarks/gpu_scripts/session21/ab_bdrln.py
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
python -m pytest -q -m gpu tests/test_mgpu.py -p no:warnings 2>&1 | tail -5 > $OUT/tests_mgpu.txt
cat $OUT/tests_mgpu.txt
for round in 1 2; do
  python $S --mask element --reduce three 2>&1 | grep -v Warning | tee -a $OUT/ab.txt
  python $S --mask pair --reduce one 2>&1 | grep -v Warning | tee -a $OUT/ab.txt
done
