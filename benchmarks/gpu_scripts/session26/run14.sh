# Session 26, run 14 (H200): the standard BDRLN benchmark with `device_time` compiling only the outputs a step
# computes (`_new_outputs`: no copy of a passed-through argument, nor of d_residual = dx without dropout), fwd and
# fwd+bwd, both rates.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
python benchmarks/kernels.py --ops bdrln --passes fwd,fwd+bwd --device-time 20 2>&1 | grep -v Warning | tee $OUT/bdrln.txt
