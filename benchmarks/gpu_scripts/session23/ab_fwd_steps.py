"""Session 23: BDRLN's Mosaic GPU forward with 3 or 2 tiles in flight, alternating over rounds, forward kernel device
time on rotated inputs (`session22/common.py`): run 7 had 2 in flight 3.8 us faster than 3 (then the default
everywhere) at 32768x1024 in one pass, inside the default's spread between runs (52.6-55.9 us); run 8 (this script,
p = 0.1) made 2 the default at 1024 wide.

    PYTHONPATH=. python benchmarks/gpu_scripts/session23/ab_fwd_steps.py [--rounds 3] [--shapes 8192x1024,...]
"""
import argparse
import dataclasses
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "session22"))  # its common.py
from common import bdrln_inputs, cold_profile, copy_device_time, header, keys  # noqa: E402

import pallas_kernels.bias_dropout_residual_layernorm as bdrln  # noqa: E402
from pallas_kernels.bias_dropout_residual_layernorm import kernel_mgpu  # noqa: E402


def alternate(what: str, field: str, values: tuple, columns: list[str], *, shapes: str, rate: float | None = None):
    """Time BDRLN's Mosaic GPU forward kernel with `field` of its default blocks set to each of `values` (two),
    alternating the order over rounds, and print one table row per round (`columns` names the two)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shapes", default=shapes)
    if rate is None:
        ap.add_argument("--rate", type=float, default=0.1)
    a = ap.parse_args()
    rate = a.rate if rate is None else rate
    _, gbs = copy_device_time()
    header(f"BDRLN Mosaic GPU forward, p = {rate}, {what}", a.calls, ["shape", "round", *columns], gbs)
    key, seed = keys()
    for shape in a.shapes.split(","):
        rows, d = (int(v) for v in shape.split("x"))
        args = bdrln_inputs(key, rows, d)
        base = kernel_mgpu.default_blocks(rows, d, rate=rate)
        fns = [lambda t, b=b: (bdrln.bias_dropout_residual_layernorm(*t, seed=seed, rate=rate, eps=1e-12,
                                                                     backend="mgpu", blocks=b),)
               for b in (dataclasses.replace(base, **{field: v}) for v in values)]
        for r in range(a.rounds):
            order = fns if r % 2 == 0 else fns[::-1]
            us = [sum(cold_profile(fn, args, a.calls).values()) / a.calls / 1e3 for fn in order]
            us = us if r % 2 == 0 else us[::-1]
            print(f"| {shape} | {r} | {us[0]:.2f} | {us[1]:.2f} |", flush=True)


def main():
    alternate("tiles in flight", "max_concurrent_steps", (3, 2), ["3", "2"],
              shapes="8192x1024,16384x1024,32768x1024,8192x768,32768x768")


if __name__ == "__main__":
    main()
