"""Encoder layer gradients, pallas vs xla, bf16/fp32, dropout on/off, jit vs eager: where does the layer's
fwd+bwd disagreement come from?"""
import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer import BertConfig
from jaxformer.model import EncoderLayer


def rel(a, b):
    a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    return float(jnp.linalg.norm(a - b) / jnp.maximum(jnp.linalg.norm(b), 1e-30))


key = jax.random.split(jax.random.key(1), 8)
b, s = 16, 128
for dtype in ("bfloat16", "float32"):
    x = jax.random.normal(key[0], (b, s, 1024), dtype)
    mask = jnp.arange(s)[None, :] < jax.random.randint(key[3], (b, 1), s // 2, s + 1)
    fns, state = {}, None
    for kernels in ("xla", "pallas"):
        cfg = BertConfig.preset("large", dtype=dtype, kernels=kernels)
        graphdef, st = nnx.split(EncoderLayer(cfg, rngs=nnx.Rngs(0)))
        state = st if state is None else state
        for det in (True, False):
            def run(x, state, graphdef=graphdef, det=det):
                return nnx.merge(graphdef, state)(x, mask, key=key[5], deterministic=det)
            fns[kernels, det] = run
    ct = jax.random.normal(key[6], x.shape, dtype)
    for det in (True, False):
        res = {}
        for k in ("xla", "pallas"):
            for jit in (False, True):
                f = jax.jit(fns[k, det]) if jit else fns[k, det]
                y, vjp = jax.vjp(f, x, state)
                res[k, jit] = (y,) + vjp(ct)
        for jit in (False, True):
            (yp, dxp, _), (yx, dxx, _) = res["pallas", jit], res["xla", jit]
            print(dtype, "deterministic" if det else "dropout", "jit" if jit else "eager", "y", f"{rel(yp, yx):.2e}",
                  "dx", f"{rel(dxp, dxx):.2e}",
                  "| xla jit vs eager dx", f"{rel(res['xla', True][1], res['xla', False][1]):.2e}",
                  "| pallas jit vs eager dx", f"{rel(res['pallas', True][1], res['pallas', False][1]):.2e}", flush=True)
