#!/bin/bash
# Session 14 run 1 (one H200): the loop's stacked-parameter gradients, one concatenate (lax.split, commit ea1bcc8) vs
# written layer by layer into one buffer (custom-VJP unstack: zeros + 24 dynamic-update-slices), train step A/B
# alternating, S=128 B64, Pallas kernels; then the new step's profile head.
# The patch under test: session14/unstack_dus_barrier.patch, applied to 2dd72d6 (run 0 = session13/run7.sh, without the
# barrier, lost: 36.04-36.41 vs 35.29-35.80 ms); tmp_model_split.py = `git show 2dd72d6:jaxformer/model.py`, the baseline
# (the device tree has no .git). Also one shipped-code row with XLA's Triton GEMM fusions off.
export PYTHONPATH=.
rm -rf /tmp/old && mkdir /tmp/old && cp -r . /tmp/old/ && cp tmp_model_split.py /tmp/old/jaxformer/model.py
grep -c "_unstack" jaxformer/model.py /tmp/old/jaxformer/model.py
T="benchmarks/train_step.py --config large --kernels pallas --steps 10 --repeats 3 --warmup 2"
show() { grep -v "^ *$" $1 | grep -iv "warn" | tail -1 | python -c "import json,sys; d=json.loads(sys.stdin.read()); print({k: d[k] for k in ('seq_len','ms_per_step','seq_per_s','spread_ms','compile_s','peak_memory_gib','loss')})"; }
for form in split dus split dus; do
  if [ $form = split ]; then dir=/tmp/old; else dir=$PWD; fi
  (cd $dir && timeout 120 python $T --seq-len 128 --batch-size 64 > $OUT/cur.log 2>&1)
  echo "S128 $form rc $?"; show $OUT/cur.log; cat $OUT/cur.log >> $OUT/ab_S128_$form.log
done
rm $OUT/cur.log
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout 150 python benchmarks/gpu_scripts/session13/step_profile.py \
    profile 128 64 2>&1 | grep -v "^ *$" | grep -v "Warning\|warn" | head -24 | cut -c1-120
# XLA's own GEMM choice: Triton GEMM fusions off (cuBLAS for every dot), split baseline, one invocation
(cd /tmp/old && XLA_FLAGS=--xla_gpu_enable_triton_gemm=false timeout 120 python $T --seq-len 128 --batch-size 64 > $OUT/nogemmfusion.log 2>&1)
echo "S128 split triton_gemm=false rc $?"; show $OUT/nogemmfusion.log
