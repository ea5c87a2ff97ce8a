"""The train step with the MLM loss on the chunked XLA loss (`--mlm chunked`: `ops.TABLE` patched for this process,
the `pallas` row before session 30) or on the fused Pallas kernels (`--mlm fused`, main's table); every other flag is
benchmarks/train_step.py's.

    PYTHONPATH=. python benchmarks/gpu_scripts/session30/step_ab.py --mlm chunked --config large --kernels pallas
"""
import sys

from jaxformer import ops
from pallas_kernels import mlm_loss

which = sys.argv[sys.argv.index("--mlm") + 1]
del sys.argv[sys.argv.index("--mlm"):sys.argv.index("--mlm") + 2]
if which == "chunked":
    ops.TABLE["mlm_cross_entropy"]["pallas"] = mlm_loss.mlm_cross_entropy_chunked
elif which != "fused":
    raise SystemExit(f"--mlm {which!r} must be chunked or fused")
sys.path.insert(0, "benchmarks")
import train_step  # noqa: E402

print(f"# mlm: {which}", flush=True)
train_step.main()
