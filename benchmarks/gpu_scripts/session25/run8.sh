# Session 25, run 8 (H200): BDRLN's other block fields again under its own barriers (tuned under Pallas' in
# sessions 21-23): tiles in flight and the mask drawn ahead (forward), tiles in flight (backward), with dropout.
S=benchmarks/gpu_scripts/session25/ab_bdrln.py
python $S --rates 0.1 --shapes 8192x1024,32768x1024 \
  --variants "main;max_concurrent_steps=3;fwd_mask_ahead=1;bwd_max_concurrent_steps=3" 2>&1 | grep -v Warning \
  | tee $OUT/ab1024.txt
python $S --rates 0.1 --shapes 8192x768,32768x768 \
  --variants "main;max_concurrent_steps=2;fwd_mask_ahead=0;bwd_max_concurrent_steps=3" 2>&1 | grep -v Warning \
  | tee $OUT/ab768.txt
