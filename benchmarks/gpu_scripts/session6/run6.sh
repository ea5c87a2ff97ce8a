#!/bin/bash
# Session 6, run 6 (A/B, code not committed): the QKV bias inside the flash kernels, profiled with and without XLA's
# Triton GEMMs, and its train step. The variant was a copy of the tree in ab_bias/ (pallas_kernels, layouts,
# jaxformer, benchmarks) with run6_apply_bias.py applied: python run6_apply_bias.py ab_bias
cd ab_bias; export PYTHONPATH=.
for g in cublas xla; do
  timeout 120 python benchmarks/kernels.py --ops layer --passes fwd+bwd --repeats 3 --only S128 --xla-gemm $g \
    --profile 5 --top 45 > $OUT/layer_bias_$g.txt 2>&1; grep "^| layer" $OUT/layer_bias_$g.txt
  awk '/kernels of layer large B64 S128 p=0.1 fwd\+bwd pallas/,/^$/' $OUT/layer_bias_$g.txt | head -30
done
for g in xla cublas; do
  timeout 80 python benchmarks/train_step.py --config large --seq-len 128 --batch-size 64 --kernels auto \
    --steps 10 --repeats 3 --warmup 2 --xla-gemm $g > $OUT/step_bias_$g.json 2>/dev/null
  python -c "import json; d=json.load(open('$OUT/step_bias_$g.json')); print('bias-in-kernel 128 $g', round(d['ms_per_step'],2), round(d['seq_per_s'],1), d['spread_ms'])" 2>&1 | tail -1
done
