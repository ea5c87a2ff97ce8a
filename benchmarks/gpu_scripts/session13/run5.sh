#!/bin/bash
# Session 13 run 5 (one H200): per-kernel device profile of the BERT-large train step with the layer loop, S=128 B64
# and S=512 B16 (Pallas kernels).
export PYTHONPATH=.
for sb in "128 64" "512 16"; do
  set -- $sb
  XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout 240 python benchmarks/gpu_scripts/session13/step_profile.py \
      profile $1 $2 > $OUT/profile_S$1.txt 2>&1
  echo "profile S$1 rc $?"; grep -v "^ *$" $OUT/profile_S$1.txt | grep -v "Warning\|warn" | head -75 | cut -c1-170
done
