#!/bin/bash
# A/B: the train step before (95154a4: MLM loss on materialised logits) and after (chunked MLM cross-entropy).
export PYTHONPATH=.
L=$OUT/a2.log
mkdir -p /tmp/old && tar xzf gpu_run/old.tgz -C /tmp/old
TS="benchmarks/train_step.py --config large --kernels auto --steps 10 --repeats 3 --warmup 2"
for rep in 1 2; do
for sb in "128 64" "512 16"; do
  set -- $sb
  echo "== new S$1 B$2 (rep $rep)" >> $L; timeout 100 python $TS --seq-len $1 --batch-size $2 >> $L 2>>$OUT/a2.err
  echo "== old S$1 B$2 (rep $rep)" >> $L; (cd /tmp/old && PYTHONPATH=. timeout 100 python $TS --seq-len $1 --batch-size $2) >> $L 2>>$OUT/a2.err
done; done
timeout 150 python benchmarks/kernels.py --ops mlm_loss --repeats 5 > $OUT/a2_mlm.md 2>>$OUT/a2.err
timeout 200 python benchmarks/kernels.py --ops bias_gelu --impls xla,pallas,mgpu --repeats 5 > $OUT/a2_mgpu.md 2>>$OUT/a2.err
grep -v "^\s*$" $OUT/a2.err | grep -v Deprecat | tail -c 3000 > $OUT/a2_err_tail.txt
