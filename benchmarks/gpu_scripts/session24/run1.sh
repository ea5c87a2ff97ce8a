# Session 24, run 1: the SASS of bias+GELU's Mosaic GPU forward/backward (8192x4096, with and without dropout) and of
# BDRLN's forward (8192x768), to count instructions per element (`dump_sass.sh`, `sass_counts.py`).
bash benchmarks/gpu_scripts/session24/dump_sass.sh "0.1 0" bg_fwd@8192x4096 bg_bwd@8192x4096 ln_fwd@8192x768
