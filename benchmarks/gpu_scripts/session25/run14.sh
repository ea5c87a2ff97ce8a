# Session 25, run 14 (H200): BDRLN's forward over exactly 396 programs (3 per SM, which its 167 registers and SMEM
# allow at 768 wide: ncu, run 13) or 264, with uneven runs of tiles (`fwd_exact_programs`), against the default's
# 256: the variants checked against the reference, then the A/B with dropout.
D=benchmarks/gpu_scripts/session25
python $D/check_bdrln.py "8192x768:fwd_exact_programs=1,programs=396" "8192x1024:fwd_exact_programs=1,programs=264" \
  2>&1 | grep -v Warning | tail -4 | tee $OUT/check.txt
python $D/ab_bdrln.py --rates 0.1 --shapes 8192x768,16384x768,32768x768 \
  --variants "main;fwd_exact_programs=1,programs=396;fwd_exact_programs=1,programs=264" 2>&1 | grep -v Warning \
  | tee $OUT/ab768.txt
python $D/ab_bdrln.py --rates 0.1 --shapes 8192x1024,32768x1024 --variants "main;fwd_exact_programs=1,programs=264" \
  2>&1 | grep -v Warning | tee $OUT/ab1024.txt
