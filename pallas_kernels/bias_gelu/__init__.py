"""Bias + exact GELU (+ dropout) (Ivanov et al.'s BAD/BRD forward, BDRB backward): `dropout(gelu(x + bias))`.

`bias_gelu` here is the fused Pallas version (custom VJP; Triton kernels in `kernel.py`, Mosaic GPU ones in
`kernel_mgpu.py`, by default the Mosaic GPU ones on Hopper-or-newer GPUs where the shape allows);
`reference.py` is the ground truth.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from .. import _pallas as pk
from ..mesh import batch_shard_map
from .. import autotune
from . import kernel as _k
from . import kernel_mgpu as _k_mgpu
from . import reference
from .._mgpu import check_rows, per_shape, resolve_backend


class _PerShape:
    """`backend="auto"`: the Mosaic GPU kernels on Hopper or newer wherever they take the shard's shape (measured
    faster than Triton for every BERT shape on an H200: fwd+bwd 102 vs 117 us at 8192x3072, 128 vs 138 at
    8192x4096, 404 vs 506 at 32768x4096, benchmarks/results/kernels-h200.md), else Triton. Chosen per call from
    the per-shard shape, each with its own default blocks."""

    @staticmethod
    def pick(x, rate: float = 0.0):
        """The kernel module for the shard `x` (rows, width) and its default blocks (for dropout `rate`)."""
        return _PerShape.backends(x, rate)[0]

    @staticmethod
    def backends(x, rate: float = 0.0) -> list:
        """Every backend that takes the shard, (module, default blocks), `pick`'s first (`_mgpu.per_shape`)."""
        def takes(b):
            check_rows(*x.shape, x.dtype, b.block_rows, "block_rows")
            check_rows(*x.shape, x.dtype, b.bwd_block_rows, "bwd_block_rows")
        return per_shape(_k_mgpu, _k, *x.shape, takes, rate=rate)


# The kernel modules behind `bias_gelu` (same forward/backward contract): Triton, Mosaic GPU (Hopper), or the
# per-shape choice between them.
BACKENDS = {"auto": _PerShape, "triton": _k, "mgpu": _k_mgpu}

__all__ = ["bias_gelu", "reference"]


def bias_gelu(x, bias, *, seed=None, rate: float = 0.0, interpret: bool | None = None, blocks=None,
              backend: str = "auto"):
    """Fused `dropout(gelu(x + bias))` over (..., F) with bias (F,); float32 math, result in x's dtype. `backend`:
    "auto" (Mosaic GPU on Hopper+ where the shape allows, else Triton), "triton" or "mgpu". `blocks`: a backend's
    `Blocks` (with "auto", its class names the backend); default: the autotuner's cached choice for the shape,
    `pallas_kernels.autotune`, else the backend's `default_blocks`."""
    kernels = BACKENDS[resolve_backend(BACKENDS, backend, blocks)]
    f = x.shape[-1]
    if bias.shape != (f,):
        raise ValueError(f"bias.shape={bias.shape} must be ({f},), the last axis of x.shape={x.shape}")
    if rate and seed is None:
        raise ValueError(f"rate={rate} needs a seed")
    rows = x.size // f
    seed = None if seed is None else jnp.asarray(seed, jnp.uint32)  # None: `seed_words` gives zeros
    out = _op(x.reshape(rows, f), bias, seed, float(rate), pk.resolve_interpret(interpret), blocks, kernels)
    return out.reshape(x.shape)


def _kernels(kernels, blocks, x, bias, *, rate, interpret):
    """(kernel module, blocks) for this shard x (rows, F): the backend's module ("auto": `_PerShape.pick`) and
    `blocks` if given, else the autotuner's choice (cached, or tuned now under JAXFORMER_AUTOTUNE=tune:
    `pallas_kernels.autotune`; with "auto" it may pick the other backend), else the module's default table. The
    forward's trace tunes, the backward's reads the same cache entry."""
    others = []  # with "auto", the other backend's default is timed too when tuning
    if kernels is _PerShape:
        (kernels, default), *others = _PerShape.backends(x, rate)
        backend = "auto"  # the blocks' class selects the module
    else:
        default = kernels.default_blocks(*x.shape, rate=rate)
        backend = "mgpu" if kernels is _k_mgpu else "triton"
    if blocks is not None:
        return kernels, blocks
    seed = np.array([1, 2], np.uint32) if rate else None  # numpy: a jnp array here is a tracer of the caller's jit

    def fn(blocks_):
        return lambda x_, b_: bias_gelu(x_, b_, seed=seed, rate=rate, interpret=False, blocks=blocks_,
                                        backend=backend)

    return autotune.choose_rowwise("bias_gelu", kernels, default, fn, (x, bias), interpret=interpret, others=others,
                                   backend=backend, rows=x.shape[0], f=x.shape[1], dtype=x.dtype.name,
                                   dropout=bool(rate))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _op(x, bias, seed, rate, interpret, blocks, kernels):
    return _fwd(x, bias, seed, rate, interpret, blocks, kernels)[0]


def _split_f(rate):
    """Without dropout, F (split over `tensor` by the feed-forward weights) stays split around the kernel, which is
    element-wise in F; with dropout the mask's element index needs the whole width, so F is gathered."""
    return dict(head_dims=(1, 1, 0), out_head_dim=1) if rate == 0.0 else {}


def _drop_offset(fn, rate):  # the F-split variant passes a column offset, which rate 0 does not use
    return (lambda row_offset, _col_offset, *args: fn(row_offset, *args)) if rate == 0.0 else fn


def _fwd(x, bias, seed, rate, interpret, blocks, kernels):
    def run(row_offset, x, bias, seed):
        k, blocks_ = _kernels(kernels, blocks, x, bias, rate=rate, interpret=interpret)
        return k.forward(x, bias, pk.seed_words(seed, row_offset), rate=rate, interpret=interpret, blocks=blocks_)

    split = dict(head_dims=(1, 0), out_head_dim=1) if rate == 0.0 else {}
    return batch_shard_map(_drop_offset(run, rate), n_batched=1, **split)(x, bias, seed), (x, bias, seed)


def _bwd(rate, interpret, blocks, kernels, res, dy):
    x, bias, seed = res

    def run(row_offset, x, dy, bias, seed):
        k, blocks_ = _kernels(kernels, blocks, x, bias, rate=rate, interpret=interpret)
        return k.backward(x, bias, pk.seed_words(seed, row_offset), dy, rate=rate, interpret=interpret,
                          blocks=blocks_)

    dx, dbias = batch_shard_map(_drop_offset(run, rate), n_batched=2, **_split_f(rate))(x, dy, bias, seed)
    return dx, jnp.sum(dbias, axis=0).astype(bias.dtype), None


_op.defvjp(_fwd, _bwd)
