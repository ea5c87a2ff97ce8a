#!/bin/bash
# Session 15 run 4 (one H200): run 3 with XLA's Triton GEMMs off (--xla-gemm cublas: every GEMM a cuBLAS(Lt) call, which
# the bias epilogue needs): S=512 B16 add2d+cublas (stop unless the Q/K/V bias lands in an epilogue), base (default
# GEMMs), add2d+cublas again.
export PYTHONPATH=.
A="benchmarks/gpu_scripts/session15/step_ab.py"
T="--config large --kernels pallas --steps 10 --repeats 3 --warmup 2"
show() { grep -v "^ *$" $1 | grep -iv "warn" | tail -1 | python -c "import json,sys; d=json.loads(sys.stdin.read()); print({k: d[k] for k in ('seq_len','ms_per_step','seq_per_s','spread_ms','peak_memory_gib','loss')})"; }
i=0
for run in "512 16 add2d cublas" "512 16 base auto" "512 16 add2d cublas"; do
  set -- $run; i=$((i+1))
  timeout 110 python $A $3 $T --seq-len $1 --batch-size $2 --xla-gemm $4 --dump-hlo /tmp/hlo_$1_$3.txt > $OUT/step${i}_S$1_$3.log 2>&1
  echo "S$1 $3 rc $?"; show $OUT/step${i}_S$1_$3.log
  grep -o '"epilogue":"[A-Z_]*"' /tmp/hlo_$1_$3.txt | sort | uniq -c
  if [ $i = 1 ] && [ "$(grep -c '"epilogue":"BIAS"' /tmp/hlo_$1_$3.txt)" -le 1 ]; then
    echo "no Q/K/V bias in an epilogue: stop"; grep -m2 -B6 -A1 "ROOT.*add.*bf16\[8192,3072\]" /tmp/hlo_$1_$3.txt | cut -c1-300; exit 0; fi
done
