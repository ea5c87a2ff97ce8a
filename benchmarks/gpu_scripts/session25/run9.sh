# Session 25, run 9 (H200): BDRLN's backward with its bias and LN scale in SMEM (`bwd_params_smem`), which frees 64
# registers per thread at 1024 wide for more register sums: the compiled BDRLN tests (both forms), ptxas' registers,
# then the A/B.
python -m pytest -q -m gpu tests/test_mgpu.py -k bdrln 2>&1 | tail -2 | tee $OUT/tests.txt
bash benchmarks/gpu_scripts/session24/dump_sass.sh "0.1" ln_bwd@8192x1024 ln_bwd@8192x1024:bwd_params_smem=1 \
  ln_bwd@8192x1024:bwd_params_smem=1,bwd_register_sums=2 ln_bwd@8192x1024:bwd_params_smem=1,bwd_register_sums=3 \
  ln_bwd@8192x768 ln_bwd@8192x768:bwd_params_smem=1 > /dev/null
(cd $OUT && tar xzf dumps.tgz && grep -H "Used\|spill" dump_p0.1/*ptxas-v.txt > ptxas.txt; rm -rf dump_p0.1 dumps.tgz)
S=benchmarks/gpu_scripts/session25/ab_bdrln.py
python $S --rates 0.1,0 --shapes 8192x1024,16384x1024,32768x1024 --variants \
  "main;bwd_params_smem=1;bwd_params_smem=1,bwd_register_sums=2;bwd_params_smem=1,bwd_register_sums=3" \
  2>&1 | grep -v Warning | tee $OUT/ab1024.txt
python $S --rates 0.1 --shapes 8192x768,32768x768 --variants "main;bwd_params_smem=1" 2>&1 | grep -v Warning \
  | tee $OUT/ab768.txt
