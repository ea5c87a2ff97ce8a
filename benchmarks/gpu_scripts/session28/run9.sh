# Session 28, run 9 (H200): the shipped kernels' structure as copy kernels (structure.py: the same grid, tiles, tiles
# in flight, tile order, loads and stores, an add for the arithmetic), checked against jax.numpy, then timed next to
# the shipped operators with dropout and the floor: is the distance to the floor the structure or the arithmetic?
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
python benchmarks/gpu_scripts/session28/check_structure.py 2>&1 | grep -v Warning | tee $OUT/check.txt
python benchmarks/gpu_scripts/session28/structure.py --rounds 2 2>&1 | grep -v Warning > $OUT/structure.txt
cut -c1-200 $OUT/structure.txt
