"""Bias + dropout + residual + layernorm (Ivanov et al.'s BDRLN): `LN(residual + dropout(x + bias))`.

`bias_dropout_residual_layernorm` and `layer_norm` here are the fused Pallas versions (custom VJP: forward and
backward kernels in `kernel.py` (Triton), or the Mosaic GPU ones in `kernel_mgpu.py`; by default per shard shape,
`_PerShape`); the pure jax.numpy ground truth is in `reference.py`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from .. import _mgpu, autotune
from .. import _pallas as pk
from ..mesh import batch_shard_map
from .._mgpu import per_shape, resolve_backend
from . import kernel as _k
from . import kernel_mgpu as _k_mgpu
from . import reference

MIN_MGPU_ROWS = 16384  # Mosaic GPU from this many rows where its backward sums columns in SMEM only ...
MIN_MGPU_ROWS_REGISTER_SUMS = 8192  # ... and from this many where it carries some in registers (768 and 1024 wide)
# Where one GPU kind measured Triton faster with dropout although the rule above picks Mosaic GPU: {(device-kind
# substring, width): rows from which Triton runs when rate > 0}. The H100 at 32768 x 1024, p = 0.1: Triton 203.3-206.6
# us of device time, Mosaic GPU 215.2-219.8 (sessions 21-23); at 16384 x 1024 the two were equal, and at p = 0 Mosaic
# GPU was faster there (218.2 against 225.2; kernels-h100.md, "Session 23").
TRITON_FROM_ROWS = {("H100", 1024): 32768}


class _PerShape:
    """`backend="auto"` (the default): the Mosaic GPU kernels on Hopper or newer where they take the shape, for shards
    of at least `MIN_MGPU_ROWS` rows, or `MIN_MGPU_ROWS_REGISTER_SUMS` where the backward carries column sums in
    registers (`kernel_mgpu.default_blocks(...).bwd_register_sums`: 768 and 1024 wide), else Triton. Measured: session
    20's alternating fwd+bwd (benchmarks/results/kernels-h200.md and kernels-h100.md; D = 768 and 1024, p = 0 and 0.1)
    had Mosaic GPU's time at 0.83-1.00 (H200) and 0.87-1.00 (H100) of Triton's at 16384 and 32768 rows and 1.03-1.29
    at 8192 rows, before its register sums; with them, BERT-base's train step at B64 S128 (8192 rows of 768) ran
    2.0-2.8% faster on Mosaic GPU (session 21, H200, alternating), and at 8192 rows of 1024 (BERT-large) the op took
    47.1 against Triton's 50.3 us of device time with dropout, 49.9 against 52.7 without (session 22, H200). Except
    with dropout where `TRITON_FROM_ROWS` names the GPU kind and width (the H100 at 1024 wide from 32768 rows)."""

    @staticmethod
    def pick(x, out_dtype, rate: float = 0.0):
        """The kernel module for the shard `x` (rows, D) whose output is in `out_dtype`, and its default blocks (for
        dropout `rate`)."""
        return _PerShape.backends(x, out_dtype, rate)[0]

    @staticmethod
    def backends(x, out_dtype, rate: float = 0.0) -> list:
        """Every backend that takes the shard, (module, default blocks), `pick`'s first (`_mgpu.per_shape`)."""
        rows, width = x.shape
        register_sums = _k_mgpu.default_blocks(rows, width, rate=rate).bwd_register_sums
        prefer = rows >= (MIN_MGPU_ROWS_REGISTER_SUMS if register_sums else MIN_MGPU_ROWS)
        if prefer:
            kind = _mgpu.device_kind()
            prefer = not (rate and any(w == width and name in kind and rows >= r
                                       for (name, w), r in TRITON_FROM_ROWS.items()))
        return per_shape(_k_mgpu, _k, rows, width,
                         lambda blocks: _k_mgpu.check_shape(rows, width, x.dtype, out_dtype, blocks),
                         prefer_mgpu=prefer, rate=rate)


# The kernel modules behind the public functions (same forward/backward contract): Triton, Mosaic GPU (Hopper), or
# the per-shape choice between them.
BACKENDS = {"auto": _PerShape, "triton": _k, "mgpu": _k_mgpu}

__all__ = ["bias_dropout_residual_layernorm", "layer_norm", "reference"]


def bias_dropout_residual_layernorm(x, bias, residual, scale, ln_bias, *, seed, rate: float, eps: float,
                                    interpret: bool | None = None, blocks=None, backend: str = "auto"):
    """Fused `LN(residual + dropout(x + bias))` over the last axis; same contract as `reference`'s function.
    `backend`: "auto" (Mosaic GPU on Hopper+ for shards of >= 8192 rows up to 1024 wide, >= 16384 wider, where the
    shape allows, else Triton: `_PerShape`), "triton" or "mgpu". `blocks`: a backend's `Blocks` (with "auto", its
    class names the backend); default: the autotuner's cached choice for the shape, `pallas_kernels.autotune`, else the
    backend's `default_blocks`."""
    return _fused(x, bias, residual, scale, ln_bias, seed, rate=rate, eps=eps, interpret=interpret, blocks=blocks,
                  backend=backend)


def layer_norm(x, scale, ln_bias, *, eps: float, interpret: bool | None = None, blocks=None, backend: str = "auto"):
    """Fused plain layernorm over the last axis (float32 statistics), result in x's dtype."""
    return _fused(x, None, None, scale, ln_bias, None, rate=0.0, eps=eps, interpret=interpret, blocks=blocks,
                  backend=backend)


def _fused(x, bias, residual, scale, shift, seed, *, rate, eps, interpret, blocks, backend):
    kernels = BACKENDS[resolve_backend(BACKENDS, backend, blocks)]
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


def _kernels(kernels, blocks, x, bias, residual, scale, shift, *, rate, eps, interpret):
    """(kernel module, blocks) for this shard's (rows, D): the backend's module ("auto": `_PerShape.pick`) and
    `blocks` if given, else the autotuner's choice (cached, or tuned now under JAXFORMER_AUTOTUNE=tune:
    `pallas_kernels.autotune`; with "auto" it may pick the other backend), else the module's default table. Called by
    the forward and the backward alike (the same shard shape and dtypes, so the same module): the forward's trace
    tunes, the backward's reads the same cache entry."""
    rows, d = x.shape
    others = []  # with "auto", the other backend's default is timed too when tuning
    if kernels is _PerShape:
        (kernels, default), *others = _PerShape.backends(x, (x if residual is None else residual).dtype, rate)
        backend = "auto"  # the blocks' class selects the module
    else:
        default = kernels.default_blocks(rows, d, rate=rate)
        backend = "mgpu" if kernels is _k_mgpu else "triton"
    if blocks is not None:
        return kernels, blocks
    operands = dict(x=x, bias=bias, residual=residual, scale=scale, shift=shift)
    names = tuple(operands)  # names only in what the tuner's thread runs: no tracer of this trace goes there
    present = [name for name in names if operands[name] is not None]
    seed = np.array([1, 2], np.uint32) if rate else None  # numpy: a jnp array here is a tracer of the caller's jit

    def fn(blocks_):
        def op(*args):
            a = dict.fromkeys(names) | dict(zip(present, args))
            return bias_dropout_residual_layernorm(a["x"], a["bias"], a["residual"], a["scale"], a["shift"],
                                                   seed=seed, rate=rate, eps=eps, interpret=False, blocks=blocks_,
                                                   backend=backend)
        return op

    return autotune.choose_rowwise(
        "bdrln", kernels, default, fn, [operands[name] for name in present], interpret=interpret, others=others,
        backend=backend, rows=rows, d=d, dtype=x.dtype.name, residual=None if residual is None else residual.dtype.name,
        bias=bias is not None, dropout=bool(rate))


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8, 9, 10))
def _op(x, bias, residual, scale, shift, seed, rate, eps, interpret, blocks, kernels):
    return _fwd(x, bias, residual, scale, shift, seed, rate, eps, interpret, blocks, kernels)[0]


def _fwd(x, bias, residual, scale, shift, seed, rate, eps, interpret, blocks, kernels):
    def run(row_offset, x, residual, bias, scale, shift, seed):
        k, blocks_ = _kernels(kernels, blocks, x, bias, residual, scale, shift, rate=rate, eps=eps,
                              interpret=interpret)
        return k.forward(x, bias, residual, scale, shift, pk.seed_words(seed, row_offset), rate=rate, eps=eps,
                         interpret=interpret, blocks=blocks_)

    y, mean, rstd = batch_shard_map(run, n_batched=2)(x, residual, bias, scale, shift, seed)
    return y, (x, bias, residual, scale, shift, seed, mean, rstd)


def _bwd_partials(rate, eps, interpret, blocks, kernels, res, dy):
    """The backward kernels per batch shard: dx, d_residual and the sums (1, D) per shard of d_scale, d_shift and
    d_bias (None without a bias), the kernel's per-program partials summed by `column_sums`."""
    x, bias, residual, scale, shift, seed, mean, rstd = res

    def run(row_offset, x, residual, mean, rstd, dy, bias, scale, seed):
        k, blocks_ = _kernels(kernels, blocks, x, bias, residual, scale, shift, rate=rate, eps=eps,
                              interpret=interpret)
        dx, dres, *partials = k.backward(x, bias, residual, scale, pk.seed_words(seed, row_offset), mean, rstd, dy,
                                         rate=rate, interpret=interpret, blocks=blocks_)
        return dx, dres, *pk.column_sums(*partials, interpret=interpret)  # (1, D) per shard, one launch

    dx, dres, dscale, dshift, dbias = batch_shard_map(run, n_batched=5)(x, residual, mean, rstd, dy, bias, scale,
                                                                            seed)
    if residual is not None and dres is None:
        dres = dx.astype(residual.dtype)  # no dropout: the residual's gradient is dx itself
    return dx, dres, dscale, dshift, dbias


def _bwd(rate, eps, interpret, blocks, kernels, res, dy):
    _, bias, _, scale, shift, *_ = res
    dx, dres, dscale, dshift, dbias = _bwd_partials(rate, eps, interpret, blocks, kernels, res, dy)
    # The per-shard sums summed over the batch shards (one device: a (1, D) reshape, no kernel). Within a shard the
    # three partial sums are one `column_sums` launch, 2.2-3.3 us of device time against three XLA reductions' 4.8-7.1
    # (H200, session 23); one variadic `lax.reduce` instead made the SPMD partitioner all-gather around it on a
    # pipeline x data mesh (20 all-gathers in tests/test_pipeline.py; session 21).
    total = lambda p, like: None if p is None else jnp.sum(p, axis=0).astype(like.dtype)  # noqa: E731
    return (dx, total(dbias, bias), dres, total(dscale, scale), total(dshift, shift), None)


_op.defvjp(_fwd, _bwd)
