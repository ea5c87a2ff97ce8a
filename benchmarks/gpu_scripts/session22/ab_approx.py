"""Session 22: device time of bias+GELU's Mosaic GPU kernels with and without `approx_math` (exp as ex2.approx, erf's
divide from rsqrt.approx), on rotated inputs (session 21's `ab_rowwise.py` method and helpers).

    PYTHONPATH=. python benchmarks/gpu_scripts/session22/ab_approx.py [--shapes 8192x3072,...] [--rates 0,0.1]
"""
import argparse
import dataclasses
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "session21"))
from ab_rowwise import SHAPES, cold_profile, copy_device_time, split  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from benchmarks.kernels import _grads_as_carry  # noqa: E402
import pallas_kernels.bias_gelu as bias_gelu  # noqa: E402
from pallas_kernels.bias_gelu import kernel_mgpu  # noqa: E402
from pallas_kernels.dropout import seed_from_key  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--shapes", default="8192x3072,8192x4096,32768x4096")
    ap.add_argument("--rates", default="0.1,0")
    a = ap.parse_args()
    _, gbs = copy_device_time()
    print(f"# {jax.__version__} {jax.devices()[0].device_kind}; copy probe {gbs:.0f} GB/s (device time); bias+GELU "
          f"fwd+bwd device time per call, us, {a.calls} calls on rotated inputs", flush=True)
    print("| shape | p | impl | total | fwd kernel | bwd kernel | other (sum) | % of copy BW | vs XLA |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    key = jax.random.split(jax.random.key(1), 8)
    seed = seed_from_key(key[7])
    for rows, d in SHAPES["bias_gelu"]:
        if f"{rows}x{d}" not in a.shapes.split(","):
            continue
        args = (jax.random.normal(key[0], (rows, d), jnp.bfloat16), jax.random.normal(key[2], (d,)))
        for rate in (float(r) for r in a.rates.split(",")):
            default = kernel_mgpu.default_blocks(rows, d, rate=rate)  # run 6 passed no rate: p = 0's blocks
            nbytes = 5 * rows * d * 2
            impls = [("xla", lambda *t, rate=rate: bias_gelu.reference.bias_gelu(*t, seed=seed, rate=rate)),
                     ("triton", lambda *t, rate=rate: bias_gelu.bias_gelu(*t, seed=seed, rate=rate, backend="triton"))]
            for approx in (False, True):
                b = dataclasses.replace(default, approx_math=approx)
                impls.append((f"mgpu approx_math={approx} block_rows={b.block_rows}",
                              lambda *t, rate=rate, b=b: bias_gelu.bias_gelu(*t, seed=seed, rate=rate, backend="mgpu",
                                                                             blocks=b)))
            xla = None
            for name, fn in impls:
                total, fwd, bwd, other = split(cold_profile(_grads_as_carry(fn, len(args)), args, a.calls), a.calls)
                xla = xla or total
                print(f"| {rows}x{d} | {rate} | {name} | {total:.1f} | {fwd:.1f} | {bwd:.1f} | {other:.1f} | "
                      f"{100 * nbytes / (total * 1e-6) / (gbs * 1e9):.0f}% | {xla / total:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
