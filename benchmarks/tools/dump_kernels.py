"""Compile and run once each Mosaic GPU row kernel named on the command line, so that `MOSAIC_GPU_DUMP_TO` (set by
the caller) leaves its PTX and ptxas log behind (`dump_sass.sh` turns them into SASS). A Hopper GPU; the kernels'
own default blocks, bf16 activations, random inputs.

    MOSAIC_GPU_DUMP_TO=DIR PYTHONPATH=. python benchmarks/tools/dump_kernels.py RATE KERNEL@RxD[:field=value,...] ...

KERNEL is bg_fwd / bg_bwd (bias+GELU) or ln_fwd / ln_bwd (BDRLN), e.g. `bg_fwd@8192x4096 ln_bwd@8192x768`. A name
may end in `:field=value,...` (ints; 0/1 for bools) to replace fields of the kernel's default `Blocks`, e.g.
`ln_bwd@8192x1024:auto_barriers=1`.
"""
import argparse
import dataclasses

import jax
import jax.numpy as jnp

from pallas_kernels._pallas import seed_words
from pallas_kernels.bias_dropout_residual_layernorm import kernel_mgpu as ln
from pallas_kernels.bias_gelu import kernel_mgpu as bg


def blocks(module, rows, width, rate, spec):
    """The module's default blocks at this shape and rate, with the fields named in `spec` replaced."""
    # bias+GELU's defaults depend on the GPU kind; BDRLN's do not
    kw = {"kind": jax.devices()[0].device_kind} if module is bg else {}
    base = module.default_blocks(rows, width, rate, **kw)
    kv = dict(item.split("=") for item in spec.split(",") if item)
    return dataclasses.replace(base, **{k: (bool(int(v)) if isinstance(getattr(base, k), bool) else int(v))
                                        for k, v in kv.items()})


def run(name, rate, keys, sw):
    """Compile and run the kernel `name` (KERNEL@RxD[:spec]) once."""
    kind, shape = name.split("@")
    shape, _, spec = shape.partition(":")
    rows, width = map(int, shape.split("x"))
    x = jax.random.normal(keys[0], (rows, width), jnp.bfloat16)
    bias, scale, shift = (jax.random.normal(keys[i], (width,), jnp.float32) for i in (1, 3, 4))
    if kind == "bg_fwd":
        return bg.forward(x, bias, sw, rate=rate, interpret=False, blocks=blocks(bg, rows, width, rate, spec))
    if kind == "bg_bwd":
        return bg.backward(x, bias, sw, x, rate=rate, interpret=False, blocks=blocks(bg, rows, width, rate, spec))
    res = jax.random.normal(keys[2], (rows, width), jnp.bfloat16)
    if kind == "ln_fwd":
        return ln.forward(x, bias, res, scale, shift, sw, rate=rate, eps=1e-12, interpret=False,
                          blocks=blocks(ln, rows, width, rate, spec))
    if kind == "ln_bwd":
        stat = jnp.ones((rows,), jnp.float32)
        return ln.backward(x, bias, res, scale, sw, stat, stat, x, rate=rate, interpret=False,
                           blocks=blocks(ln, rows, width, rate, spec))
    raise SystemExit(f"unknown kernel {kind!r} in {name!r}: bg_fwd, bg_bwd, ln_fwd or ln_bwd")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rate", type=float, help="dropout rate, e.g. 0.1 or 0")
    ap.add_argument("kernels", nargs="+", metavar="KERNEL@RxD", help="e.g. bg_fwd@8192x4096 ln_bwd@8192x768")
    a = ap.parse_args()
    keys = jax.random.split(jax.random.key(0), 6)
    sw = seed_words(jnp.array([123, 456], jnp.uint32))
    for name in a.kernels:
        jax.block_until_ready(run(name, a.rate, keys, sw))
        print(name, "ran", flush=True)


if __name__ == "__main__":
    main()
