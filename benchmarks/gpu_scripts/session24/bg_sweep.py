"""Session 24: session 22's block-size sweep of bias+GELU's Mosaic GPU kernels (`session22/ab_bg_sweep.py`), re-run on
the z-form kernels, whose registers fell from 199/240 (forward/backward with dropout) to 119/155, so that 3 programs
per SM now fit: rows per step 1/2 x steps in flight 2/3/4 x programs 132/264/512 (`split_programs` takes the largest
divisor of the tile count: 128/256/512 here), forward and backward alike;
device time per kernel on rotated inputs (`session22/common.py`).

    PYTHONPATH=. python benchmarks/gpu_scripts/session24/bg_sweep.py [--shapes 8192x3072,...] [--rates 0.1,0]
"""
import dataclasses
import itertools
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "session22"))  # its common.py
from common import fwd_bwd_time, header, keys, parse  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import pallas_kernels.bias_gelu as bias_gelu  # noqa: E402
from pallas_kernels.bias_gelu import kernel_mgpu  # noqa: E402


def main():
    a = parse("bias_gelu", extra=[("--programs", "132,264,512", "programs to try"),
                                  ("--block-rows", "1,2", "rows per step to try")])
    header("bias+GELU Mosaic GPU (z-form)", a.calls, ["shape", "p", "block_rows", "steps in flight", "programs",
                                                      "fwd kernel", "bwd kernel"])
    key, seed = keys()
    for rows, d in a.shape_list:
        args = (jax.random.normal(key[0], (rows, d), jnp.bfloat16), jax.random.normal(key[2], (d,)))
        for rate in a.rate_list:
            default = kernel_mgpu.default_blocks(rows, d, rate=rate)
            for br, k, p in itertools.product([int(v) for v in a.block_rows.split(",")], (2, 3, 4),
                                              [int(v) for v in a.programs.split(",")]):
                b = dataclasses.replace(default, block_rows=br, max_concurrent_steps=k, programs=p,
                                        bwd_block_rows=br, bwd_max_concurrent_steps=k, bwd_programs=p)
                mark = (" (fwd default)" if (br, k, p) == (default.block_rows, default.max_concurrent_steps,
                                                           default.programs) else "")
                mark += (" (bwd default)" if (br, k, p) == (default.bwd_block_rows, default.bwd_max_concurrent_steps,
                                                            default.bwd_programs) else "")
                try:
                    _, fwd, bwd, _ = fwd_bwd_time(lambda *t, rate=rate, b=b: bias_gelu.bias_gelu(
                        *t, seed=seed, rate=rate, backend="mgpu", blocks=b), args, a.calls)
                    print(f"| {rows}x{d} | {rate} | {br} | {k} | {p}{mark} | {fwd:.1f} | {bwd:.1f} |", flush=True)
                except Exception as e:  # e.g. more shared memory than an SM has
                    print(f"| {rows}x{d} | {rate} | {br} | {k} | {p}{mark} | failed: {type(e).__name__}: "
                          f"{str(e)[:80]} | |", flush=True)


if __name__ == "__main__":
    main()
