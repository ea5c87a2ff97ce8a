"""Session 21: a script (the train step) run with BDRLN patched, to A/B the step. MODES, comma-separated:

- `main`: nothing patched (three XLA sums of the partials; Mosaic GPU from 16384 rows, 8192 at 768 wide);
- `variadic`: the partial sums by one variadic `lax.reduce` (64040c5, reverted; run 9 compared it with three sums,
  run 14 had it in both arms);
- `triton8192`: the `"auto"` backend's rule before 9728121, Triton below 16384 rows at every width (run 14's first arm);
- `rows8192`: Mosaic GPU from 8192 rows at every width (run 14's second arm, whose tree had register sums at 768).

    PYTHONPATH=. python benchmarks/gpu_scripts/session21/ab_step.py MODES benchmarks/train_step.py ARGS...
"""
import runpy
import sys

import pallas_kernels.bias_dropout_residual_layernorm as bdrln
from benchmarks.gpu_scripts.session21.ab_bdrln import SUMS, _bwd_summed_by

if __name__ == "__main__":
    modes = sys.argv[1].split(",")
    unknown = set(modes) - {"main", "variadic", "triton8192", "rows8192"}
    if unknown:
        raise SystemExit(f"modes {sorted(unknown)} must be among main, variadic, triton8192, rows8192")
    if "variadic" in modes:
        bdrln._op.defvjp(bdrln._fwd, _bwd_summed_by(SUMS["variadic"]))
    if "triton8192" in modes:
        bdrln.MIN_MGPU_ROWS_REGISTER_SUMS = bdrln.MIN_MGPU_ROWS
    if "rows8192" in modes:
        bdrln.MIN_MGPU_ROWS = bdrln.MIN_MGPU_ROWS_REGISTER_SUMS = 8192
    sys.argv = sys.argv[2:]
    runpy.run_path(sys.argv[0], run_name="__main__")
