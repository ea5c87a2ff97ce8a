"""Bias + dropout + residual + layernorm (Ivanov et al.'s BDRLN): `LN(residual + dropout(x + bias))`.

`bias_dropout_residual_layernorm` and `layer_norm` here are the fused Pallas versions (custom VJP: forward and
backward kernels in `kernel.py`, or the Mosaic GPU ones in `kernel_mgpu.py` with `backend="mgpu"`); the pure
jax.numpy ground truth is in `reference.py`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from .. import _pallas as pk
from .. import autotune
from . import kernel as _k
from . import kernel_mgpu as _k_mgpu
from . import reference

# The kernel modules behind the public functions (same forward/backward contract): Triton, or Mosaic GPU (Hopper;
# measured slower so far, benchmarks/results/kernels-h200.md).
BACKENDS = {"triton": _k, "mgpu": _k_mgpu}

__all__ = ["bias_dropout_residual_layernorm", "layer_norm", "reference"]


def bias_dropout_residual_layernorm(x, bias, residual, scale, ln_bias, *, seed, rate: float, eps: float,
                                    interpret: bool | None = None, blocks=None, backend: str = "triton"):
    """Fused `LN(residual + dropout(x + bias))` over the last axis; same contract as `reference`'s function.
    `blocks` is the chosen backend's `Blocks` (default: the autotuner's cached choice for the shape,
    `pallas_kernels.autotune`, else the backend's `default_blocks`)."""
    return _fused(x, bias, residual, scale, ln_bias, seed, rate=rate, eps=eps, interpret=interpret, blocks=blocks,
                  backend=backend)


def layer_norm(x, scale, ln_bias, *, eps: float, interpret: bool | None = None, blocks=None, backend: str = "triton"):
    """Fused plain layernorm over the last axis (float32 statistics), result in x's dtype."""
    return _fused(x, None, None, scale, ln_bias, None, rate=0.0, eps=eps, interpret=interpret, blocks=blocks,
                  backend=backend)


def _fused(x, bias, residual, scale, shift, seed, *, rate, eps, interpret, blocks, backend):
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} must be one of {tuple(BACKENDS)}")
    kernels = BACKENDS[backend]
    d = x.shape[-1]
    for name, v in (("bias", bias), ("scale", scale), ("ln_bias", shift)):
        if v is not None and v.shape != (d,):
            raise ValueError(f"{name}.shape={v.shape} must be ({d},), the last axis of x.shape={x.shape}")
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"residual.shape={residual.shape} must equal x.shape={x.shape}")
    if rate and seed is None:
        raise ValueError(f"rate={rate} needs a seed")
    rows = x.size // d
    seed = None if seed is None else jnp.asarray(seed, jnp.uint32)
    flat = lambda a: None if a is None else a.reshape(rows, d)  # noqa: E731
    out = _op(flat(x), bias, flat(residual), scale, shift, seed, float(rate), eps, pk.resolve_interpret(interpret),
              blocks, kernels)
    return out.reshape(x.shape)


def _blocks(kernels, blocks, x, bias, residual, scale, shift, *, rate, eps, interpret):
    """`blocks` if given; else, for this shard's (rows, D), the autotuner's choice (cached, or tuned now under
    JAXFORMER_AUTOTUNE=tune: `pallas_kernels.autotune`), else the default table. Called by the forward and the
    backward alike: the forward's trace tunes, the backward's reads the same cache entry."""
    if blocks is not None:
        return blocks
    rows, d = x.shape
    default = kernels.default_blocks(rows, d)
    operands = dict(x=x, bias=bias, residual=residual, scale=scale, shift=shift)
    names = tuple(operands)  # names only in what the tuner's thread runs: no tracer of this trace goes there
    present = [name for name in names if operands[name] is not None]
    backend = next(name for name, k in BACKENDS.items() if k is kernels)
    seed = np.array([1, 2], np.uint32) if rate else None  # numpy: a jnp array here is a tracer of the caller's jit

    def fn(blocks_):
        def op(*args):
            a = dict.fromkeys(names) | dict(zip(present, args))
            return bias_dropout_residual_layernorm(a["x"], a["bias"], a["residual"], a["scale"], a["shift"],
                                                   seed=seed, rate=rate, eps=eps, interpret=False, blocks=blocks_,
                                                   backend=backend)
        return op

    return autotune.choose_rowwise(
        "bdrln", kernels, default, fn, [operands[name] for name in present], interpret=interpret, backend=backend,
        rows=rows, d=d, dtype=x.dtype.name, residual=None if residual is None else residual.dtype.name,
        bias=bias is not None, dropout=bool(rate))


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8, 9, 10))
def _op(x, bias, residual, scale, shift, seed, rate, eps, interpret, blocks, kernels):
    return _fwd(x, bias, residual, scale, shift, seed, rate, eps, interpret, blocks, kernels)[0]


def _fwd(x, bias, residual, scale, shift, seed, rate, eps, interpret, blocks, kernels):
    def run(row_offset, x, residual, bias, scale, shift, seed):
        blocks_ = _blocks(kernels, blocks, x, bias, residual, scale, shift, rate=rate, eps=eps, interpret=interpret)
        return kernels.forward(x, bias, residual, scale, shift, pk.seed_words(seed, row_offset), rate=rate, eps=eps,
                               interpret=interpret, blocks=blocks_)

    y, mean, rstd = pk.batch_shard_map(run, n_batched=2)(x, residual, bias, scale, shift, seed)
    return y, (x, bias, residual, scale, shift, seed, mean, rstd)


def _bwd(rate, eps, interpret, blocks, kernels, res, dy):
    x, bias, residual, scale, shift, seed, mean, rstd = res

    def run(row_offset, x, residual, mean, rstd, dy, bias, scale, seed):
        blocks_ = _blocks(kernels, blocks, x, bias, residual, scale, shift, rate=rate, eps=eps, interpret=interpret)
        return kernels.backward(x, bias, residual, scale, pk.seed_words(seed, row_offset), mean, rstd, dy, rate=rate,
                                interpret=interpret, blocks=blocks_)

    dx, dres, dscale, dshift, dbias = pk.batch_shard_map(run, n_batched=5)(x, residual, mean, rstd, dy, bias, scale,
                                                                            seed)
    if residual is not None and dres is None:
        dres = dx.astype(residual.dtype)  # no dropout: the residual's gradient is dx itself
    total = lambda p, like: None if p is None else jnp.sum(p, axis=0).astype(like.dtype)  # noqa: E731
    return (dx, total(dbias, bias), dres, total(dscale, scale), total(dshift, shift), None)


_op.defvjp(_fwd, _bwd)
