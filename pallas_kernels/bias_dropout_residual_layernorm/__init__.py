"""Bias + dropout + residual + layernorm (Ivanov et al.'s BDRLN): `LN(residual + dropout(x + bias))`, and the plain
layernorm.

`bias_dropout_residual_layernorm` and `layer_norm` run one of the implementations in `impls.py` (the Mosaic GPU
kernels, the Triton ones, or the reference), chosen by the registry for the per-shard call or named by `impl=`; the
kernels' forward and backward share one custom VJP and run per batch shard under a mesh.
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
from .impls import Call, call_of

__all__ = ["Call", "bias_dropout_residual_layernorm", "layer_norm", "reference"]


def bias_dropout_residual_layernorm(x, bias, residual, scale, ln_bias, *, seed, rate: float, eps: float,
                                    interpret: bool | None = None, blocks=None, impl: str | None = None):
    """Fused `LN(residual + dropout(x + bias))` over the last axis; same contract as `reference`'s function. `impl`
    names an implementation (`impls.py`; default: the registry's choice for the per-shard call); `blocks` its config
    (default: the autotuner's cached choice, `pallas_kernels.autotune`, else the implementation's default)."""
    return _fused("bias_dropout_residual_layernorm", x, bias, residual, scale, ln_bias, seed, rate=rate, eps=eps,
                  interpret=interpret, blocks=blocks, impl=impl)


def layer_norm(x, scale, ln_bias, *, eps: float, interpret: bool | None = None, blocks=None, impl: str | None = None):
    """Fused plain layernorm over the last axis (float32 statistics), result in x's dtype."""
    return _fused("layer_norm", x, None, None, scale, ln_bias, None, rate=0.0, eps=eps, interpret=interpret,
                  blocks=blocks, impl=impl)


def _fused(op, x, bias, residual, scale, shift, seed, *, rate, eps, interpret, blocks, impl):
    d = x.shape[-1]
    for name, v in (("bias", bias), ("scale", scale), ("ln_bias", shift)):
        if v is not None and v.shape != (d,):
            raise ValueError(f"{name}.shape={v.shape} must be ({d},), the last axis of x.shape={x.shape}")
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"residual.shape={residual.shape} must equal x.shape={x.shape}")
    if rate and seed is None:
        raise ValueError(f"rate={rate} needs a seed")
    rows, rate, interpret = x.size // d, float(rate), pk.resolve_interpret(interpret)
    call = call_of(x, residual, bias, rate, rows // shard_counts(current_mesh())[0])
    device = registry.Device.current()
    choice = registry.choose(op, call, device, impl=impl, blocks=blocks, interpret=interpret)
    if not choice.impl.kernel:
        if op == "layer_norm":
            return choice.impl.fn(x, scale, shift, eps=eps)
        return choice.impl.fn(x, bias, residual, scale, shift, seed=seed, rate=rate, eps=eps)
    if blocks is None:
        choice = _tuned(op, call, device, choice, x, bias, residual, scale, shift, eps=eps, interpret=interpret,
                        named=impl is not None)
    seed = None if seed is None else jnp.asarray(seed, jnp.uint32)
    flat = lambda a: None if a is None else a.reshape(rows, d)  # noqa: E731
    out = _op(flat(x), bias, flat(residual), scale, shift, seed, rate, eps, interpret, choice.impl.module,
              choice.config)
    return out.reshape(x.shape)


def _tuned(op, call, device, choice, x, bias, residual, scale, shift, *, eps, interpret, named):
    """`autotune.tuned` for one call: forward+backward timed on random operands of the shard's shapes."""
    operands = dict(x=x, bias=bias, residual=residual, scale=scale, shift=shift)
    names = tuple(operands)  # names only in what the tuner's thread runs: no tracer of this trace goes there
    present = [name for name in names if operands[name] is not None]
    seed = np.array([1, 2], np.uint32) if call.rate else None  # numpy: a jnp array here is a tracer of the caller
    shard = {"x": (call.rows, call.width), "residual": (call.rows, call.width)}

    def fn(c):
        def run(*args):
            a = dict.fromkeys(names) | dict(zip(present, args))
            return bias_dropout_residual_layernorm(a["x"], a["bias"], a["residual"], a["scale"], a["shift"],
                                                   seed=seed, rate=call.rate, eps=eps, interpret=False,
                                                   blocks=c.config, impl=c.impl.name)
        return run

    like = [jax.ShapeDtypeStruct(shard.get(name, operands[name].shape), operands[name].dtype) for name in present]
    return autotune.tuned(op, call, device, choice, fn, like, interpret=interpret, named=named)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8, 9, 10))
def _op(x, bias, residual, scale, shift, seed, rate, eps, interpret, module, blocks):
    return _fwd(x, bias, residual, scale, shift, seed, rate, eps, interpret, module, blocks)[0]


def _fwd(x, bias, residual, scale, shift, seed, rate, eps, interpret, module, blocks):
    def run(row_offset, x, residual, bias, scale, shift, seed):
        return module.forward(x, bias, residual, scale, shift, pk.seed_words(seed, row_offset), rate=rate, eps=eps,
                              interpret=interpret, blocks=blocks)

    y, mean, rstd = batch_shard_map(run, n_batched=2)(x, residual, bias, scale, shift, seed)
    return y, (x, bias, residual, scale, shift, seed, mean, rstd)


def _bwd_partials(rate, eps, interpret, module, blocks, res, dy):
    """The backward kernels per batch shard: dx, d_residual and the sums (1, D) per shard of d_scale, d_shift and
    d_bias (None without a bias), the kernel's per-program partials summed by `column_sums`."""
    x, bias, residual, scale, shift, seed, mean, rstd = res

    def run(row_offset, x, residual, mean, rstd, dy, bias, scale, seed):
        dx, dres, *partials = module.backward(x, bias, residual, scale, pk.seed_words(seed, row_offset), mean, rstd,
                                              dy, rate=rate, interpret=interpret, blocks=blocks)
        return dx, dres, *pk.column_sums(*partials, interpret=interpret)  # (1, D) per shard, one launch

    dx, dres, dscale, dshift, dbias = batch_shard_map(run, n_batched=5)(x, residual, mean, rstd, dy, bias, scale,
                                                                            seed)
    if residual is not None and dres is None:
        dres = dx.astype(residual.dtype)  # no dropout: the residual's gradient is dx itself
    return dx, dres, dscale, dshift, dbias


def _bwd(rate, eps, interpret, module, blocks, res, dy):
    _, bias, _, scale, shift, *_ = res
    dx, dres, dscale, dshift, dbias = _bwd_partials(rate, eps, interpret, module, blocks, res, dy)
    # The per-shard sums summed over the batch shards (one device: a (1, D) reshape, no kernel). Within a shard the
    # three partial sums are one `column_sums` launch, 2.2-3.3 us of device time against three XLA reductions' 4.8-7.1
    # (H200); one variadic `lax.reduce` instead made the SPMD partitioner all-gather around it on a pipeline x data
    # mesh (20 all-gathers in tests/test_pipeline.py).
    total = lambda p, like: None if p is None else jnp.sum(p, axis=0).astype(like.dtype)  # noqa: E731
    return (dx, total(dbias, bias), dres, total(dscale, scale), total(dshift, shift), None)


_op.defvjp(_fwd, _bwd)
