#!/bin/bash
# Session 10 run 5 (H200): run 4 showed the single (3, D) reduction followed by three slice copies; now the three
# slots are summed separately from the one (G, 3, D) array (parts.patch). Compiled BDRLN tests, then per-kernel device
# time, this tree vs the tree before parts.patch.
export PYTHONPATH=.
timeout 150 python -m pytest -q -m gpu tests/test_kernels.py tests/test_mgpu.py -k "bdrln" 2>&1 | tail -1
rm -rf /tmp/old && cp -r . /tmp/old && (cd /tmp/old && patch -s -p1 -R < benchmarks/gpu_scripts/session10/parts.patch)
for shape in "8192x768 p=0.1" "8192x768 p=0.0"; do
  for tree in . /tmp/old; do
    (cd $tree && PYTHONPATH=. timeout 100 python benchmarks/kernels.py --ops bdrln --only "$shape" --passes fwd+bwd \
        --impls pallas --repeats 5 --profile 50 --top 7 2>/dev/null | grep -v "^ *$\|^|---\|| op \|xla\|fusion_\|softmax" \
        | sed "s|^|$tree |")
  done
done
