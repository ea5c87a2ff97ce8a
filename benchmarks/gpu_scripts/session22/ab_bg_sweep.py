"""Session 22: device time of bias+GELU's Mosaic GPU forward and backward kernels per block size (rows per step
1/2/4, steps in flight 2/3/4, 132/264 programs; forward and backward alike; the default blocks' other fields, for p =
0), on rotated inputs (session 21's `ab_rowwise.py` method, `common.py`). Run 5 swept them: never done on a GPU before.

    PYTHONPATH=. python benchmarks/gpu_scripts/session22/ab_bg_sweep.py [--shapes 8192x3072,...] [--rates 0.1,0]
"""
import dataclasses
import itertools

import jax
import jax.numpy as jnp

from common import fwd_bwd_time, header, keys, parse

import pallas_kernels.bias_gelu as bias_gelu
from pallas_kernels.bias_gelu import kernel_mgpu


def main():
    a = parse("bias_gelu")
    header("bias+GELU Mosaic GPU", a.calls, ["shape", "p", "block_rows", "steps in flight", "programs", "fwd kernel",
                                             "bwd kernel"])
    key, seed = keys()
    for rows, d in a.shape_list:
        args = (jax.random.normal(key[0], (rows, d), jnp.bfloat16), jax.random.normal(key[2], (d,)))
        default = kernel_mgpu.default_blocks(rows, d)
        for rate in a.rate_list:
            for br, k, p in itertools.product((1, 2, 4), (2, 3, 4), (132, 264)):
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
