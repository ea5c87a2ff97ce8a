# Session 26, run 13 (H200): BDRLN's forward with its next tile's dropout carried as float32 factors
# (`Blocks.fwd_ahead_factor`) instead of a boolean mask (run 3's SASS at 768 wide: ~1 P2R and ~1 extra ISETP per
# element packing and unpacking the carried predicates; 28.2 instructions per element against 23.2 at 1024 wide
# without the mask ahead); at 1024 wide with the mask ahead too. Compiled tests first.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
python -m pytest -q -m gpu tests/test_mgpu.py -k bdrln 2>&1 | tail -2 | tee $OUT/tests.txt
python benchmarks/gpu_scripts/session25/ab_bdrln.py --rates 0.1 --rounds 3 \
  --shapes 8192x768,16384x768,32768x768,8192x1024,16384x1024,32768x1024 \
  --variants "main;fwd_ahead_factor=1;fwd_ahead_factor=1,fwd_mask_ahead=1;fwd_mask_ahead=0" 2>&1 | grep -v Warning \
  | tee $OUT/ab.txt
