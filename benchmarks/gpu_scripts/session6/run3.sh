#!/bin/bash
# Session 6, run 3: packed-qkv flash attention compiled on the GPU (tests), block sizes round 2, the layer again.
export PYTHONPATH=.
timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_kernel.py tests/test_gpu.py \
  > $OUT/gpu_tests.txt 2>&1; tail -15 $OUT/gpu_tests.txt
timeout 150 python benchmarks/gpu_scripts/session6/flash_tune.py > $OUT/flash_tune2.txt 2> $OUT/flash_tune2.err
cat $OUT/flash_tune2.txt; tail -3 $OUT/flash_tune2.err
timeout 230 python benchmarks/kernels.py --ops layer --passes fwd+bwd --repeats 3 --profile 5 --top 30 \
  > $OUT/layer_profile.txt 2> $OUT/layer_profile.err
grep "^| layer" $OUT/layer_profile.txt; grep -B2 -A22 "kernels of layer.*pallas" $OUT/layer_profile.txt | head -60
