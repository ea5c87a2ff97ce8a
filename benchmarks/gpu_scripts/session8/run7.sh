#!/bin/bash
# Session 8, run 7: fold_bias follows fused_bwd (bias in the kernels at S=128, added by XLA at S=512). Packed GPU tests,
# the operator A/B with per-kernel profiles (bias_fold_ab.py), and the train step at both lengths.
export PYTHONPATH=.
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
timeout 150 python -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_kernel.py -k "packed" \
  > $OUT/gpu_tests.txt 2>&1; tail -1 $OUT/gpu_tests.txt; grep "^FAILED" $OUT/gpu_tests.txt | head
XLA_FLAGS="--xla_gpu_enable_command_buffer=" timeout 200 python benchmarks/gpu_scripts/session8/bias_fold_ab.py > $OUT/bias_fold_ab.txt 2>&1
grep "^|\|^  \|^#\|^[A-Z]" $OUT/bias_fold_ab.txt | head -60
for s in "128 64" "512 16"; do set -- $s
  timeout 75 python benchmarks/train_step.py --config large --seq-len $1 --batch-size $2 --kernels auto \
    --steps 10 --repeats 3 --warmup 2 > $OUT/step_$1.json 2> /dev/null
  python -c "import json; d=json.load(open('$OUT/step_$1.json')); print('step', $1, round(d['ms_per_step'],2), round(d['seq_per_s'],1), d['spread_ms'], round(d['peak_memory_gib'],1))" 2>&1 | tail -1
done
