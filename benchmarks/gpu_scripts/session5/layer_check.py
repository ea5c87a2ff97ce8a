"""Which gradient of the encoder layer (pallas vs xla) is off, with bias_gelu on auto (Mosaic GPU) and on Triton."""
import sys
import jax
import jax.numpy as jnp
import pallas_kernels.bias_gelu as bg
from benchmarks.kernels import cases


def rel(a, b):
    a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    return float(jnp.linalg.norm(a - b) / jnp.maximum(jnp.linalg.norm(b), 1e-30))


def outs(f, args):
    y, vjp = jax.vjp(f, *args)
    return y, vjp(y)


for backend in sys.argv[1:]:
    bg.BACKENDS["auto"] = {"auto": bg._PerShape, "triton": bg._k, "mgpu": bg._k_mgpu}[backend]
    for op, label, impls, args, n_in, *_ in cases(["layer"], jnp.bfloat16):
        yp, gp = outs(impls["pallas"], args)
        yx, gx = outs(impls["xla"], args)
        print(backend, label, "y", rel(yp, yx), "dx", rel(gp[0], gx[0]), flush=True)
        flat_p = jax.tree_util.tree_flatten_with_path(gp[1])[0]
        flat_x = jax.tree.leaves(gx[1])
        for (path, a), b in zip(flat_p, flat_x):
            r = rel(a, b)
            if r > 1e-2:
                print("   ", jax.tree_util.keystr(path), a.shape, f"{r:.3e}", flush=True)
