import functools, sys, jax, jax.numpy as jnp
from pallas_kernels import _pallas as pk
from pallas_kernels.bias_dropout_residual_layernorm import kernel_mgpu as ln
from pallas_kernels.bias_gelu import kernel_mgpu as bg
words = pk.seed_words(jnp.array([1, 2], jnp.uint32))
rows_list = sorted({b * s for b in (8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 96, 112, 128, 160, 192, 256) for s in (128, 512)
                    if 2048 <= b * s <= 65536})
fails = []
def lower(fn, *args):
    jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
for rows in rows_list:
    for width in (768, 1024):
        for rate in (0.1, 0.0):
            blocks = ln.default_blocks(rows, width, rate=rate)
            try:
                ln.check_shape(rows, width, jnp.bfloat16, jnp.bfloat16, blocks)
            except ValueError:
                continue
            x, v, st = jnp.zeros((rows, width), jnp.bfloat16), jnp.zeros((width,)), jnp.zeros((rows,))
            for name, fn, args in (("fwd", functools.partial(ln.forward, eps=1e-12, rate=rate, interpret=False, blocks=blocks), (x, v, x, v, v, words)),
                                   ("bwd", functools.partial(ln.backward, rate=rate, interpret=False, blocks=blocks), (x, v, x, v, words, st, st, x))):
                try:
                    lower(fn, *args)
                except Exception as e:
                    fails.append(("bdrln", name, rows, width, rate, str(e)[:90])); print(fails[-1], flush=True)
    for width in (3072, 4096):
        for rate in (0.1, 0.0):
            blocks = bg.default_blocks(rows, width, rate=rate)
            x, v = jnp.zeros((rows, width), jnp.bfloat16), jnp.zeros((width,))
            for name, fn, args in (("fwd", functools.partial(bg.forward, rate=rate, interpret=False, blocks=blocks), (x, v, words)),
                                   ("bwd", functools.partial(bg.backward, rate=rate, interpret=False, blocks=blocks), (x, v, words, x))):
                try:
                    lower(fn, *args)
                except Exception as e:
                    fails.append(("gelu", name, rows, width, rate, str(e)[:90])); print(fails[-1], flush=True)
    print("rows", rows, "done", flush=True)
print("FAILS", len(fails))
