# Session 26, run 4 (H200): BDRLN's Mosaic GPU forward with its tiles dealt round-robin to the programs
# (`Blocks.fwd_interleave`: every program streams through the same window of the arrays) against a contiguous run of
# tiles per program; compiled tests first. Run 3's ncu: the 1024-wide forward waits on its TMA loads in 25% of its
# stall samples.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
S=benchmarks/gpu_scripts/session25
python -m pytest -q -m gpu tests/test_mgpu.py -k bdrln 2>&1 | tail -2 | tee $OUT/tests.txt
python $S/ab_bdrln.py --rates 0.1 --rounds 3 --shapes 8192x768,8192x1024,16384x1024,32768x1024 \
  --variants "main;fwd_interleave=1;fwd_interleave=1,max_concurrent_steps=3" 2>&1 | grep -v Warning | tee $OUT/ab.txt
