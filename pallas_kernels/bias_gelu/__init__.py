"""Bias + exact GELU (+ dropout) (Ivanov et al.'s BAD/BRD forward, BDRB backward): `dropout(gelu(x + bias))`.

`bias_gelu` runs one of the implementations in `impls.py` (the Mosaic GPU kernels, the Triton ones, or the
reference), chosen by the registry for the per-shard call or named by `impl=`; the kernels' forward and backward
share one custom VJP and run per batch shard under a mesh.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from .. import _pallas as pk
from .. import autotune, registry
from ..mesh import batch_shard_map, current_mesh, shard_counts
from . import kernel, kernel_mgpu, reference  # noqa: F401  (the implementations' modules, for callers)
from .impls import Call

__all__ = ["Call", "bias_gelu", "reference"]


def bias_gelu(x, bias, *, seed=None, rate: float = 0.0, interpret: bool | None = None, blocks=None,
              impl: str | None = None):
    """Fused `dropout(gelu(x + bias))` over (..., F) with bias (F,); float32 math, result in x's dtype. `impl` names
    an implementation (`impls.py`; default: the registry's choice for the per-shard call); `blocks` its config
    (default: the autotuner's cached choice, `pallas_kernels.autotune`, else the implementation's default)."""
    f = x.shape[-1]
    if bias.shape != (f,):
        raise ValueError(f"bias.shape={bias.shape} must be ({f},), the last axis of x.shape={x.shape}")
    if rate and seed is None:
        raise ValueError(f"rate={rate} needs a seed")
    rows, rate, interpret = x.size // f, float(rate), pk.resolve_interpret(interpret)
    shards, heads = shard_counts(current_mesh(), heads=not rate)  # without dropout F is split over `tensor` too
    call = Call(rows // shards, f // heads, jnp.dtype(x.dtype).name, rate)
    device = registry.Device.current()
    choice = registry.choose("bias_gelu", call, device, impl=impl, blocks=blocks, interpret=interpret)
    if not choice.impl.kernel:
        return choice.impl.fn(x, bias, seed=seed, rate=rate)
    if blocks is None:
        tune_seed = np.array([1, 2], np.uint32) if rate else None  # numpy: a jnp array here is a tracer of the caller

        def fn(c):
            return lambda x_, b_: bias_gelu(x_, b_, seed=tune_seed, rate=rate, interpret=False, blocks=c.config,
                                            impl=c.impl.name)

        like = [jax.ShapeDtypeStruct((call.rows, call.width), x.dtype), jax.ShapeDtypeStruct((call.width,), bias.dtype)]
        choice = autotune.tuned("bias_gelu", call, device, choice, fn, like, interpret=interpret,
                                named=impl is not None)
    seed = None if seed is None else jnp.asarray(seed, jnp.uint32)  # None: `seed_words` gives zeros
    out = _op(x.reshape(rows, f), bias, seed, rate, interpret, choice.impl.module, choice.config)
    return out.reshape(x.shape)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _op(x, bias, seed, rate, interpret, module, blocks):
    return _fwd(x, bias, seed, rate, interpret, module, blocks)[0]


def _split_f(rate):
    """Without dropout, F (split over `tensor` by the feed-forward weights) stays split around the kernel, which is
    element-wise in F; with dropout the mask's element index needs the whole width, so F is gathered."""
    return dict(head_dims=(1, 1, 0), out_head_dim=1) if rate == 0.0 else {}


def _drop_offset(fn, rate):  # the F-split variant passes a column offset, which rate 0 does not use
    return (lambda row_offset, _col_offset, *args: fn(row_offset, *args)) if rate == 0.0 else fn


def _fwd(x, bias, seed, rate, interpret, module, blocks):
    def run(row_offset, x, bias, seed):
        return module.forward(x, bias, pk.seed_words(seed, row_offset), rate=rate, interpret=interpret, blocks=blocks)

    split = dict(head_dims=(1, 0), out_head_dim=1) if rate == 0.0 else {}
    return batch_shard_map(_drop_offset(run, rate), n_batched=1, **split)(x, bias, seed), (x, bias, seed)


def _bwd(rate, interpret, module, blocks, res, dy):
    x, bias, seed = res

    def run(row_offset, x, dy, bias, seed):
        return module.backward(x, bias, pk.seed_words(seed, row_offset), dy, rate=rate, interpret=interpret,
                               blocks=blocks)

    dx, dbias = batch_shard_map(_drop_offset(run, rate), n_batched=2, **_split_f(rate))(x, dy, bias, seed)
    return dx, jnp.sum(dbias, axis=0).astype(bias.dtype), None


_op.defvjp(_fwd, _bwd)
