# Session 21 run 6: BDRLN device time against a device-time copy probe; then the standard timed-chain table.
export PYTHONPATH=. PYTHONUNBUFFERED=1
python benchmarks/gpu_scripts/session21/ab_rowwise.py --ops bdrln --rates 0.1 --impls triton,mgpu 2>&1 | grep -v Warning | tee $OUT/rowwise.txt
python benchmarks/kernels.py --ops bdrln,bias_gelu --passes fwd+bwd --repeats 5 2>&1 | grep -v Warning | tee $OUT/ops.txt
