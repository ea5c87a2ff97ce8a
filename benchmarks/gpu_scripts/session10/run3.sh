#!/bin/bash
# Session 10 run 3 (H200): BDRLN's backward writes its d_scale/d_shift/d_bias partial sums as one (G, 3, D) array
# (parts_v1.patch): compiled tests (Triton and Mosaic GPU kernels, the model), then fwd+bwd and the train step against
# the tree before the change (this tree with parts_v1.patch reversed, in /tmp/old), alternately.
export PYTHONPATH=.
timeout 200 python -m pytest -q tests/test_kernels.py tests/test_mgpu.py -k "bdrln or layer_norm or pallas_equals" \
    2>&1 | tail -2
rm -rf /tmp/old && cp -r . /tmp/old && (cd /tmp/old && patch -s -p1 -R < benchmarks/gpu_scripts/session10/parts_v1.patch)
bench() {  # $1: tree
  (cd $1 && PYTHONPATH=. timeout 100 python benchmarks/kernels.py --ops bdrln --only "$2" --passes fwd+bwd \
      --impls pallas --repeats 5 2>/dev/null | grep "| pallas\|copy bandwidth" | sed "s|^|$1 |")
}
for shape in "8192x768 p=0.1" "8192x1024 p=0.1"; do
  for tree in . /tmp/old . /tmp/old; do bench $tree "$shape"; done
done
for tree in . /tmp/old; do
  (cd $tree && PYTHONPATH=. timeout 150 python benchmarks/train_step.py --config large --seq-len 128 --batch-size 64 \
      --kernels auto --steps 10 --repeats 3 --warmup 2 2>/dev/null | tail -2 | sed "s|^|$tree |")
done
