#!/bin/bash
# Session 15 run 2 (one H200): the Q/K/V bias as a bf16 add XLA may fuse into the QKV GEMM's cuBLASLt epilogue
# (step_ab.py), BERT-large train step with the kernels: S=512 B16 base vs bf16add, S=128 B64 base vs unfold; the
# compiled HLO's cuBLASLt epilogues counted.
export PYTHONPATH=.
A="benchmarks/gpu_scripts/session15/step_ab.py"
T="--config large --kernels pallas --steps 10 --repeats 3 --warmup 2"
show() { grep -v "^ *$" $1 | grep -iv "warn" | tail -1 | python -c "import json,sys; d=json.loads(sys.stdin.read()); print({k: d[k] for k in ('seq_len','ms_per_step','seq_per_s','spread_ms','peak_memory_gib','loss')})"; }
for run in "512 16 bf16add" "512 16 base" "128 64 unfold" "128 64 base"; do
  set -- $run
  timeout 110 python $A $3 $T --seq-len $1 --batch-size $2 --dump-hlo /tmp/hlo_$1_$3.txt > $OUT/step_S$1_$3.log 2>&1
  echo "S$1 $3 rc $?"; show $OUT/step_S$1_$3.log
  grep -o '"epilogue":"[A-Z_]*"' /tmp/hlo_$1_$3.txt | sort | uniq -c
  if [ $3 = bf16add ] && [ "$(grep -c '"epilogue":"BIAS"' /tmp/hlo_$1_$3.txt)" -le 1 ]; then
    echo "no Q/K/V bias in an epilogue: stop"; grep -m3 -B2 -A2 "add.*bf16\[16,512,3,16,64\]" /tmp/hlo_$1_$3.txt | cut -c1-400; exit 0; fi
done
