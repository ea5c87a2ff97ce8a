"""Session 22: device time of BDRLN's Mosaic GPU backward with 0-3 of its column sums (d_scale, d_shift, d_bias) as
register loop carries and the others in SMEM tiles (`kernel_mgpu.Blocks.bwd_register_sums`), against Triton's
kernels, on rotated inputs (session 21's `ab_rowwise.py` method and helpers).

    PYTHONPATH=. python benchmarks/gpu_scripts/session22/ab_sums.py [--shapes 8192x1024,...] [--counts 0,1,2,3]
"""
import argparse
import dataclasses
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "session21"))
from ab_rowwise import SHAPES, bdrln_inputs, cold_profile, copy_device_time, split  # noqa: E402

import jax  # noqa: E402

from benchmarks.kernels import _grads_as_carry  # noqa: E402
import pallas_kernels.bias_dropout_residual_layernorm as bdrln  # noqa: E402
from pallas_kernels.bias_dropout_residual_layernorm import kernel_mgpu  # noqa: E402
from pallas_kernels.dropout import seed_from_key  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--shapes", default="8192x1024,16384x1024,32768x1024")
    ap.add_argument("--rates", default="0.1,0")
    ap.add_argument("--counts", default="0,1,2,3")
    a = ap.parse_args()
    _, gbs = copy_device_time()
    print(f"# {jax.__version__} {jax.devices()[0].device_kind}; copy probe {gbs:.0f} GB/s (device time); BDRLN "
          f"fwd+bwd device time per call, us, {a.calls} calls on rotated inputs", flush=True)
    print("| shape | p | impl | total | fwd kernel | bwd kernel | other (sums) | % of copy BW |")
    print("|---|---|---|---|---|---|---|---|", flush=True)
    key = jax.random.split(jax.random.key(1), 8)
    seed = seed_from_key(key[7])
    for rows, d in SHAPES["bdrln"]:
        if f"{rows}x{d}" not in a.shapes.split(","):
            continue
        args = bdrln_inputs(key, rows, d)
        for rate in (float(r) for r in a.rates.split(",")):
            nbytes = (3 + (5 if rate else 4)) * rows * d * 2

            def fused(*t, rate=rate, **kw):
                return bdrln.bias_dropout_residual_layernorm(*t, seed=seed, rate=rate, eps=1e-12, **kw)

            default = kernel_mgpu.default_blocks(rows, d)
            impls = [("triton", dict(backend="triton"))]
            for n in (int(c) for c in a.counts.split(",")):
                mark = " (default)" if n == default.bwd_register_sums else ""
                impls.append((f"mgpu sums in registers={n}{mark}",
                              dict(backend="mgpu", blocks=dataclasses.replace(default, bwd_register_sums=n))))
            for name, kw in impls:
                fn = _grads_as_carry(lambda *t, kw=kw: fused(*t, **kw), len(args))
                total, fwd, bwd, other = split(cold_profile(fn, args, a.calls), a.calls)
                print(f"| {rows}x{d} | {rate} | {name} | {total:.1f} | {fwd:.1f} | {bwd:.1f} | {other:.1f} | "
                      f"{100 * nbytes / (total * 1e-6) / (gbs * 1e9):.0f}% |", flush=True)


if __name__ == "__main__":
    main()
