# Session 30, run 4 (H200): the Pallas (Triton) GEMM rate at the MLM decoder's shape against cuBLAS, plain and with
# the cross-entropy's partials reduced in registers (gemm_probe.py), before any fused MLM-loss kernel is written.
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $OUT/gpu.txt
python benchmarks/gpu_scripts/session30/gemm_probe.py --rows 1280,5120 2>&1 | grep -v Warning | tee $OUT/gemm.txt
