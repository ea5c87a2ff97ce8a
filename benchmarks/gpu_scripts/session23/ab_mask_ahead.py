"""Session 23: BDRLN's Mosaic GPU forward drawing each tile's dropout mask one step ahead (a loop carry,
`Blocks.fwd_mask_ahead`) or in the tile's own step, alternating over rounds, forward kernel device time on rotated
inputs, p = 0.1 (`session22/common.py`).

    PYTHONPATH=. python benchmarks/gpu_scripts/session23/ab_mask_ahead.py [--rounds 3] [--shapes 8192x768,...]
"""
import argparse
import dataclasses
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "session22"))  # its common.py
from common import bdrln_inputs, cold_profile, copy_device_time, header, keys  # noqa: E402

import pallas_kernels.bias_dropout_residual_layernorm as bdrln  # noqa: E402
from pallas_kernels.bias_dropout_residual_layernorm import kernel_mgpu  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shapes", default="2048x768,8192x768,8192x1024,32768x768,32768x1024")
    a = ap.parse_args()
    _, gbs = copy_device_time()
    header("BDRLN Mosaic GPU forward, p = 0.1, the mask drawn", a.calls, ["shape", "round", "in its step",
                                                                          "a step ahead"], gbs)
    key, seed = keys()
    for shape in a.shapes.split(","):
        rows, d = (int(v) for v in shape.split("x"))
        args = bdrln_inputs(key, rows, d)
        base = kernel_mgpu.default_blocks(rows, d, rate=0.1)
        fns = [lambda t, b=b: (bdrln.bias_dropout_residual_layernorm(*t, seed=seed, rate=0.1, eps=1e-12,
                                                                     backend="mgpu", blocks=b),)
               for b in (dataclasses.replace(base, fwd_mask_ahead=v) for v in (False, True))]
        for r in range(a.rounds):
            order = fns if r % 2 == 0 else fns[::-1]
            us = [sum(cold_profile(fn, args, a.calls).values()) / a.calls / 1e3 for fn in order]
            us = us if r % 2 == 0 else us[::-1]
            print(f"| {shape} | {r} | {us[0]:.2f} | {us[1]:.2f} |", flush=True)


if __name__ == "__main__":
    main()
