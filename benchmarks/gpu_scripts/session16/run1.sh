#!/bin/bash
# Session 16, run 1 (prepared in session 15 as next_gemm_ab1.sh, run as written on one H200): should `--xla-gemm auto` mean cuBLAS? Session 15 measured
# cuBLAS-only GEMMs (+ the Q/K/V bias in their epilogue) faster at S=512 with the kernels, but across machine
# sessions. Part 1 (one H200, ~8 min): BERT-large --kernels pallas, alternating in one machine session: S=512 B16
# auto / cublas / auto / cublas, then S=128 B64 auto / cublas / cublas with the bias not folded into the flash
# kernels (step_ab.py nofold: the epilogue adds it instead). Part 2: next_gemm_ab2.sh.
export PYTHONPATH=.
A="benchmarks/gpu_scripts/session15/step_ab.py"
T="--config large --kernels pallas --steps 10 --repeats 3 --warmup 2"
show() { grep -v "^ *$" $1 | grep -iv "warn" | tail -1 | python -c "import json,sys; d=json.loads(sys.stdin.read()); print({k: d[k] for k in ('seq_len','ms_per_step','seq_per_s','spread_ms','peak_memory_gib')})"; }
i=0
for run in "512 16 base auto" "512 16 base cublas" "512 16 base auto" "512 16 base cublas" \
           "128 64 base auto" "128 64 base cublas" "128 64 nofold cublas"; do
  set -- $run; i=$((i+1))
  timeout 85 python $A $3 $T --seq-len $1 --batch-size $2 --xla-gemm $4 > $OUT/step${i}_S$1_$3_$4.log 2>&1
  echo "S$1 $3 $4 rc $?"; show $OUT/step${i}_S$1_$3_$4.log
done
