#!/bin/bash
# Session 10 run 12 (H200): run 11 aborted in XLA's cuDNN backward with dropout ("Check failed:
# local_device_ordinal.has_value()", cuda_dnn.cc); cuDNN rows alone, first one plain fwd+bwd, then with XLA's command
# buffers off.
export PYTHONPATH=.
for flags in "" "--xla_gpu_enable_command_buffer="; do
  echo "XLA_FLAGS=$flags"
  XLA_FLAGS=$flags ONLY=cuDNN timeout 200 python benchmarks/gpu_scripts/session10/cudnn_dropout.py > $OUT/out.txt 2>&1
  echo "rc $?"
  grep -v "^    @\|Deprecat\|return rule\|^ *$" $OUT/out.txt | cut -c1-300 | head -14
done
