#!/bin/bash
# Session 15 run 1 (one GPU): (a) bias+GELU's compiled GPU tests; (b) bias+GELU at p=0 and p=0.1 (the issue's
# "same math with dropout"), Triton and Mosaic GPU against XLA; (c) the train step (BERT-large, pallas) with XLA's
# cuBLASLt GEMMs on (`--xla_gpu_enable_cublaslt=true`, which can put a bias add into the GEMM's epilogue) vs off,
# alternating, at S=512 B16 (the Q/K/V bias is one XLA pass per layer there) and S=128 B64; HLO grepped for
# cuBLASLt calls and their epilogues.
export PYTHONPATH=.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python -c "import jax; print('jax', jax.__version__, jax.devices())"
T="benchmarks/train_step.py --config large --kernels pallas --steps 10 --repeats 3 --warmup 2"
show() { grep -v "^ *$" $1 | grep -iv "warn" | tail -1 | python -c "import json,sys; d=json.loads(sys.stdin.read()); print({k: d[k] for k in ('seq_len','ms_per_step','seq_per_s','spread_ms','compile_s','peak_memory_gib')})"; }
for run in "512 16 lt" "512 16 off" "128 64 lt" "128 64 off"; do
  set -- $run
  if [ $3 = lt ]; then F="--xla_gpu_enable_cublaslt=true"; else F=""; fi
  XLA_FLAGS="$F" timeout 120 python $T --seq-len $1 --batch-size $2 --dump-hlo /tmp/hlo_$1_$3.txt > $OUT/step_S$1_$3.log 2>&1
  echo "S$1 $3 rc $?"; show $OUT/step_S$1_$3.log
done
for f in /tmp/hlo_*.txt; do
  echo "== $f: custom-call targets"; grep -o 'custom_call_target="[^"]*"' $f | sort | uniq -c
  grep -o '"epilogue":"[A-Z_]*"' $f | sort | uniq -c
done
timeout 70 python -m pytest -q -m gpu tests/ -k "bias_gelu" -p no:cacheprovider 2>&1 | tail -4
timeout 200 python benchmarks/kernels.py --ops bias_gelu --passes fwd,fwd+bwd --repeats 5 --json $OUT/bias_gelu.json \
  > $OUT/kernels_bias_gelu.log 2>&1; echo "kernels rc $?"; grep -v "^\s*$" $OUT/kernels_bias_gelu.log | grep -iv warn | tail -40
