"""Pallas (Triton) kernels of the scaled, masked softmax + dropout over attention scores (Ivanov's SM and BS).

Scores (B, N, S, T) are viewed as rows of width T; the key mask (B, T) is read once per tile (a tile's rows all
belong to one sequence: `block_rows` divides N·S). Forward writes the (dropped-out) probabilities and the float32
log-sum-exp of each row; the backward recomputes the probabilities from the scores and that statistic instead of
storing them, and regenerates the dropout mask: dx = scale · p · (dp − Σ p·dp), with dp = dropout'(dy).
Bytes (2-byte scores): forward reads x, writes y (2·RT·2); backward reads x, dy, writes dx (3·RT·2).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from .. import _pallas as pk
from ..dropout import keep_scale

_MASKED = float(jnp.finfo(jnp.float32).min)  # what the reference gives masked keys before the softmax


@dataclasses.dataclass(frozen=True)
class Blocks:
    block_rows: int = 16
    num_warps: int = 4
    bwd_block_rows: int = 16
    bwd_num_warps: int = 4
    num_stages: int = 1
    bwd_num_stages: int = 1  # >1 lets Triton prefetch the next chunk of the backward's row loop


def default_blocks(rows_per_sequence: int, width: int) -> Blocks:
    br = max(1, 4096 // pk.next_pow2(width))
    br = math.gcd(br, rows_per_sequence)
    return Blocks(block_rows=br, bwd_block_rows=br)


def _scores(x_ref, mask_ref, *, first_row, rows, width, scale, block_rows):
    wp = x_ref.shape[-1]
    r, c, m = pk.row_col_mask(first_row, block_rows, rows, wp, width)
    real = pk.load(mask_ref, c < width, 0) != 0
    s = pk.load(x_ref, m).astype(jnp.float32) * scale
    s = jnp.where(real[None, :], s, _MASKED)
    return jnp.where((c < width)[None, :], s, -jnp.inf), real, r, c, m


def _fwd_kernel(x_ref, mask_ref, seed_ref, y_ref, lse_ref, *, rows, width, scale, rate, block_rows):
    first = pl.program_id(0) * block_rows
    s, _, r, c, m = _scores(x_ref, mask_ref, first_row=first, rows=rows, width=width, scale=scale,
                            block_rows=block_rows)
    mx = jnp.max(s, axis=1)
    e = jnp.exp(s - mx[:, None])
    total = jnp.sum(e, axis=1)
    p = e / total[:, None]
    if rate:
        p = jnp.where(pk.keep(seed_ref, r, 0, c.shape[0], width, rate), p * keep_scale(rate), 0.0)
    pk.store(y_ref, p, m)
    pk.store(lse_ref, mx + jnp.log(total), r < rows)


def _bwd_kernel(x_ref, mask_ref, seed_ref, lse_ref, dy_ref, dx_ref, *, rows, width, scale, rate, block_rows):
    first = pl.program_id(0) * block_rows
    s, real, r, c, m = _scores(x_ref, mask_ref, first_row=first, rows=rows, width=width, scale=scale,
                               block_rows=block_rows)
    p = jnp.exp(s - pk.load(lse_ref, r < rows, 0.0)[:, None])
    dp = pk.load(dy_ref, m, 0.0).astype(jnp.float32)
    if rate:
        dp = jnp.where(pk.keep(seed_ref, r, 0, c.shape[0], width, rate), dp * keep_scale(rate), 0.0)
    delta = jnp.sum(p * dp, axis=1)
    dx = jnp.where(real[None, :], scale * p * (dp - delta[:, None]), 0.0)  # masked scores get no gradient
    pk.store(dx_ref, dx, m)


def _specs(br, wp, rows_per_sequence):
    return [pl.BlockSpec((br, wp), lambda i: (i, 0)),
            pl.BlockSpec((None, wp), lambda i: (i * br // rows_per_sequence, 0)),
            pl.BlockSpec((4,), lambda i: (0,))]


def forward(x, mask, seed_words, *, rows_per_sequence, scale, rate, interpret, blocks: Blocks):
    """x (R, T) scores, mask (R // rows_per_sequence, T) int32. Returns probabilities (R, T), lse (R,) float32."""
    rows, width = x.shape
    br, wp = blocks.block_rows, pk.next_pow2(width)
    kernel = functools.partial(_fwd_kernel, rows=rows, width=width, scale=scale, rate=rate, block_rows=br)
    return pl.pallas_call(
        kernel,
        out_shape=(jax.ShapeDtypeStruct((rows, width), x.dtype), jax.ShapeDtypeStruct((rows,), jnp.float32)),
        grid=(pl.cdiv(rows, br),),
        in_specs=_specs(br, wp, rows_per_sequence),
        out_specs=(pl.BlockSpec((br, wp), lambda i: (i, 0)), pl.BlockSpec((br,), lambda i: (i,))),
        compiler_params=pk.compiler_params(blocks.num_warps, blocks.num_stages),
        interpret=interpret,
        name="softmax_fwd",
    )(x, mask, seed_words)


def backward(x, mask, seed_words, lse, dy, *, rows_per_sequence, scale, rate, interpret, blocks: Blocks):
    rows, width = x.shape
    br, wp = blocks.bwd_block_rows, pk.next_pow2(width)
    kernel = functools.partial(_bwd_kernel, rows=rows, width=width, scale=scale, rate=rate, block_rows=br)
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((rows, width), x.dtype),
        grid=(pl.cdiv(rows, br),),
        in_specs=_specs(br, wp, rows_per_sequence) + [pl.BlockSpec((br,), lambda i: (i,)),
                                                      pl.BlockSpec((br, wp), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((br, wp), lambda i: (i, 0)),
        compiler_params=pk.compiler_params(blocks.bwd_num_warps, blocks.bwd_num_stages),
        interpret=interpret,
        name="softmax_bwd",
    )(x, mask, seed_words, lse, dy)
