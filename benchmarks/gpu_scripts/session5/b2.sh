#!/bin/bash
export PYTHONPATH=.
L=$OUT/b2.log
T="timeout 150"
TS="python benchmarks/train_step.py --config large --seq-len 128 --kernels auto --steps 10 --repeats 3 --warmup 2"
echo "== dp_overlap LHS flag" >> $L
XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true $T python benchmarks/dp_overlap.py --dump-hlo $OUT/lhs >> $L 2>$OUT/err2.txt
echo "== dp_overlap grouped, default flags" >> $L
$T python benchmarks/dp_overlap.py --kinds deferred-grouped >> $L 2>>$OUT/err2.txt
echo "== 1 GPU B128" >> $L; CUDA_VISIBLE_DEVICES=0 $T $TS --batch-size 128 >> $L 2>>$OUT/err2.txt
echo "== data=2 B256" >> $L; $T $TS --batch-size 256 --mesh data=2 >> $L 2>>$OUT/err2.txt
echo "== pipeline=2 m4 pallas remat full B128" >> $L
$T $TS --batch-size 128 --mesh pipeline=2 --microbatches 4 --kernels pallas --remat full >> $L 2>>$OUT/err2.txt
grep -v "^\s*$" $OUT/err2.txt | tail -c 4000 > $OUT/err2_tail.txt
