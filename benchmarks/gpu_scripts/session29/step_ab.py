"""The train step with the embedding block on XLA's fusion (`--embedding xla`: `ops.TABLE` patched to the reference
for this process) or on its fused kernels (`--embedding pallas`, main's table); every other flag is
benchmarks/train_step.py's.

    PYTHONPATH=. python benchmarks/gpu_scripts/session29/step_ab.py --embedding xla --config large --kernels pallas
"""
import sys

from jaxformer import ops

which = sys.argv[sys.argv.index("--embedding") + 1]
del sys.argv[sys.argv.index("--embedding"):sys.argv.index("--embedding") + 2]
if which == "xla":
    ops.TABLE["embedding_layernorm"]["pallas"] = ops.TABLE["embedding_layernorm"]["xla"]
elif which != "pallas":
    raise SystemExit(f"--embedding {which!r} must be xla or pallas")
sys.path.insert(0, "benchmarks")
import train_step  # noqa: E402

print(f"# embedding: {which}", flush=True)
train_step.main()
