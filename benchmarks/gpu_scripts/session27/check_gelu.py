"""Session 27: run bias+GELU's Mosaic GPU forward and VJP once per RxD shape (p = 0.1 unless `:0`), for ncu wrapped
around the process, and print the largest relative error of the output and both gradients against the reference.

    ncu -k regex:bias_gelu_fwd --section WarpStateStats python benchmarks/gpu_scripts/session27/check_gelu.py 2048x4096
"""
import sys

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.bias_gelu import bias_gelu, reference
from pallas_kernels.dropout import seed_from_key


def run(spec: str):
    shape, _, rate = spec.partition(":")
    rows, width = (int(v) for v in shape.split("x"))
    rate = float(rate or 0.1)
    k = jax.random.split(jax.random.key(3), 4)
    x, dy = (jax.random.normal(k[i], (rows, width), jnp.bfloat16) for i in range(2))
    b = jax.random.normal(k[2], (width,))
    seed = seed_from_key(k[3])

    def both(fn):
        return jax.jit(lambda x, b: jax.vjp(lambda x, b: fn(x, b, seed=seed, rate=rate), x, b)[1](dy)
                       + (fn(x, b, seed=seed, rate=rate),))

    got = both(lambda *a, **kw: bias_gelu(*a, **kw, backend="mgpu"))(x, b)
    want = both(reference.bias_gelu)(x, b)
    err = max(float(np.max(np.abs(np.asarray(g, np.float32) - np.asarray(w, np.float32))))
              / (float(np.max(np.abs(np.asarray(w, np.float32)))) + 1e-6) for g, w in zip(got, want))
    print(f"{spec}: max relative error against the reference {err:.2e}", flush=True)


if __name__ == "__main__":
    for spec in sys.argv[1:]:
        run(spec)
