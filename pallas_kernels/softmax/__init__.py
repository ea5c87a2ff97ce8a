"""Scaled, masked softmax + dropout on attention scores (Ivanov et al.'s SM forward, BS backward).

`scaled_masked_softmax` runs one of the implementations in `impls.py` (the Triton kernels behind a custom VJP, or the
reference), chosen by the registry or named by `impl=`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from .. import _pallas as pk
from .. import registry
from ..mesh import batch_shard_map
from . import kernel as _k
from . import reference
from .impls import Call

__all__ = ["Call", "scaled_masked_softmax", "reference"]


def scaled_masked_softmax(scores, mask, *, scale: float, seed=None, rate: float = 0.0,
                          interpret: bool | None = None, blocks: _k.Blocks | None = None, impl: str | None = None):
    """Fused `dropout(softmax(scale * scores, masked))` over T; scores (B, N, S, T), key mask (B, T)."""
    b, n, s, t = scores.shape
    if mask.shape != (b, t):
        raise ValueError(f"mask.shape={mask.shape} must be (B, T)={(b, t)} for scores.shape={scores.shape}")
    if rate and seed is None:
        raise ValueError(f"rate={rate} needs a seed")
    interpret = pk.resolve_interpret(interpret)
    choice = registry.choose("softmax", Call(n * s, t, jnp.dtype(scores.dtype).name, float(rate)), impl=impl,
                             blocks=blocks, interpret=interpret)
    if not choice.impl.kernel:
        return choice.impl.fn(scores, mask, scale=scale, seed=seed, rate=rate)
    blocks = choice.config
    if (n * s) % blocks.block_rows or (n * s) % blocks.bwd_block_rows:
        raise ValueError(f"blocks={blocks}: block rows must divide N*S={n * s}")
    seed = None if seed is None else jnp.asarray(seed, jnp.uint32)  # None: `seed_words` gives zeros
    out = _op(scores.reshape(b * n * s, t), mask.astype(jnp.int32), seed, n * s, float(scale), float(rate),
              interpret, blocks)
    return out.reshape(scores.shape)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6, 7))
def _op(x, mask, seed, rows_per_sequence, scale, rate, interpret, blocks):
    return _fwd(x, mask, seed, rows_per_sequence, scale, rate, interpret, blocks)[0]


def _fwd(x, mask, seed, rows_per_sequence, scale, rate, interpret, blocks):
    def run(row_offset, x, mask, seed):
        return _k.forward(x, mask, pk.seed_words(seed, row_offset), rows_per_sequence=rows_per_sequence, scale=scale,
                          rate=rate, interpret=interpret, blocks=blocks)

    y, lse = batch_shard_map(run, n_batched=2)(x, mask, seed)
    return y, (x, mask, seed, lse)


def _bwd(rows_per_sequence, scale, rate, interpret, blocks, res, dy):
    x, mask, seed, lse = res

    def run(row_offset, x, mask, lse, dy, seed):
        return _k.backward(x, mask, pk.seed_words(seed, row_offset), lse, dy, rows_per_sequence=rows_per_sequence,
                           scale=scale, rate=rate, interpret=interpret, blocks=blocks)

    return batch_shard_map(run, n_batched=4)(x, mask, lse, dy, seed), None, None


_op.defvjp(_fwd, _bwd)
