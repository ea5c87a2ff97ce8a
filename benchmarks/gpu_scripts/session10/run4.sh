#!/bin/bash
# Session 10 run 4 (H200): run 3's timed A/B was inside the run's noise (copy bandwidth 2537-3357 GB/s within it), so
# the device time of each kernel per call, profiled (kernels.py --profile), this tree vs the tree before parts_v1.patch.
export PYTHONPATH=.
rm -rf /tmp/old && cp -r . /tmp/old && (cd /tmp/old && patch -s -p1 -R < benchmarks/gpu_scripts/session10/parts_v1.patch)
for shape in "8192x768 p=0.1" "8192x1024 p=0.1" "8192x768 p=0.0"; do
  for tree in . /tmp/old; do
    (cd $tree && PYTHONPATH=. timeout 100 python benchmarks/kernels.py --ops bdrln --only "$shape" --passes fwd+bwd \
        --impls pallas --repeats 5 --profile 50 --top 6 2>/dev/null | grep -v "^ *$\|^|---\|| op \|xla" \
        | sed "s|^|$tree |")
  done
done
