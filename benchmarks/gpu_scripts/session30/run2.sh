# Session 30, run 2 (H100): the README's H100 train-step rows on main's head (session 27's predate the fused embedding
# block), then BDRLN and bias+GELU with dropout against XLA and the floor (session 28's floors.py) on this GPU.
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $OUT/gpu.txt
for s in "128 64" "512 16"; do set -- $s
  for k in xla pallas; do
    python benchmarks/train_step.py --config large --kernels $k --seq-len $1 --batch-size $2 --steps 10 --repeats 3 \
      --warmup 2 2>&1 | grep -v Warning | grep "^{" | tee -a $OUT/step.txt
  done
done
python benchmarks/gpu_scripts/session28/floors.py --rounds 2 --rates 0.1 2>&1 | grep -v Warning | tee $OUT/floors.txt
