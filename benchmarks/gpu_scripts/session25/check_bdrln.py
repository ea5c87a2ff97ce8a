"""Session 25: run BDRLN's Mosaic GPU forward and VJP once per named variant and compare them with the reference, for
a GPU tool wrapped around the process (compute-sanitizer's racecheck for the kernels' own barriers; ncu for their
counters). Variants as `ab_bdrln.py`'s (`main` or `field=value,...` over `default_blocks`), each at ROWSxWIDTH.

    compute-sanitizer --tool racecheck python benchmarks/gpu_scripts/session25/check_bdrln.py \\
        "2048x1024:programs=64,bwd_programs=64" "2048x768:programs=64,bwd_programs=64,bwd_register_sums=0"
"""
import sys

import jax
import jax.numpy as jnp
import numpy as np

from ab_bdrln import blocks_of
from pallas_kernels.bias_dropout_residual_layernorm import bias_dropout_residual_layernorm, reference
from pallas_kernels.dropout import seed_from_key

RATE = 0.1


def run(spec: str):
    shape, _, fields = spec.partition(":")
    rows, width = (int(v) for v in shape.split("x"))
    k = jax.random.split(jax.random.key(3), 8)
    x, res, dy = (jax.random.normal(k[i], (rows, width), jnp.bfloat16) for i in range(3))
    bias, shift = (jax.random.normal(k[i], (width,)) for i in (3, 4))
    scale = 1 + 0.1 * jax.random.normal(k[5], (width,))
    seed = seed_from_key(k[6])
    blocks = blocks_of(fields or "main", rows, width, RATE)

    def loss(fn):
        return lambda *a: jnp.sum(fn(*a, seed=seed, rate=RATE, eps=1e-12).astype(jnp.float32) * dy)

    fused = lambda *a, **kw: bias_dropout_residual_layernorm(*a, **kw, backend="mgpu", blocks=blocks)  # noqa: E731
    args = (x, bias, res, scale, shift)
    got = jax.jit(jax.grad(loss(fused), argnums=(0, 1, 2, 3, 4)))(*args)
    want = jax.jit(jax.grad(loss(reference.bias_dropout_residual_layernorm), argnums=(0, 1, 2, 3, 4)))(*args)
    err = max(float(np.max(np.abs(np.asarray(g, np.float32) - np.asarray(w, np.float32))))
              / (float(np.max(np.abs(np.asarray(w, np.float32)))) + 1e-6) for g, w in zip(got, want))
    print(f"{spec}: {blocks}\n  max relative error of the five gradients against the reference: {err:.2e}", flush=True)
    return err


if __name__ == "__main__":
    worst = max(run(s) for s in sys.argv[1:])
    sys.exit(0 if worst < 2e-2 else 1)
