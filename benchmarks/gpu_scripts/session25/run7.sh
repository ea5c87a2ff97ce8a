# Session 25, run 7 (H200, the machine session of run 6): the standard kernel benchmark of BDRLN (XLA, Triton and
# Mosaic GPU in one process, device time), p = 0.1 and 0.
python benchmarks/kernels.py --ops bdrln --passes fwd+bwd --device-time 20 2>&1 | grep -v Warning | tee $OUT/bdrln.txt
