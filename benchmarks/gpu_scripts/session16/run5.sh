#!/bin/bash
# Session 16, run 5 (one H200): after `xla_gemm="auto"` became cuBLAS on one device and the bias+GELU Mosaic GPU mask
# became the pair form. (a) The README table with the defaults (no --xla-gemm flag): BERT-large train step, --kernels
# pallas and xla, S=128 B64 and S=512 B16. (b) bias+GELU p=0.1 fwd+bwd at the three shapes, Mosaic GPU vs XLA.
export PYTHONPATH=.
show() { grep -v "^ *$" $1 | grep -iv "warn" | tail -1 | python -c "import json,sys; d=json.loads(sys.stdin.read()); print({k: d[k] for k in ('kernels','seq_len','ms_per_step','seq_per_s','spread_ms','peak_memory_gib','loss','compiler_options','compile_s')})"; }
i=0
for run in "pallas 128 64" "pallas 512 16" "xla 128 64" "xla 512 16"; do
  set -- $run; i=$((i+1))
  timeout 140 python benchmarks/train_step.py --config large --kernels $1 --seq-len $2 --batch-size $3 \
    --steps 10 --repeats 3 --warmup 2 > $OUT/step${i}_$1_S$2.log 2>&1
  echo "$1 S$2 rc $?"; show $OUT/step${i}_$1_S$2.log
done
timeout 200 python benchmarks/kernels.py --ops bias_gelu --only p=0.1 --passes fwd+bwd --impls mgpu --repeats 5 2>&1 \
  | grep -E "^#|mgpu" | grep -v warn
