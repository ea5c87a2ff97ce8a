"""Session 23: where BDRLN's Mosaic GPU forward loses its ~2 us per call to XLA's add at small sizes (`fwd_probe.py`):
the forward kernel alone per variant (operands, dropout, block sizes) against XLA's elementwise ops with the same
traffic, device time on rotated inputs (`session22/common.py`).

    PYTHONPATH=. python benchmarks/gpu_scripts/session23/fwd_variants.py [--rows 2048,8192,32768] [--widths 768,1024]
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
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--rows", default="2048,8192,32768")
    ap.add_argument("--widths", default="768,1024")
    a = ap.parse_args()
    _, gbs = copy_device_time()
    header("BDRLN Mosaic GPU forward variants and XLA ops of the same traffic", a.calls,
           ["rows", "D", "variant", "us", "GB/s"], gbs)
    key, seed = keys()
    for d in (int(w) for w in a.widths.split(",")):
        for rows in (int(r) for r in a.rows.split(",")):
            x, bias, res, scale, shift = bdrln_inputs(key, rows, d)
            base = kernel_mgpu.default_blocks(rows, d, rate=0.1)

            def fused(blocks=base, rate=0.1, with_bias=True, with_res=True):
                return lambda t: (bdrln.bias_dropout_residual_layernorm(
                    t[0], t[1] if with_bias else None, t[2] if with_res else None, t[3], t[4], seed=seed, rate=rate,
                    eps=1e-12, backend="mgpu", blocks=blocks),)

            variants = [
                ("XLA x + residual (2 in, 1 out)", lambda t: (t[0] + t[1],), (x, res), 3),
                ("XLA x + 1 (1 in, 1 out)", lambda t: (t[0] + 1,), (x,), 2),
                ("mgpu default, p = 0.1", fused(), (x, bias, res, scale, shift), 3),
                ("mgpu p = 0", fused(rate=0.0), (x, bias, res, scale, shift), 3),
                ("mgpu p = 0, no bias", fused(rate=0.0, with_bias=False), (x, bias, res, scale, shift), 3),
                ("mgpu layer_norm (1 in, 1 out)", fused(rate=0.0, with_bias=False, with_res=False),
                 (x, bias, res, scale, shift), 2),
            ]
            for name, kw in (("2 steps in flight", dict(max_concurrent_steps=2)),
                             ("4 steps in flight", dict(max_concurrent_steps=4)),
                             ("132 programs", dict(programs=132)),
                             ("8 rows per step, 2 in flight", dict(block_rows=8, max_concurrent_steps=2))):
                variants.append((f"mgpu p = 0.1, {name}", fused(dataclasses.replace(base, **kw)),
                                 (x, bias, res, scale, shift), 3))
            for name, fn, args, arrays in variants:
                try:
                    us = sum(v for k, v in cold_profile(fn, args, a.calls).items()) / a.calls / 1e3
                    print(f"| {rows} | {d} | {name} | {us:.2f} | {arrays * rows * d * 2 / us / 1e3:.0f} |",
                          flush=True)
                except Exception as e:  # e.g. more SMEM than an SM has
                    print(f"| {rows} | {d} | {name} | failed: {type(e).__name__} | |", flush=True)


if __name__ == "__main__":
    main()
