# Session 24, run 13 (H100; sm_90a SASS as on the H200): the SASS of BDRLN's Mosaic GPU backward at 8192x768 and
# 8192x1024, with and without dropout, to count its instructions per element as run 1 did for bias+GELU.
bash benchmarks/gpu_scripts/session24/dump_sass.sh "0.1 0" ln_bwd@8192x768 ln_bwd@8192x1024
