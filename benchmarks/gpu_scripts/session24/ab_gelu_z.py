"""Session 24: bias+GELU's Mosaic GPU kernels, main's z-form (1/Q as rcp.approx.ftz, the constants and the dropout
scale in the erf polynomial) against session 23's (`old_bg_mgpu.py`), fwd+bwd device time on rotated inputs
(session 21's method, `session22/common.py`), the two alternating over rounds; XLA and Triton once per case.

    PYTHONPATH=. python benchmarks/gpu_scripts/session24/ab_gelu_z.py [--shapes 8192x3072,...] [--rates 0.1,0]
        [--variants "old;main;main:block_rows=2"] [--no-baselines]

A variant is `old` (session 23's Mosaic GPU kernels), `main`, `old_triton` (1e28d7c's Triton kernels) or `triton`,
optionally with `:field=value,...` replacing fields of the module's default blocks; the variants run in rotated order
over rounds.
"""
import dataclasses
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "session22"))  # its common.py
from common import copy_device_time, fwd_bwd_time, header, keys, parse  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import old_bg_mgpu  # noqa: E402
import old_bg_triton  # noqa: E402
import pallas_kernels.bias_gelu as bias_gelu  # noqa: E402
from pallas_kernels.bias_gelu import kernel, kernel_mgpu  # noqa: E402

MODULES = {"old": ("mgpu", old_bg_mgpu), "main": ("mgpu", kernel_mgpu), "old_triton": ("triton", old_bg_triton),
           "triton": ("triton", kernel)}


def with_module(module, seed, rate, backend="mgpu", **fields):
    """bias_gelu's public function (custom VJP, shard_map) running `module`'s kernels as `backend` with its default
    blocks (with `fields` replaced)."""
    def fn(x, b):
        saved, bias_gelu.BACKENDS[backend] = bias_gelu.BACKENDS[backend], module
        try:
            blocks = dataclasses.replace(module.default_blocks(*x.shape, rate=rate), **fields)
            return bias_gelu.bias_gelu(x, b, seed=seed, rate=rate, backend=backend, blocks=blocks)
        finally:
            bias_gelu.BACKENDS[backend] = saved
    return fn


def fields(v: str) -> dict:
    """`main:block_rows=2,programs=512` -> {"block_rows": 2, "programs": 512}."""
    _, _, spec = v.partition(":")
    return {k: int(val) for k, val in (kv.split("=") for kv in spec.split(",") if kv)}


def variant(v: str) -> str:
    name = {"old": "session 23 (rsqrt)", "main": "main (z-form, rcp)", "old_triton": "Triton, h-form",
            "triton": "Triton, z-form"}[v.partition(":")[0]]
    return name + (f" {v.partition(':')[2]}" if ":" in v else "")


def main():
    a = parse("bias_gelu", extra=[("--rounds", "3", "alternating rounds of session 23's and main's kernels"),
                                  ("--variants", "old;main", "`;`-separated variants (module docstring)"),
                                  ("--baselines", "1", "0: skip XLA and Triton")])
    _, gbs = copy_device_time()
    header("bias+GELU fwd+bwd", a.calls, ["shape", "p", "impl", "round", "total", "fwd kernel", "bwd kernel",
                                          "% of copy BW", "vs XLA"], gbs)
    key, seed = keys()
    for rows, d in a.shape_list:
        args = (jax.random.normal(key[0], (rows, d), jnp.bfloat16), jax.random.normal(key[2], (d,)))
        nbytes = 5 * rows * d * 2
        for rate in a.rate_list:
            xla = None

            def row(name, r, fn):
                nonlocal xla
                total, fwd, bwd, _ = fwd_bwd_time(fn, args, a.calls)
                xla = xla or total
                print(f"| {rows}x{d} | {rate} | {name} | {r} | {total:.1f} | {fwd:.1f} | {bwd:.1f} | "
                      f"{100 * nbytes / (total * 1e-6) / (gbs * 1e9):.0f}% | {xla / total:.2f}x |", flush=True)

            if a.baselines == "1":
                row("xla", "-", lambda *t, rate=rate: bias_gelu.reference.bias_gelu(*t, seed=seed, rate=rate))
                row("triton", "-", lambda *t, rate=rate: bias_gelu.bias_gelu(*t, seed=seed, rate=rate,
                                                                            backend="triton"))
            impls = [(variant(v), with_module(MODULES[v.partition(":")[0]][1], seed, rate,
                                              MODULES[v.partition(":")[0]][0], **fields(v)))
                     for v in a.variants.split(";")]
            for r in range(int(a.rounds)):
                k = r % len(impls)
                for name, fn in impls[k:] + impls[:k]:
                    row(name, r, fn)


if __name__ == "__main__":
    main()
