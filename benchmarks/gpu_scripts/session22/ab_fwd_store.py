"""Session 22: device time of BDRLN's Mosaic GPU forward with y stored through SMEM (TMA, the pipeline's out_specs)
or straight from registers to GMEM (`Blocks.fwd_direct_store`, as the backward stores dx), on rotated inputs
(session 21's `ab_rowwise.py` helpers).

    PYTHONPATH=. python benchmarks/gpu_scripts/session22/ab_fwd_store.py [--shapes 8192x768,...] [--rates 0.1,0]
"""
import argparse
import dataclasses
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "session21"))
from ab_rowwise import SHAPES, bdrln_inputs, cold_profile, split  # noqa: E402

import jax  # noqa: E402

from benchmarks.kernels import _grads_as_carry  # noqa: E402
import pallas_kernels.bias_dropout_residual_layernorm as bdrln  # noqa: E402
from pallas_kernels.bias_dropout_residual_layernorm import kernel_mgpu  # noqa: E402
from pallas_kernels.dropout import seed_from_key  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--shapes", default=",".join(f"{r}x{d}" for r, d in SHAPES["bdrln"]))
    ap.add_argument("--rates", default="0.1,0")
    a = ap.parse_args()
    print(f"# {jax.__version__} {jax.devices()[0].device_kind}; BDRLN Mosaic GPU fwd+bwd, device time per call, us, "
          f"{a.calls} calls on rotated inputs", flush=True)
    print("| shape | p | y stored | steps in flight | total | fwd kernel | bwd kernel |")
    print("|---|---|---|---|---|---|---|", flush=True)
    key = jax.random.split(jax.random.key(1), 8)
    seed = seed_from_key(key[7])
    for rows, d in SHAPES["bdrln"]:
        if f"{rows}x{d}" not in a.shapes.split(","):
            continue
        args = bdrln_inputs(key, rows, d)
        default = kernel_mgpu.default_blocks(rows, d)
        for rate in (float(r) for r in a.rates.split(",")):
            for direct, k in ((False, default.max_concurrent_steps), (True, default.max_concurrent_steps), (True, 4)):
                b = dataclasses.replace(default, fwd_direct_store=direct, max_concurrent_steps=k)
                fn = _grads_as_carry(lambda *t, rate=rate, b=b: bdrln.bias_dropout_residual_layernorm(
                    *t, seed=seed, rate=rate, eps=1e-12, backend="mgpu", blocks=b), len(args))
                total, fwd, bwd, _ = split(cold_profile(fn, args, a.calls), a.calls)
                print(f"| {rows}x{d} | {rate} | {'registers -> GMEM' if direct else 'SMEM -> TMA'} | {k} | "
                      f"{total:.1f} | {fwd:.1f} | {bwd:.1f} |", flush=True)


if __name__ == "__main__":
    main()
