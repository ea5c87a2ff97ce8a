#!/bin/bash
export PYTHONPATH=.
L=$OUT/b3.log
T="timeout 150"
TS="python benchmarks/train_step.py --config large --steps 10 --repeats 3 --warmup 2"
echo "== pipeline=2 m4 pallas remat none S128 B128" >> $L
$T $TS --seq-len 128 --batch-size 128 --mesh pipeline=2 --microbatches 4 --kernels pallas >> $L 2>$OUT/err3.txt
echo "== pipeline=2 m4 v2 pallas remat full S128 B128" >> $L
$T $TS --seq-len 128 --batch-size 128 --mesh pipeline=2 --microbatches 4 --pipeline-repeats 2 --kernels pallas --remat full >> $L 2>>$OUT/err3.txt
echo "== pipeline=2 m4 pallas remat full S512 B32" >> $L
$T $TS --seq-len 512 --batch-size 32 --mesh pipeline=2 --microbatches 4 --kernels pallas --remat full >> $L 2>>$OUT/err3.txt
echo "== 1 GPU S512 B32" >> $L; CUDA_VISIBLE_DEVICES=0 $T $TS --seq-len 512 --batch-size 32 --kernels auto >> $L 2>>$OUT/err3.txt
echo "== data=2 S512 B64" >> $L; $T $TS --seq-len 512 --batch-size 64 --mesh data=2 --kernels auto >> $L 2>>$OUT/err3.txt
# Multi-process on GPUs: one process per GPU (jax.distributed, NCCL) against one process driving both GPUs.
W=/tmp/mp; rm -rf $W; mkdir -p $W
A="--config large --batch-size 128 --steps 30 --dropout 0 --mesh data=2 --log-every 5 --eval-every 1000 --save-every 1000 --no-progress"
echo "== train.py one process, 2 GPUs" >> $L
( time timeout 240 python train.py $A --out $W/single ) > $W/single.log 2>&1
tail -n 12 $W/single.log >> $L
PORT=12355
echo "== train.py two processes, 1 GPU each" >> $L
for i in 0 1; do
  CUDA_VISIBLE_DEVICES=$i timeout 240 python train.py $A --vocab $W/single/tokenizer.json --out $W/multi \
    --coordinator localhost:$PORT --num-processes 2 --process-id $i > $W/multi$i.log 2>&1 &
done
wait
tail -n 12 $W/multi0.log >> $L; echo "-- process 1 log tail" >> $L; tail -n 5 $W/multi1.log >> $L
python - >> $L <<'PY'
import json
g = [json.loads(l) for l in open("/tmp/mp/multi/metrics.jsonl")]
w = [json.loads(l) for l in open("/tmp/mp/single/metrics.jsonl")]
for a, b in zip(g, w):
    if "loss" in b:
        print("step", b["step"], "single", b["loss"], b["seq_per_s"], "multi", a.get("loss"), a.get("seq_per_s"), "diff", abs(a.get("loss", 0) - b["loss"]))
PY
cp $W/single.log $OUT/single.log; cp $W/multi0.log $OUT/multi0.log
grep -v "^\s*$" $OUT/err3.txt | tail -c 3000 > $OUT/err3_tail.txt
