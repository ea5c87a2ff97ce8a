"""Session 23: BDRLN's forward kernel per size against XLA's `x + residual` (the same traffic: two bf16 (R, D) arrays
in, one out), device time on rotated inputs (`session22/common.py`), to split the forward's time into a fixed part
and a rate.

    PYTHONPATH=. python benchmarks/gpu_scripts/session23/fwd_probe.py [--rows 2048,...] [--widths 768,1024]
"""
import argparse

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "session22"))  # its common.py
from common import bdrln_inputs, cold_profile, copy_device_time, header, keys  # noqa: E402

import pallas_kernels.bias_dropout_residual_layernorm as bdrln  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--rows", default="2048,4096,8192,16384,32768,65536")
    ap.add_argument("--widths", default="768,1024")
    ap.add_argument("--rate", type=float, default=0.1)
    a = ap.parse_args()
    _, gbs = copy_device_time()
    header(f"BDRLN forward (p = {a.rate}) and XLA x + residual", a.calls,
           ["rows", "D", "MB moved", "x + residual", "GB/s", "mgpu fwd", "GB/s", "triton fwd", "GB/s"], gbs)
    key, seed = keys()
    for d in (int(w) for w in a.widths.split(",")):
        for rows in (int(r) for r in a.rows.split(",")):
            x, bias, res, scale, shift = bdrln_inputs(key, rows, d)
            nbytes = 3 * rows * d * 2
            cells = []
            fns = [(lambda t: (t[0] + t[1],), (x, res))]
            for backend in ("mgpu", "triton"):
                fns.append((lambda t, b=backend: (bdrln.bias_dropout_residual_layernorm(
                    t[0], t[1], t[2], t[3], t[4], seed=seed, rate=a.rate, eps=1e-12, backend=b),),
                    (x, bias, res, scale, shift)))
            for fn, args in fns:
                us = sum(cold_profile(fn, args, a.calls).values()) / a.calls / 1e3
                cells += [f"{us:.2f}", f"{nbytes / us / 1e3:.0f}"]
            print(f"| {rows} | {d} | {nbytes / 1e6:.1f} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
