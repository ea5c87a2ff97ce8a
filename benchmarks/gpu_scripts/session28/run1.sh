# Session 28, run 1 (H200): the unmet issue-4 targets against an arity floor (XLA's plain elementwise kernels moving
# the operators' bytes in their two launches), with the shipped operators and XLA's fusion in the same process.
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
python benchmarks/gpu_scripts/session28/floors.py --rounds 2 2>&1 | grep -v Warning | tee $OUT/floors.txt
