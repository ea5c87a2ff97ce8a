"""Session 23: BDRLN fwd+bwd with its three per-program partial sums reduced by one `column_sums` kernel (main) or by
three XLA reductions (session 22: `jnp.sum` per array), each backend, device time on rotated inputs
(`session22/common.py`).

    PYTHONPATH=. python benchmarks/gpu_scripts/session23/ab_colsums.py [--shapes 8192x768,...] [--rates 0.1,0]
"""
import os
import sys

import jax.numpy as jnp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "session22"))  # its common.py
from common import bdrln_inputs, copy_device_time, fwd_bwd_time, header, keys, parse  # noqa: E402

import pallas_kernels._pallas as pk  # noqa: E402
import pallas_kernels.bias_dropout_residual_layernorm as bdrln  # noqa: E402

KERNEL = pk.column_sums


def xla_sums(*partials, interpret):
    """Session 22's reduction: one XLA `jnp.sum` per partial-sum array."""
    del interpret
    return tuple(None if p is None else jnp.sum(p, axis=0, keepdims=True) for p in partials)


def main():
    a = parse("bdrln", extra=[("--impls", "triton,mgpu", "backends to time")])
    _, gbs = copy_device_time()
    header("BDRLN fwd+bwd", a.calls, ["shape", "p", "backend", "partial sums", "total", "fwd kernel", "bwd kernel",
                                      "other (sums)", "% of copy BW"], gbs)
    key, seed = keys()
    for rows, d in a.shape_list:
        args = bdrln_inputs(key, rows, d)
        for rate in a.rate_list:
            nbytes = (3 + (5 if rate else 4)) * rows * d * 2
            for backend in a.impls.split(","):
                for name, sums in (("3 XLA sums", xla_sums), ("column_sums", KERNEL)):
                    pk.column_sums = sums
                    fn = lambda *t, rate=rate, b=backend: bdrln.bias_dropout_residual_layernorm(  # noqa: E731
                        *t, seed=seed, rate=rate, eps=1e-12, backend=b)
                    total, fwd, bwd, other = fwd_bwd_time(fn, args, a.calls)
                    print(f"| {rows}x{d} | {rate} | {backend} | {name} | {total:.1f} | {fwd:.1f} | {bwd:.1f} | "
                          f"{other:.1f} | {100 * nbytes / (total * 1e-6) / (gbs * 1e9):.0f}% |", flush=True)
    pk.column_sums = KERNEL


if __name__ == "__main__":
    main()
