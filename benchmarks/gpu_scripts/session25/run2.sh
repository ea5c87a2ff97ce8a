# Session 25, run 2: run 1's A/Bs again (run 1's script parsed --rounds as a string and stopped before timing).
S=benchmarks/gpu_scripts/session25/ab_bdrln.py
python $S --rates 0.1 --shapes 8192x1024,32768x1024 --variants \
  "main;bwd_param_reload=1;bwd_param_reload=1,bwd_register_sums=2;bwd_param_reload=1,bwd_register_sums=3;fwd_param_reload=1" \
  2>&1 | grep -v Warning | tee $OUT/ab1024.txt
python $S --rates 0.1 --shapes 8192x768,32768x768 --variants "main;bwd_param_reload=1;fwd_param_reload=1" \
  2>&1 | grep -v Warning | tee $OUT/ab768.txt
