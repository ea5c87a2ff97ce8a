#!/bin/bash
# Session 6, run 4: QKV bias inside flash attention (packed), GPU tests, layer timing + profile; then the layer with
# XLA's Triton GEMMs off (cuBLAS everywhere: can XLA fuse the gradient adds into the GEMMs?).
export PYTHONPATH=.
timeout 150 python -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_kernel.py tests/test_gpu.py \
  > $OUT/gpu_tests.txt 2>&1; tail -3 $OUT/gpu_tests.txt
timeout 230 python benchmarks/kernels.py --ops layer --passes fwd+bwd --repeats 3 --profile 5 --top 40 \
  > $OUT/layer_profile.txt 2> $OUT/layer_profile.err
grep "^| layer" $OUT/layer_profile.txt
awk '/kernels of layer large B64 S128 p=0.1 fwd\+bwd pallas/,/^$/' $OUT/layer_profile.txt
XLA_FLAGS=--xla_gpu_enable_triton_gemm=false timeout 180 python benchmarks/kernels.py --ops layer --passes fwd+bwd \
  --repeats 3 > $OUT/layer_cublas.txt 2> $OUT/layer_cublas.err
grep "^| layer" $OUT/layer_cublas.txt; tail -2 $OUT/layer_cublas.err
