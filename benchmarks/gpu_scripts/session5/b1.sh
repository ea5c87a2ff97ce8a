#!/bin/bash
# Run B1 on nvidia-h200-x2: does XLA overlap a deferred all-reduce? + O2 with the double-buffered loop.
export PYTHONPATH=.
L=$OUT/b1.log
nvidia-smi --query-gpu=name,driver_version --format=csv >> $L
python -c "import jax; print(jax.__version__, jax.devices())" >> $L 2>&1
T="timeout 150"
echo "== dp_overlap default" >> $L; $T python benchmarks/dp_overlap.py --dump-hlo $OUT/dpo >> $L 2>$OUT/err1.txt
echo "== dp_overlap O2" >> $L; $T python benchmarks/dp_overlap.py --opt-level O2 >> $L 2>>$OUT/err1.txt
echo "== dp_overlap 1 GPU batch 64" >> $L; CUDA_VISIBLE_DEVICES=0 $T python benchmarks/dp_overlap.py --batch 64 >> $L 2>>$OUT/err1.txt
echo "== train_step data=2 S128 B128 O2 + double buffer" >> $L
XLA_FLAGS=--xla_gpu_enable_while_loop_unrolling=WHILE_LOOP_UNROLLING_DOUBLE_BUFFER $T python benchmarks/train_step.py \
  --config large --seq-len 128 --batch-size 128 --mesh data=2 --kernels auto --xla-opt-level O2 \
  --steps 10 --repeats 3 --warmup 2 >> $L 2>>$OUT/err1.txt
tail -c 3000 $OUT/err1.txt > $OUT/err1_tail.txt
