"""Session 22: device time of bias+GELU's Mosaic GPU forward and backward kernels per block size (rows per step
1/2/4, steps in flight 2/3/4, 132/264 programs; forward and backward alike), on rotated inputs (session 21's
`ab_rowwise.py` helpers). The kernels' default blocks were never tuned on a GPU.

    PYTHONPATH=. python benchmarks/gpu_scripts/session22/ab_bg_sweep.py [--shapes 8192x3072,...] [--rates 0.1,0]
"""
import argparse
import dataclasses
import itertools
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "session21"))
from ab_rowwise import SHAPES, cold_profile, split  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from benchmarks.kernels import _grads_as_carry  # noqa: E402
import pallas_kernels.bias_gelu as bias_gelu  # noqa: E402
from pallas_kernels.bias_gelu import kernel_mgpu  # noqa: E402
from pallas_kernels.dropout import seed_from_key  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--shapes", default="8192x3072,8192x4096,32768x4096")
    ap.add_argument("--rates", default="0.1,0")
    a = ap.parse_args()
    print(f"# {jax.__version__} {jax.devices()[0].device_kind}; bias+GELU Mosaic GPU, device time per call, us, "
          f"{a.calls} calls on rotated inputs", flush=True)
    print("| shape | p | block_rows | steps in flight | programs | fwd kernel | bwd kernel |")
    print("|---|---|---|---|---|---|---|", flush=True)
    key = jax.random.split(jax.random.key(1), 8)
    seed = seed_from_key(key[7])
    for rows, d in SHAPES["bias_gelu"]:
        if f"{rows}x{d}" not in a.shapes.split(","):
            continue
        args = (jax.random.normal(key[0], (rows, d), jnp.bfloat16), jax.random.normal(key[2], (d,)))
        default = kernel_mgpu.default_blocks(rows, d)
        for rate in (float(r) for r in a.rates.split(",")):
            for br, k, p in itertools.product((1, 2, 4), (2, 3, 4), (132, 264)):
                b = dataclasses.replace(default, block_rows=br, max_concurrent_steps=k, programs=p,
                                        bwd_block_rows=br, bwd_max_concurrent_steps=k, bwd_programs=p)
                mark = (" (fwd default)" if (br, k, p) == (default.block_rows, default.max_concurrent_steps,
                                                           default.programs) else "")
                mark += (" (bwd default)" if (br, k, p) == (default.bwd_block_rows, default.bwd_max_concurrent_steps,
                                                            default.bwd_programs) else "")
                fn = _grads_as_carry(lambda *t, rate=rate, b=b: bias_gelu.bias_gelu(
                    *t, seed=seed, rate=rate, backend="mgpu", blocks=b), len(args))
                try:
                    _, fwd, bwd, _ = split(cold_profile(fn, args, a.calls), a.calls)
                    print(f"| {rows}x{d} | {rate} | {br} | {k} | {p}{mark} | {fwd:.1f} | {bwd:.1f} |", flush=True)
                except Exception as e:  # e.g. more shared memory than an SM has
                    print(f"| {rows}x{d} | {rate} | {br} | {k} | {p}{mark} | failed: {type(e).__name__}: "
                          f"{str(e)[:80]} | |", flush=True)


if __name__ == "__main__":
    main()
