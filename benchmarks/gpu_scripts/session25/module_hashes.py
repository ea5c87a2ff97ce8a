"""Session 25: a hash of each Mosaic GPU module (its MLIR without debug locations) that bias+GELU's and BDRLN's
kernels lower to for CUDA, on any machine (no GPU: `lower(lowering_platforms=("cuda",))`), for 36 configurations
(both rates; BDRLN at 768 and 1024 wide with its default blocks and three variants). Two trees that print the same
hashes compile to the same kernels: the review mend after run 16 was checked this way (`git stash`, run, compare).

    PYTHONPATH=. python benchmarks/gpu_scripts/session25/module_hashes.py > hashes.txt
"""
import dataclasses
import functools
import hashlib

import jax
import jax.numpy as jnp
from jax._src.interpreters import mlir
from jax.experimental.mosaic.gpu import core

from pallas_kernels._pallas import seed_words
from pallas_kernels.bias_dropout_residual_layernorm import kernel_mgpu as ln
from pallas_kernels.bias_gelu import kernel_mgpu as bg

MODULES: list[str] = []


def _capture(ctx, *args, module, **kw):  # Mosaic GPU's own lowering rule, recording the module first
    MODULES.append(module.operation.get_asm(enable_debug_info=False))
    return _lower(ctx, *args, module=module, **kw)


_lower = core._mosaic_gpu_lowering_rule
core._mosaic_gpu_lowering_rule = _capture  # where Pallas' lowering calls it by name
mlir.register_lowering(core.mosaic_gpu_p, _capture, "cuda")


def cases():
    w = seed_words(jnp.array([1, 2], jnp.uint32))
    for rate in (0.1, 0.0):
        x, v = jnp.zeros((8192, 4096), jnp.bfloat16), jnp.zeros((4096,))
        kw = dict(rate=rate, interpret=False, blocks=bg.default_blocks(8192, 4096, rate=rate))
        yield "bg_fwd", rate, functools.partial(bg.forward, **kw), (x, v, w)
        yield "bg_bwd", rate, functools.partial(bg.backward, **kw), (x, v, w, x)
        for width in (768, 1024):
            for extra in ({}, {"auto_barriers": True}, {"bwd_params_smem": True, "bwd_register_sums": 3},
                          {"fwd_direct_store": False}):
                x, v, st = jnp.zeros((8192, width), jnp.bfloat16), jnp.zeros((width,)), jnp.zeros((8192,))
                kw = dict(rate=rate, interpret=False,
                          blocks=dataclasses.replace(ln.default_blocks(8192, width, rate=rate), **extra))
                yield f"ln_fwd@{width}{extra}", rate, functools.partial(ln.forward, eps=1e-12, **kw), (x, v, x, v, v, w)
                yield f"ln_bwd@{width}{extra}", rate, functools.partial(ln.backward, **kw), (x, v, x, v, w, st, st, x)


for name, rate, fn, args in cases():
    jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
    assert MODULES, f"{name}: no Mosaic GPU module captured"
    print(name, rate, hashlib.sha256("".join(MODULES).encode()).hexdigest()[:16], flush=True)
    MODULES.clear()
