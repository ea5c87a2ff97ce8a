# Session 24, run 2 (H200): bias+GELU's Mosaic GPU z-form (rcp.approx.ftz) compiled: its GPU tests, its SASS, then
# the alternating A/B against session 23's kernels.
python -m pytest -q -m gpu tests/test_mgpu.py -k "bias_gelu" 2>&1 | tail -3 | tee $OUT/tests.txt
bash benchmarks/gpu_scripts/session24/dump_sass.sh "0.1 0" bg_fwd@8192x4096 bg_bwd@8192x4096
python benchmarks/gpu_scripts/session24/ab_gelu_z.py --rounds 3 2>&1 | grep -v Warning | tee $OUT/ab_gelu_z.txt
