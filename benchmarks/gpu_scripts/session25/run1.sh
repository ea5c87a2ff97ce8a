# Session 25, run 1: BDRLN's Mosaic GPU kernels with their (D,) parameters re-read every step (`fwd_param_reload`,
# `bwd_param_reload`): the compiled BDRLN tests, ptxas' registers per variant, then the fwd+bwd A/B with dropout.
python -m pytest -q -m gpu tests/test_mgpu.py -k bdrln 2>&1 | tail -2 | tee $OUT/tests.txt
bash benchmarks/gpu_scripts/session24/dump_sass.sh "0.1" ln_bwd@8192x1024 ln_bwd@8192x1024:bwd_param_reload=1 \
  ln_bwd@8192x1024:bwd_param_reload=1,bwd_register_sums=2 ln_bwd@8192x1024:bwd_param_reload=1,bwd_register_sums=3 \
  ln_bwd@8192x768 ln_bwd@8192x768:bwd_param_reload=1 ln_fwd@8192x768 ln_fwd@8192x768:fwd_param_reload=1
S=benchmarks/gpu_scripts/session25/ab_bdrln.py
python $S --rates 0.1 --shapes 8192x1024,32768x1024 --variants \
  "main;bwd_param_reload=1;bwd_param_reload=1,bwd_register_sums=2;bwd_param_reload=1,bwd_register_sums=3;fwd_param_reload=1" \
  2>&1 | grep -v Warning | tee $OUT/ab1024.txt
python $S --rates 0.1 --shapes 8192x768,32768x768 --variants "main;bwd_param_reload=1;fwd_param_reload=1" \
  2>&1 | grep -v Warning | tee $OUT/ab768.txt
