# Session 25, run 5 (H100): BDRLN's default now takes its own barriers; the compiled BDRLN Mosaic GPU tests (both
# forms), then main against Pallas' barriers (`auto_barriers=1`), alternating, with dropout.
python -m pytest -q -m gpu tests/test_mgpu.py -k bdrln 2>&1 | tail -2 | tee $OUT/tests.txt
python benchmarks/gpu_scripts/session25/ab_bdrln.py --rates 0.1 \
  --shapes 8192x768,8192x1024,16384x768,16384x1024,32768x768,32768x1024 --variants "main;auto_barriers=1" \
  2>&1 | grep -v Warning | tee $OUT/ab.txt
