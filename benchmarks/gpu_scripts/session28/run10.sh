# Session 28, run 10 (H200): bias+GELU's structure with its output stored from registers straight to GMEM (no SMEM
# staging or TMA store), against run 9's (3-9% behind the floor): a lead for bias+GELU at 16384x4096 (2.1 us short)?
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
python benchmarks/gpu_scripts/session28/check_structure.py 2>&1 | grep -v Warning | tee $OUT/check.txt
python benchmarks/gpu_scripts/session28/structure.py --rounds 2 --bdrln "" 2>&1 | grep -v Warning > $OUT/structure.txt
cut -c1-150 $OUT/structure.txt
