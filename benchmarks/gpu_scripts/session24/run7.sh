# Session 24, run 7 (H100): main's head against session 23's bias+GELU kernels, XLA and Triton once per case, two
# rotated rounds (the new default blocks were measured on the H200).
python benchmarks/gpu_scripts/session24/ab_gelu_z.py --rounds 2 2>&1 | grep -v Warning | tee $OUT/ab_gelu_z.txt
