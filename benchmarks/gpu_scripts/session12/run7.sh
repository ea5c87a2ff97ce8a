#!/bin/bash
# Session 12 run 7 (H200): JAX's own Mosaic GPU flash attention (attention_mgpu: no mask, no dropout, float16) against
# ours at p=0 on the same float16 inputs, forward and forward+backward, S=128 and S=512 (kernels.py's f16 rows):
# the speed bound for a Mosaic GPU version of our kernels. Session 8's attempt ran out of time after one row.
export PYTHONPATH=.
timeout 560 python benchmarks/kernels.py --ops attention --only f16 --impls jax-mgpu-nomask,pallas --repeats 3 \
    > $OUT/kernels.txt 2> $OUT/kernels.err
echo "kernels rc $?"; grep -v "^ *$" $OUT/kernels.txt | grep "|\|copy\|GB/s" | cut -c1-200; tail -3 $OUT/kernels.err | cut -c1-300
