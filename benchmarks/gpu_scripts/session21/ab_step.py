"""Session 21: a script (the train step) run with BDRLN's partial sums summed as 29c03cd did (three XLA sums) or as
this session's code does (one variadic reduction), or with BDRLN's "auto" backend taking Mosaic GPU from 8192 rows
(`rows8192`; the default takes it from 16384), to A/B the step:

    PYTHONPATH=. python benchmarks/gpu_scripts/session21/ab_step.py MODE benchmarks/train_step.py ARGS...
"""
import runpy
import sys

import pallas_kernels.bias_dropout_residual_layernorm as bdrln
from benchmarks.gpu_scripts.session21.ab_bdrln import _bwd_three

if __name__ == "__main__":
    mode = sys.argv[1]
    if mode not in ("three", "variadic", "rows8192"):
        raise SystemExit(f"mode={mode!r} must be 'three', 'variadic' or 'rows8192'")
    if mode == "three":
        bdrln._op.defvjp(bdrln._fwd, _bwd_three)
    if mode == "rows8192":
        bdrln.MIN_MGPU_ROWS = 8192
    sys.argv = sys.argv[2:]
    runpy.run_path(sys.argv[0], run_name="__main__")
