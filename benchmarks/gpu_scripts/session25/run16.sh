# Session 25, run 16 (H200): BDRLN's forward storing y through SMEM and TMA (`fwd_direct_store=0`) now that that form
# also takes the kernel's own barriers (one before the y tile's write, the pipeline's commit after): ncu's long-
# scoreboard stalls may include the direct stores' registers waiting for the store queue. Checked, then the A/B.
D=benchmarks/gpu_scripts/session25
python -m pytest -q -m gpu tests/test_mgpu.py -k bdrln_mgpu_on_gpu 2>&1 | tail -1 | tee $OUT/tests.txt
python $D/check_bdrln.py "8192x768:fwd_direct_store=0" "8192x1024:fwd_direct_store=0" 2>&1 | grep -v Warning \
  | tail -4 | tee $OUT/check.txt
python $D/ab_bdrln.py --rates 0.1 --shapes 8192x768,8192x1024,32768x768,32768x1024 \
  --variants "main;fwd_direct_store=0" 2>&1 | grep -v Warning | tee $OUT/ab.txt
