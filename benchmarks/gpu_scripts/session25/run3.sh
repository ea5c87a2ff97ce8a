# Session 25, run 3: BDRLN's Mosaic GPU kernels with their own barriers (`Blocks.auto_barriers=False`: one
# warpgroup barrier per step instead of Pallas' around every store and before every TMA fetch): the compiled BDRLN
# tests (both forms), ptxas' registers and the SASS of both forms, then the fwd+bwd A/B.
python -m pytest -q -m gpu tests/test_mgpu.py -k bdrln 2>&1 | tail -2 | tee $OUT/tests.txt
bash benchmarks/gpu_scripts/session24/dump_sass.sh "0.1" ln_bwd@8192x1024 ln_bwd@8192x1024:auto_barriers=0 \
  ln_bwd@8192x768 ln_bwd@8192x768:auto_barriers=0 ln_fwd@8192x768 ln_fwd@8192x768:auto_barriers=0 \
  ln_fwd@8192x1024 ln_fwd@8192x1024:auto_barriers=0
python benchmarks/gpu_scripts/session25/ab_bdrln.py --rates 0.1,0 \
  --shapes 8192x768,8192x1024,16384x768,16384x1024,32768x768,32768x1024 --variants "main;auto_barriers=0" \
  2>&1 | grep -v Warning | tee $OUT/ab.txt
