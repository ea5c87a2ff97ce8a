#!/bin/bash
# GPU tests of the new defaults (bias_gelu auto -> Mosaic GPU; chunked MLM loss), then the train step A/B against
# 7a4f69e (same code with Triton bias_gelu), then the encoder layer benchmark.
export PYTHONPATH=.
L=$OUT/a3.log
mkdir -p /tmp/old && tar xzf gpu_run/old.tgz -C /tmp/old
timeout 280 python -m pytest -q -m gpu -p no:cacheprovider -rs tests/test_kernels.py tests/test_mgpu.py tests/test_gpu.py > $OUT/a3_tests.log 2>&1
TS="benchmarks/train_step.py --config large --kernels auto --steps 10 --repeats 3 --warmup 2"
for sb in "128 64" "512 16" "128 64"; do
  set -- $sb
  echo "== new S$1 B$2" >> $L; timeout 100 python $TS --seq-len $1 --batch-size $2 >> $L 2>>$OUT/a3.err
  echo "== old S$1 B$2" >> $L; (cd /tmp/old && PYTHONPATH=. timeout 100 python $TS --seq-len $1 --batch-size $2) >> $L 2>>$OUT/a3.err
done
timeout 150 python benchmarks/kernels.py --ops layer --repeats 5 > $OUT/a3_layer.md 2>>$OUT/a3.err
grep -v "^\s*$" $OUT/a3.err | grep -v Deprecat | tail -c 3000 > $OUT/a3_err_tail.txt
