#!/bin/bash
# Session 6, run 5 (last of the budget): final packed-qkv code compiled on the GPU (tests); the layer with XLA's Triton
# GEMMs off; the train step with xla_gemm=xla vs cublas at S=128 (then S=512 if time is left).
export PYTHONPATH=.
timeout 110 python -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_kernel.py tests/test_gpu.py \
  > $OUT/gpu_tests.txt 2>&1; tail -2 $OUT/gpu_tests.txt
timeout 170 python benchmarks/kernels.py --ops layer --passes fwd+bwd --repeats 3 --xla-gemm cublas \
  > $OUT/layer_cublas.txt 2> $OUT/layer_cublas.err; grep "^| layer\|^#" $OUT/layer_cublas.txt
for s in "128 64" "512 16"; do set -- $s
  for g in xla cublas; do
    timeout 75 python benchmarks/train_step.py --config large --seq-len $1 --batch-size $2 --kernels auto \
      --steps 10 --repeats 3 --warmup 2 --xla-gemm $g > $OUT/step_$1_$g.json 2> $OUT/step_$1_$g.err
    python -c "import json,sys; d=json.load(open('$OUT/step_$1_$g.json')); print('$1 $g', round(d['ms_per_step'],2), round(d['seq_per_s'],1), d['spread_ms'], round(d['peak_memory_gib'],1), d['compiler_options'])" 2>&1 | tail -1
  done
done
