#!/bin/bash
# Session 14 run 4 (one H200): the README's measured table at the shipped code (2dd72d6's library): BERT-large train
# step with --kernels xla at S=128 B64 and S=512 B16 (the xla column was session 12's code), and --kernels pallas at
# S=512 B16 and S=128 B64 in the same machine session, so the kernel/XLA ratio is one run's.
export PYTHONPATH=.
T="benchmarks/train_step.py --config large --steps 10 --repeats 3 --warmup 2"
show() { grep -v "^ *$" $1 | grep -iv "warn" | tail -1 | python -c "import json,sys; d=json.loads(sys.stdin.read()); print({k: d[k] for k in ('kernels','seq_len','ms_per_step','seq_per_s','spread_ms','compile_s','peak_memory_gib','loss')})"; }
for run in "xla 128 64" "pallas 128 64" "xla 512 16" "pallas 512 16"; do
  set -- $run
  timeout 130 python $T --kernels $1 --seq-len $2 --batch-size $3 > $OUT/$1_S$2.log 2>&1
  echo "$1 S$2 rc $?"; show $OUT/$1_S$2.log
done
