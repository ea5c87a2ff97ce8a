"""Session 22: device time of BDRLN's Mosaic GPU kernels with more programs (CTAs) per SM than 2: target programs
264 / 528 / 1056 (`split_programs` takes the largest divisor of the tile count not above it) x steps in flight 2 / 3,
forward and backward alike, on rotated inputs (session 21's `ab_rowwise.py` method, `common.py`).

    PYTHONPATH=. python benchmarks/gpu_scripts/session22/ab_programs.py [--shapes 8192x768,...] [--rates 0.1]
"""
import dataclasses
import itertools

from common import bdrln_inputs, fwd_bwd_time, header, keys, parse

import pallas_kernels.bias_dropout_residual_layernorm as bdrln
from pallas_kernels._mgpu import split_programs
from pallas_kernels.bias_dropout_residual_layernorm import kernel_mgpu


def main():
    a = parse("bdrln")
    header("BDRLN Mosaic GPU fwd+bwd", a.calls, ["shape", "p", "target programs", "programs", "steps in flight",
                                                 "total", "fwd kernel", "bwd kernel"])
    key, seed = keys()
    for rows, d in a.shape_list:
        args = bdrln_inputs(key, rows, d)
        for rate in a.rate_list:
            default = kernel_mgpu.default_blocks(rows, d, rate=rate)
            for p, k in itertools.product((264, 528, 1056), (2, 3)):
                b = dataclasses.replace(default, programs=p, bwd_programs=p, max_concurrent_steps=k,
                                        bwd_max_concurrent_steps=k)
                actual = split_programs(rows // b.block_rows, p)[0]
                try:
                    total, fwd, bwd, _ = fwd_bwd_time(lambda *t, rate=rate, b=b: bdrln.bias_dropout_residual_layernorm(
                        *t, seed=seed, rate=rate, eps=1e-12, backend="mgpu", blocks=b), args, a.calls)
                    print(f"| {rows}x{d} | {rate} | {p} | {actual} | {k} | {total:.1f} | {fwd:.1f} | {bwd:.1f} |",
                          flush=True)
                except Exception as e:  # e.g. more shared memory than an SM has
                    print(f"| {rows}x{d} | {rate} | {p} | {actual} | {k} | failed: {type(e).__name__}: "
                          f"{str(e)[:80]} | | |", flush=True)


if __name__ == "__main__":
    main()
