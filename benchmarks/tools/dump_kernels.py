"""Session 24: compile and run once each Mosaic GPU kernel named on the command line, so that `MOSAIC_GPU_DUMP_TO`
(set by the caller) leaves its PTX, ptxas log and SASS behind. The kernels' own defaults; bf16 activations.

    MOSAIC_GPU_DUMP_TO=$OUT/dump python benchmarks/gpu_scripts/session24/dump_kernels.py RATE bg_fwd@RxD ...

A name may end in `:field=value,...` (ints; 0/1 for bools) to replace fields of the kernel's default blocks
(session 25: `ln_bwd@8192x1024:auto_barriers=1,bwd_register_sums=3`).
"""
import dataclasses
import sys

import jax
import jax.numpy as jnp

from pallas_kernels._pallas import seed_words
from pallas_kernels.bias_gelu import kernel_mgpu as bg
from pallas_kernels.bias_dropout_residual_layernorm import kernel_mgpu as ln

RATE = float(sys.argv[1])
k = jax.random.split(jax.random.key(0), 6)
sw = seed_words(jnp.array([123, 456], jnp.uint32))


def bg_args(rows, width):
    x = jax.random.normal(k[0], (rows, width), jnp.bfloat16)
    return x, jax.random.normal(k[1], (width,), jnp.float32), sw


def ln_args(rows, width):
    x = jax.random.normal(k[0], (rows, width), jnp.bfloat16)
    res = jax.random.normal(k[2], (rows, width), jnp.bfloat16)
    v = [jax.random.normal(k[i], (width,), jnp.float32) for i in (1, 3, 4)]
    return x, v[0], res, v[1], v[2]


def blocks(module, rows, width, spec):
    base = module.default_blocks(rows, width, RATE)
    kv = dict(item.split("=") for item in spec.split(",") if item)
    return dataclasses.replace(base, **{k: (bool(int(v)) if isinstance(getattr(base, k), bool) else int(v))
                                        for k, v in kv.items()})


for name in sys.argv[2:]:
    kind, shape = name.split("@")
    shape, _, spec = shape.partition(":")
    rows, width = map(int, shape.split("x"))
    if kind == "bg_fwd":
        out = bg.forward(*bg_args(rows, width), rate=RATE, interpret=False,
                         blocks=blocks(bg, rows, width, spec))
    elif kind == "bg_bwd":
        x, b, s = bg_args(rows, width)
        out = bg.backward(x, b, s, x, rate=RATE, interpret=False, blocks=blocks(bg, rows, width, spec))
    elif kind == "ln_fwd":
        x, b, res, sc, sh = ln_args(rows, width)
        out = ln.forward(x, b, res, sc, sh, sw, rate=RATE, eps=1e-12, interpret=False,
                         blocks=blocks(ln, rows, width, spec))
    elif kind == "ln_bwd":
        x, b, res, sc, _ = ln_args(rows, width)
        st = jnp.ones((rows,), jnp.float32)
        out = ln.backward(x, b, res, sc, sw, st, st, x, rate=RATE, interpret=False,
                          blocks=blocks(ln, rows, width, spec))
    else:
        raise SystemExit(f"unknown kernel {kind!r}")
    jax.block_until_ready(out)
    print(name, "ran", flush=True)
