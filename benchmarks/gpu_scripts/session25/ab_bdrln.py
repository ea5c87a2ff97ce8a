"""Session 25: BDRLN's Mosaic GPU kernels with fields of their default blocks replaced (variants), fwd+bwd device
time on rotated inputs (session 21's method, `session22/common.py`), the variants in rotated order over rounds.

    PYTHONPATH=. python benchmarks/gpu_scripts/session25/ab_bdrln.py [--shapes 8192x1024,...] [--rates 0.1,0]
        [--rounds 2] [--variants "main;bwd_param_reload=1;bwd_param_reload=1,bwd_register_sums=3"]

A variant is `main` (the defaults) or `field=value,...` (ints; 0/1 for bools) replacing fields of
`kernel_mgpu.default_blocks(rows, width, rate)`.
"""
import dataclasses
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "session22"))  # its common.py
from common import bdrln_inputs, copy_device_time, fwd_bwd_time, header, keys, parse  # noqa: E402

import pallas_kernels.bias_dropout_residual_layernorm as bdrln  # noqa: E402
from pallas_kernels.bias_dropout_residual_layernorm import kernel_mgpu  # noqa: E402


def fields(v: str) -> dict:
    """`bwd_param_reload=1,bwd_register_sums=3` -> {"bwd_param_reload": 1, "bwd_register_sums": 3}; `main` -> {}."""
    if v == "main":
        return {}
    return {k: int(val) for k, val in (kv.split("=") for kv in v.split(",") if kv)}


def blocks_of(v: str, rows: int, d: int, rate: float):
    base = kernel_mgpu.default_blocks(rows, d, rate=rate)
    kw = {k: (bool(x) if isinstance(getattr(base, k), bool) else x) for k, x in fields(v).items()}
    return dataclasses.replace(base, **kw)


def main():
    a = parse("bdrln", shapes="8192x768,8192x1024,16384x1024,32768x1024",
              extra=[("--rounds", "2", "rounds, the variants rotated each round"),
                     ("--variants", "main", "`;`-separated variants (module docstring)")])
    _, gbs = copy_device_time()
    header("BDRLN Mosaic GPU fwd+bwd", a.calls, ["shape", "p", "variant", "round", "total", "fwd kernel",
                                                 "bwd kernel", "other (sums)", "% of copy BW"], gbs)
    key, seed = keys()
    variants = a.variants.split(";")
    for rows, d in a.shape_list:
        args = bdrln_inputs(key, rows, d)
        for rate in a.rate_list:
            nbytes = (3 + (5 if rate else 4)) * rows * d * 2
            fns = [lambda *t, rate=rate, b=blocks_of(v, rows, d, rate): bdrln.bias_dropout_residual_layernorm(
                *t, seed=seed, rate=rate, eps=1e-12, backend="mgpu", blocks=b) for v in variants]
            for r in range(int(a.rounds)):
                k = r % len(variants)
                for v, fn in list(zip(variants, fns))[k:] + list(zip(variants, fns))[:k]:
                    total, fwd, bwd, other = fwd_bwd_time(fn, args, a.calls)
                    print(f"| {rows}x{d} | {rate} | {v} | {r} | {total:.1f} | {fwd:.1f} | {bwd:.1f} | {other:.1f} | "
                          f"{100 * nbytes / (total * 1e-6) / (gbs * 1e9):.0f}% |", flush=True)


if __name__ == "__main__":
    main()
