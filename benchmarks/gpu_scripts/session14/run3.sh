#!/bin/bash
# Session 14 run 3 (one H200): the loop's stacked-parameter gradients, train step BERT-large S=128 B64, Pallas kernels.
# Run 2's HLO showed the 24-way concatenates are fused into the AdamW update (~3.9 TB/s: not slow) and, a second
# time, into the gradient norm's reduction (input_reduce_fusion, 1.34 ms at ~0.5 TB/s over rows that straddle layers).
# Variants (run from the tree with both patches applied; the others are copies with patches reverted):
#   base: as shipped (2dd72d6); bar: concat_barrier.patch (the concatenate materialised behind an optimization
#   barrier, so norm and AdamW read one plain array); norm: norm_rows.patch (global norm summed per layer row
#   first); both: the two patches.
export PYTHONPATH=.
D=benchmarks/gpu_scripts/session14
for v in base bar norm both; do rm -rf /tmp/$v; mkdir /tmp/$v; cp -r . /tmp/$v/; done
# tmp_model_base.py / tmp_steps_base.py: `git show 2dd72d6:jaxformer/{model,steps}.py` (the device tree has no .git)
cp tmp_model_base.py /tmp/base/jaxformer/model.py; cp tmp_steps_base.py /tmp/base/jaxformer/steps.py
cp tmp_steps_base.py /tmp/bar/jaxformer/steps.py; cp tmp_model_base.py /tmp/norm/jaxformer/model.py
grep -c "_unstack\|_global_norm" /tmp/{base,bar,norm,both}/jaxformer/{model,steps}.py
T="benchmarks/train_step.py --config large --kernels pallas --steps 10 --repeats 3 --warmup 2"
show() { grep -v "^ *$" $1 | grep -iv "warn" | tail -1 | python -c "import json,sys; d=json.loads(sys.stdin.read()); print({k: d[k] for k in ('seq_len','ms_per_step','seq_per_s','spread_ms','compile_s','peak_memory_gib','loss')})"; }
for v in base both bar norm base both; do
  (cd /tmp/$v && timeout 110 python $T --seq-len 128 --batch-size 64 > $OUT/cur.log 2>&1)
  echo "S128 $v rc $?"; show $OUT/cur.log; cat $OUT/cur.log >> $OUT/ab_S128_$v.log
done
rm $OUT/cur.log
