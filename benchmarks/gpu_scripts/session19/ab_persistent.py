"""Session 19: the persistent Mosaic GPU attention backward (`kernel_mgpu.py`: one CTA per SM looping over heads, the
next head's inputs loaded while this one computes) against session 18's one-CTA-per-head kernel
(`kernel_mgpu_s18.py` beside this script, the file as it was at 29c44de), in one process, alternating.

    PYTHONPATH=. python benchmarks/gpu_scripts/session19/ab_persistent.py op [TEXT] [--rounds N] [--lengths N1,N2]
    PYTHONPATH=. python benchmarks/gpu_scripts/session19/ab_persistent.py profile [TEXT]          # device time
    PYTHONPATH=. python benchmarks/gpu_scripts/session19/ab_persistent.py profile-fwd [TEXT]      # mgpu_fwd A/B
    PYTHONPATH=. python benchmarks/gpu_scripts/session19/ab_persistent.py once old|new            # one call (dumps)
    PYTHONPATH=. python benchmarks/gpu_scripts/session19/ab_persistent.py old SCRIPT ARGS...      # SCRIPT on s18's

TEXT: only the cases whose label contains it (e.g. "p=0.1"). `old SCRIPT ARGS` runs SCRIPT (the layer or the train
step) with session 18's kernel in place of the new one, for a same-code A/B against a plain run of SCRIPT.
"""
import importlib.util
import pathlib
import runpy
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "session18"))
from ab_mgpu import op_cases  # noqa: E402  (session 18's cases: packed+bias and q/k/v, p = 0.1 and 0)

from pallas_kernels._mgpu import one_module  # noqa: E402
from pallas_kernels.attention import kernel as fk  # noqa: E402

NEW = fk.kernel_mgpu.backward


def _old_module():
    path = pathlib.Path(__file__).with_name("kernel_mgpu_s18.py")
    spec = importlib.util.spec_from_file_location("pallas_kernels.attention.kernel_mgpu_s18", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


# Session 18's kernel behind one jit as well, as the new one is (`kernel_mgpu.backward`), so that both compile once per
# timed chain rather than once per call site (the chains were too slow to time otherwise: runs 3-7).
OLD = one_module(_old_module().backward, ("rate", "interpret", "heads", "packed", "bias_grad"))


def use(which):
    """Select the backward `kernel.backward` calls (looked up at trace time; each timed step is traced afresh)."""
    fk.kernel_mgpu.backward = OLD if which == "old" else NEW


def main():
    mode = sys.argv[1]
    if mode == "old":
        use("old")
        sys.argv = sys.argv[2:]
        runpy.run_path(sys.argv[0], run_name="__main__")
        return
    from benchmarks.kernels import copy_bandwidth, per_iteration, profile_kernels
    mg = fk.default_block_sizes(128, 64, dtype=jnp.bfloat16)
    print(jax.__version__, jax.devices()[0].device_kind, f"default mgpu_bwd={mg.mgpu_bwd}",
          f"SMs={jax.devices()[0].core_count}", flush=True)
    args, rounds = sys.argv[2:], 2
    if "--rounds" in args:
        i = args.index("--rounds")
        rounds, args = int(args[i + 1]), args[:i] + args[i + 2:]
    lengths = None  # --lengths N1,N2: shorter timed chains (fewer call sites, each compiling the Mosaic GPU kernel)
    if "--lengths" in args:
        i = args.index("--lengths")
        lengths, args = tuple(int(x) for x in args[i + 1].split(",")), args[:i] + args[i + 2:]
    if mode == "once":
        use(args[0])
        label, fn, xs, _ = [c for c in op_cases() if c[0] == "q/k/v p=0.1"][0]
        out = jax.jit(fn(mg))(xs)
        jax.block_until_ready(out)
        print("ran", args[0], label, flush=True)
        return
    only = args[0] if args else ""
    cases = [c for c in op_cases() if only in c[0]]
    if mode == "profile-fwd":  # branch session19-mgpu-forward: the Mosaic GPU forward against Triton's, same backward
        import dataclasses
        for label, fn, xs, _ in cases:
            for name, blocks in (("mgpu fwd", dataclasses.replace(mg, mgpu_fwd=True)), ("triton fwd", mg)):
                profile_kernels(fn(blocks), xs, 10, 6, f"{label} {name}")
        return
    if mode == "profile":
        for label, fn, xs, _ in cases:
            for which in ("new", "old"):
                use(which)
                profile_kernels(fn(mg), xs, 10, 6, f"{label} {which}")
        return
    print(f"copy bandwidth {copy_bandwidth(5) / 1e9:.0f} GB/s", flush=True)
    print("| B64 N16 S128 H64, fwd+bwd | XLA |" + " s18 kernel | persistent |" * rounds, flush=True)
    print("|---|---|" + "---|---|" * rounds)
    for label, fn, xs, xla in cases:
        t = [per_iteration(xla, xs, 5, lengths=lengths)]
        for _ in range(rounds):
            for which in ("old", "new"):
                use(which)
                t.append(per_iteration(fn(mg), xs, 5, lengths=lengths))
                print(f"  {label} {which}: {t[-1] * 1e6:.1f} us", file=sys.stderr, flush=True)
        print(f"| {label} | " + " | ".join(f"{x * 1e6:.1f}" for x in t) + " |", flush=True)


if __name__ == "__main__":
    main()
