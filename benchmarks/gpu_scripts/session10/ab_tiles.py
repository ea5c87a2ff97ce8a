"""Session 10: BDRLN / layernorm with a 768-wide row as exact column tiles (512 + 256, `_pallas.col_tiles`) against
the former single 1024-wide tile with a quarter masked (`col_tiles(..., max_tiles=1)`, patched in), timed
alternately with benchmarks/kernels.py's clock (chained, L2-rotated fwd / fwd+bwd), XLA's fusion for scale.

    patch -p1 < benchmarks/gpu_scripts/session10/split_tiles.patch   # on 43e6625: adds _pallas.col_tiles
    PYTHONPATH=. python benchmarks/gpu_scripts/session10/ab_tiles.py bdrln:8192x768 ln:8192x768 bdrln:32768x768

The split tiles measured slower in the backward and were not kept (benchmarks/results/kernels-h200.md, session 10).
"""
import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import kernels as kb  # noqa: E402  benchmarks/kernels.py

import pallas_kernels._pallas as pk  # noqa: E402
import pallas_kernels.bias_dropout_residual_layernorm as bdrln  # noqa: E402

SPLIT = pk.col_tiles
PADDED = functools.partial(SPLIT, max_tiles=1)  # the tiling before session 10
SCALE = int(os.environ.get("SCALE", 1))  # SCALE=1000: a smoke run on the CPU (fewer bytes to rotate over)
kb.ROTATE_BYTES[0] //= SCALE


def case(op, rows, d, rate):
    k = jax.random.split(jax.random.key(0), 5)
    x = jax.random.normal(k[0], (rows, d), jnp.bfloat16)
    scale, shift = 1 + 0.1 * jax.random.normal(k[3], (d,)), jax.random.normal(k[4], (d,))
    if op == "ln":  # the MLM head's / embedding's plain layernorm: reads x, writes y; bwd reads x, dy, writes dx
        args = (x, scale, shift)
        return args, (lambda *a: bdrln.layer_norm(*a, eps=1e-12)), \
            (lambda *a: bdrln.reference.layer_norm(*a, eps=1e-12)), (2 * rows * d * 2, 5 * rows * d * 2)
    args = (x, jax.random.normal(k[1], (d,)), jax.random.normal(k[2], (rows, d), jnp.bfloat16), scale, shift)
    kw = dict(seed=np.array([1, 2], np.uint32), rate=rate, eps=1e-12)
    fwd_bwd = (8 if rate else 7) * rows * d * 2  # fwd 3RD; bwd 5RD (4RD without dropout: dx = d_residual)
    return args, (lambda *a: bdrln.bias_dropout_residual_layernorm(*a, **kw)), \
        (lambda *a: bdrln.reference.bias_dropout_residual_layernorm(*a, **kw)), (3 * rows * d * 2, fwd_bwd)


def main():
    print(f"# {jax.devices()[0].device_kind}, jax {jax.__version__}", flush=True)
    bw = kb.copy_bandwidth(5, SCALE)
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s", flush=True)
    print("| shape | pass | impl | us | % of copy BW | vs XLA | rel err |\n|---|---|---|---|---|---|---|", flush=True)
    for spec in sys.argv[1:]:
        op, shape, *rate = spec.split(":")  # op:RxD[:rate] (default 0.1)
        rate = float(rate[0]) if rate else 0.1
        rows, d = map(int, shape.split("x"))
        args, fn, ref, (fwd_bytes, both_bytes) = case(op, rows, d, rate)
        n = len(args) if op == "ln" else 5
        for pass_, nbytes in (("fwd", fwd_bytes), ("fwd+bwd", both_bytes)):
            if pass_ == "fwd":  # y replaces x as the next iteration's input
                step_of = lambda f: lambda a: (f(*a).astype(a[0].dtype),) + tuple(a[1:])  # noqa: E731
            else:
                step_of = lambda f: kb._grads_as_carry(f, n)  # noqa: E731
            t_xla = kb.per_iteration(step_of(ref), args, 5)
            label = f"{op} {shape}" + (f" p={rate}" if op != "ln" else "")
            print(f"| {label} | {pass_} | xla | {t_xla * 1e6:.1f} | {100 * nbytes / t_xla / bw:.0f}% | 1.00x | |",
                  flush=True)
            for name, tiles in (("split", SPLIT), ("padded", PADDED), ("split", SPLIT), ("padded", PADDED)):
                pk.col_tiles = tiles  # read when the kernel traces; each per_iteration jits afresh
                err = kb.check_against(fn, ref, args, n, pass_)
                t = kb.per_iteration(step_of(fn), args, 5)
                print(f"| {label} | {pass_} | pallas {name} | {t * 1e6:.1f} | {100 * nbytes / t / bw:.0f}% | "
                      f"{t_xla / t:.2f}x | {err:.1e} |", flush=True)
            pk.col_tiles = SPLIT


if __name__ == "__main__":
    main()
