#!/bin/bash
# Session 16, run 2 (prepared in session 15 as next_gemm_ab2.sh, run as written): part 2 of run1.sh (one H200, ~7 min): the same
# question for --kernels xla (S=128 B64 and S=512 B16, auto / cublas alternating) and S=128 pallas auto / nofold+cublas
# once more. Then, if cuBLAS wins where it is asked, the 2-GPU meshes (distributed-2xh200.md's commands with
# --xla-gemm cublas) before `AUTO_XLA_GEMM` (jaxformer/steps.py) changes, and the README table re-measured.
export PYTHONPATH=.
A="benchmarks/gpu_scripts/session15/step_ab.py"
show() { grep -v "^ *$" $1 | grep -iv "warn" | tail -1 | python -c "import json,sys; d=json.loads(sys.stdin.read()); print({k: d[k] for k in ('kernels','seq_len','ms_per_step','seq_per_s','spread_ms','peak_memory_gib')})"; }
i=0
for run in "xla 128 64 base auto" "xla 128 64 base cublas" "xla 512 16 base auto" "xla 512 16 base cublas" \
           "pallas 128 64 base auto" "pallas 128 64 nofold cublas"; do
  set -- $run; i=$((i+1))
  timeout 85 python $A $4 --config large --kernels $1 --steps 10 --repeats 3 --warmup 2 --seq-len $2 \
    --batch-size $3 --xla-gemm $5 > $OUT/step${i}_$1_S$2_$4_$5.log 2>&1
  echo "$1 S$2 $4 $5 rc $?"; show $OUT/step${i}_$1_S$2_$4_$5.log
done
