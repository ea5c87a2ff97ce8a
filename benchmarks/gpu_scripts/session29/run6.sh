# Session 29, run 6 (H200): BDRLN's backward with its dropout mask drawn twice instead of held in registers across
# the LN reductions (`Blocks.bwd_redraw_mask`): checked against the reference compiled, then A/B against main's
# defaults at the four shapes short of 85%, three rotated rounds.
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
python benchmarks/gpu_scripts/session29/check_redraw.py 2>&1 | grep -v Warning | tail -4 | tee $OUT/check.txt
python benchmarks/gpu_scripts/session25/ab_bdrln.py --shapes 8192x768,8192x1024,16384x768,16384x1024 --rates 0.1 \
  --rounds 3 --variants "main;bwd_redraw_mask=1" 2>&1 | grep -v Warning | tee $OUT/ab.txt
