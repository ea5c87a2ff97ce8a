"""Session 27: lower the four Mosaic GPU row kernels (BDRLN and bias+GELU, forward and backward) for CUDA with their
default blocks at many row counts, on any machine (no GPU: Mosaic GPU's Python passes run, PTX compilation does not),
and print each failure. BDRLN's backward failed at 12288 rows before c2af492 (its statistics' TMA copy of 192 bytes).

    PYTHONPATH=. python benchmarks/gpu_scripts/session27/lower_sweep.py
"""
import functools

import jax
import jax.numpy as jnp

from pallas_kernels import _pallas as pk
from pallas_kernels.bias_dropout_residual_layernorm import kernel_mgpu as ln
from pallas_kernels.bias_gelu import kernel_mgpu as bg

ROWS = sorted({b * s for b in (8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 96, 112, 128, 160, 192, 256) for s in (128, 512)
               if 2048 <= b * s <= 65536})


def kernels(rows, rate):
    """(op, pass, width, function, arguments) of every kernel at `rows` whose shape checks pass."""
    words = pk.seed_words(jnp.array([1, 2], jnp.uint32))
    for width in (768, 1024):
        blocks = ln.default_blocks(rows, width, rate=rate)
        try:
            ln.check_shape(rows, width, jnp.bfloat16, jnp.bfloat16, blocks)
        except ValueError:
            continue
        x, v, st = jnp.zeros((rows, width), jnp.bfloat16), jnp.zeros((width,)), jnp.zeros((rows,))
        kw = dict(rate=rate, interpret=False, blocks=blocks)
        yield "bdrln", "fwd", width, functools.partial(ln.forward, eps=1e-12, **kw), (x, v, x, v, v, words)
        yield "bdrln", "bwd", width, functools.partial(ln.backward, **kw), (x, v, x, v, words, st, st, x)
    for width in (3072, 4096):
        x, v = jnp.zeros((rows, width), jnp.bfloat16), jnp.zeros((width,))
        kw = dict(rate=rate, interpret=False, blocks=bg.default_blocks(rows, width, rate=rate))
        yield "bias_gelu", "fwd", width, functools.partial(bg.forward, **kw), (x, v, words)
        yield "bias_gelu", "bwd", width, functools.partial(bg.backward, **kw), (x, v, words, x)


def lower_all(cases) -> int:
    """Lower each (label, function, arguments) of `cases` for CUDA, printing each failure and each "... done" label
    (a case with function None); returns how many failed."""
    fails = 0
    for label, fn, args in cases:
        if fn is None:
            print(f"{label} done", flush=True)
            continue
        try:
            jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
        except Exception as e:  # noqa: BLE001 - every failure is reported, none stops the sweep
            fails += 1
            print(f"FAIL {label}: {str(e)[:120]}", flush=True)
    print(f"{fails} failures")
    return fails


def main():
    def cases():
        for rows in ROWS:
            for rate in (0.1, 0.0):
                for op, stage, width, fn, args in kernels(rows, rate):
                    yield f"{op} {stage} {rows}x{width} p={rate}", fn, args
            yield f"rows {rows}", None, None

    lower_all(cases())


if __name__ == "__main__":
    main()
