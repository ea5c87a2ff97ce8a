#!/bin/bash
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv > $OUT/a_tests.log
timeout 260 python -m pytest -q -m gpu -p no:cacheprovider tests/ >> $OUT/a_tests.log 2>&1
timeout 200 python benchmarks/kernels.py --ops bias_gelu,bdrln --impls xla,pallas,mgpu --repeats 5 > $OUT/a_mgpu.md 2>$OUT/a_mgpu.err
timeout 120 python benchmarks/kernels.py --ops mlm_loss --repeats 5 > $OUT/a_mlm.md 2>$OUT/a_mlm.err
