"""Session 22: device time of bias+GELU's Mosaic GPU kernels with and without `approx_math` (exp as ex2.approx, erf's
divide from rsqrt.approx), each with the default blocks for the rate, against XLA and Triton, on rotated inputs
(session 21's `ab_rowwise.py` method, `common.py`).

    PYTHONPATH=. python benchmarks/gpu_scripts/session22/ab_approx.py [--shapes 8192x3072,...] [--rates 0.1,0]
"""
import dataclasses

import jax
import jax.numpy as jnp

from common import copy_device_time, fwd_bwd_time, header, keys, parse

import pallas_kernels.bias_gelu as bias_gelu
from pallas_kernels.bias_gelu import kernel_mgpu


def main():
    a = parse("bias_gelu")
    _, gbs = copy_device_time()
    header("bias+GELU fwd+bwd", a.calls, ["shape", "p", "impl", "total", "fwd kernel", "bwd kernel", "other (sum)",
                                          "% of copy BW", "vs XLA"], gbs)
    key, seed = keys()
    for rows, d in a.shape_list:
        args = (jax.random.normal(key[0], (rows, d), jnp.bfloat16), jax.random.normal(key[2], (d,)))
        for rate in a.rate_list:
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
                total, fwd, bwd, other = fwd_bwd_time(fn, args, a.calls)
                xla = xla or total
                print(f"| {rows}x{d} | {rate} | {name} | {total:.1f} | {fwd:.1f} | {bwd:.1f} | {other:.1f} | "
                      f"{100 * nbytes / (total * 1e-6) / (gbs * 1e9):.0f}% | {xla / total:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
