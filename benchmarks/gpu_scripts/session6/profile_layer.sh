#!/bin/bash
# Session 6, run 1: where the encoder layer's time goes (per-kernel device time), and the S=512 layer row.
set -x
nvidia-smi --query-gpu=name --format=csv,noheader
python -c "import jax; print(jax.__version__, jax.devices())"
export PYTHONPATH=.
timeout 420 python benchmarks/kernels.py --ops layer --passes fwd+bwd --repeats 3 --profile 5 --top 40 \
  > $OUT/layer_profile.txt 2> $OUT/layer_profile.err
tail -5 $OUT/layer_profile.err
timeout 150 python benchmarks/kernels.py --ops attention --passes fwd+bwd --repeats 3 --impls pallas --only "p=0.1" \
  --profile 5 --top 10 > $OUT/attn_profile.txt 2> $OUT/attn_profile.err
cat $OUT/layer_profile.txt $OUT/attn_profile.txt
