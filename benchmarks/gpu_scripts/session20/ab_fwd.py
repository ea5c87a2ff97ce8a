"""Session 20: the persistent Mosaic GPU attention forward (`kernel_mgpu.forward`, `BlockSizes.mgpu_fwd`) against
the Triton forward, the backward the same (the default, Mosaic GPU's), in one process, alternating.

    PYTHONPATH=. python benchmarks/gpu_scripts/session20/ab_fwd.py profile [TEXT]          # device time per kernel
    PYTHONPATH=. python benchmarks/gpu_scripts/session20/ab_fwd.py op [TEXT] [--rounds N] [--warm]  # timed chains
    PYTHONPATH=. python benchmarks/gpu_scripts/session20/ab_fwd.py fwd SCRIPT ARGS...      # SCRIPT with mgpu_fwd on

`--warm`: the chains reuse one copy of the inputs (left in L2 by the previous iteration, as in `profile`'s unchained
calls) instead of rotating copies that together exceed L2 three times (`per_iteration`'s default).
TEXT: only the cases whose label contains it (e.g. "p=0.1"). `fwd SCRIPT ARGS` runs SCRIPT (the layer or the train
step) with `default_block_sizes` turning the Mosaic GPU forward on where it runs, for an A/B against a plain run.
"""
import dataclasses
import pathlib
import runpy
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "session18"))
from ab_mgpu import op_cases  # noqa: E402  (session 18's cases: packed+bias and q/k/v, p = 0.1 and 0)

import pallas_kernels.attention as attn  # noqa: E402
from pallas_kernels.attention import kernel as fk  # noqa: E402


def force_fwd():
    """Make the attention defaults pick the Mosaic GPU forward wherever its backward is picked (same shape rule)."""
    base = fk.default_block_sizes

    def with_fwd(*args, **kwargs):
        blocks = base(*args, **kwargs)
        return dataclasses.replace(blocks, mgpu_fwd=blocks.mgpu_bwd)

    fk.default_block_sizes = attn.default_block_sizes = with_fwd


def main():
    mode = sys.argv[1]
    if mode == "fwd":
        force_fwd()
        sys.argv = sys.argv[2:]
        runpy.run_path(sys.argv[0], run_name="__main__")
        return
    from benchmarks.kernels import copy_bandwidth, per_iteration, profile_kernels
    tr = fk.default_block_sizes(128, 64, dtype=jnp.bfloat16)
    mg = dataclasses.replace(tr, mgpu_fwd=True)
    print(jax.__version__, jax.devices()[0].device_kind, f"default mgpu_bwd={tr.mgpu_bwd}",
          f"SMs={jax.devices()[0].core_count}", flush=True)
    args, rounds = sys.argv[2:], 2
    if "--rounds" in args:
        i = args.index("--rounds")
        rounds, args = int(args[i + 1]), args[:i] + args[i + 2:]
    warm = "--warm" in args
    args = [a for a in args if a != "--warm"]
    only = args[0] if args else ""
    cases = [c for c in op_cases() if only in c[0]]
    if mode == "profile":
        for label, fn, xs, _ in cases:
            for name, blocks in (("mgpu fwd", mg), ("triton fwd", tr)):
                profile_kernels(fn(blocks), xs, 10, 6, f"{label} {name}")
        return
    print(f"copy bandwidth {copy_bandwidth(5) / 1e9:.0f} GB/s", flush=True)
    print(f"inputs {'warm (one copy)' if warm else 'rotated'}", flush=True)
    print("| B64 N16 S128 H64, fwd+bwd | XLA |" + " Triton fwd | Mosaic GPU fwd |" * rounds, flush=True)
    print("|---|---|" + "---|---|" * rounds)
    for label, fn, xs, xla in cases:
        t = [per_iteration(xla, xs, 5, min_bytes=1 if warm else None)]
        for _ in range(rounds):
            for name, blocks in (("triton", tr), ("mgpu", mg)):
                t.append(per_iteration(fn(blocks), xs, 5, min_bytes=1 if warm else None))
                print(f"  {label} {name}: {t[-1] * 1e6:.1f} us", file=sys.stderr, flush=True)
        print(f"| {label} | " + " | ".join(f"{x * 1e6:.1f}" for x in t) + " |", flush=True)


if __name__ == "__main__":
    main()
