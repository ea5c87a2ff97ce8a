"""Session 23: `column_sums` alone (three (G, D) float32 partial-sum arrays) per block size, against three XLA
`jnp.sum`s, device time per call with the inputs hot in L2 (as after the backward kernel that writes them).

    PYTHONPATH=. python benchmarks/gpu_scripts/session23/colsums_sweep.py [--calls 50]

(Run 3 also timed Triton's software pipelining, 3 stages: equal to 1 everywhere, within 0.01 us; the stages column
is 1 since.)
"""
import argparse
import itertools

import jax
import jax.numpy as jnp

from jaxformer.hlo_profile import profile_compiled
import pallas_kernels._pallas as pk


def device_us(fn, args, calls):
    compiled = jax.jit(fn).lower(*args).compile()
    return sum(profile_compiled(compiled, args, calls, by="both", log=lambda m: 0).values()) / calls / 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--shapes", default="256x768,256x1024,512x768,512x1024")
    a = ap.parse_args()
    print(f"# {jax.__version__} {jax.devices()[0].device_kind}; column_sums of 3 (G, D) float32, device time per call, "
          f"us, {a.calls} calls, inputs hot", flush=True)
    print("| G x D | impl | block_cols | chunk_rows | warps | stages | us |")
    print("|---|---|---|---|---|---|---|", flush=True)
    for shape in a.shapes.split(","):
        g, d = (int(v) for v in shape.split("x"))
        ps = tuple(jax.random.normal(k, (g, d), jnp.float32) for k in jax.random.split(jax.random.key(0), 3))
        us = device_us(lambda *p: tuple(jnp.sum(x, axis=0) for x in p), ps, a.calls)
        print(f"| {shape} | 3 XLA sums | | | | | {us:.2f} |", flush=True)
        for bc, ch, w, st in itertools.product((16, 32, 64), (64, 128, 256), (4, 8), (1,)):
            if ch > pk.next_pow2(g) or (w == 8 and bc == 16):
                continue
            fn = lambda *p, bc=bc, ch=ch, w=w, st=st: pk.column_sums(  # noqa: E731
                *p, interpret=False, block_cols=bc, chunk_rows=ch, num_warps=w)
            try:
                print(f"| {shape} | column_sums | {bc} | {ch} | {w} | {st} | {device_us(fn, ps, a.calls):.2f} |",
                      flush=True)
            except Exception as e:
                print(f"| {shape} | column_sums | {bc} | {ch} | {w} | {st} | failed: {type(e).__name__} |", flush=True)


if __name__ == "__main__":
    main()
