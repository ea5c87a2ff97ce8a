#!/bin/bash
# Session 8, run 6: the Q/K/V projection's bias folded into flash attention (AIB fused). The attention and model GPU
# tests (packed kernels now with and without the bias), then the train step A/B: bias in the kernels (this code) vs
# added by XLA (xla_bias.py, the code before), alternating, S=128 and S=512.
export PYTHONPATH=.
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
timeout 230 python -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_kernel.py tests/test_gpu.py \
  > $OUT/gpu_tests.txt 2>&1; tail -1 $OUT/gpu_tests.txt; grep "^FAILED" $OUT/gpu_tests.txt | head
step() {  # $1 label, $2 seq, $3 batch, rest: the command prefix
  local label=$1 s=$2 b=$3; shift 3
  timeout 75 "$@" benchmarks/train_step.py --config large --seq-len $s --batch-size $b --kernels auto \
    --steps 10 --repeats 3 --warmup 2 > $OUT/step.json 2> /dev/null
  python -c "import json; d=json.load(open('$OUT/step.json')); print('step', '$label', $s, round(d['ms_per_step'],2), round(d['seq_per_s'],1), d['spread_ms'], round(d['peak_memory_gib'],1))" 2>&1 | tail -1
}
for s in "128 64" "512 16"; do set -- $s
  step fused $1 $2 python
  step xla-bias $1 $2 python benchmarks/gpu_scripts/session8/xla_bias.py
  step fused $1 $2 python
done
