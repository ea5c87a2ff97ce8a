"""Pallas (Triton-lowered) kernels of the fused MLM decoder + cross-entropy: vocabulary GEMM tiles reduced in registers.

Both kernels run over a grid of (BM rows, BV vocabulary columns) tiles, row blocks first (consecutive programs share
one tile of the table, which is about the size of L2, while h is small). Each tile's logits h E^T + b are a K loop of
BK-wide `dot`s with float32 accumulation; they never leave registers:

- forward: per tile and row, the max, the sum of exp(logit - max), the label's logit and the first column reaching
  the max, as four (N, V / BV) partials; `fused.py` combines them into logsumexp, nll and argmax (a few numbers per
  row). With `probs_dtype` it also stores the tile's exp(logit - max) (N, V) in that dtype, the residual of
  `fused.py`'s stored-probabilities backward, which then needs no backward kernel.
- backward: the tile's logits again, d_logits = (exp(logit - logz) - onehot(label)) * g in float32, stored in the
  compute dtype (what the two gradient GEMMs read, as the chunked loss and the reference feed theirs), and the
  tile's column sums of d_logits (float32) as partial sums of the bias gradient; `fused.py` runs dh = d_logits E and
  dE = d_logits^T h as XLA (cuBLAS) GEMMs.

Rows past N and columns past V (a partial last block) are masked loads and stores, chosen statically only where the
shape has them; columns at and past `valid` (the model's vocabulary padding) never win and get zero gradient.
A Pallas tile GEMM at 1280 x 1024 x 30720 runs at 590 TFLOP/s on an H200 (cuBLAS 633), 505 with the forward's
reductions (kernels-h200.md, MLM loss).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from .._pallas import compiler_params, fit_pow2

_NO_COLUMN = jnp.iinfo(jnp.int32).max  # an argmax index no real column has


@dataclasses.dataclass(frozen=True)
class Blocks:
    """Tile sizes: BM rows x BV columns, a K loop of BK; warps and software-pipeline stages per kernel."""
    block_m: int = 128
    block_v: int = 128
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 3
    bwd_block_v: int = 128
    bwd_num_warps: int = 4
    bwd_num_stages: int = 3


def _pow2_at_most(n: int, cap: int) -> int:
    """The largest power of two <= min(n, cap), at least 16 (a Triton dot needs every dimension >= 16)."""
    p = 16
    while p * 2 <= min(n, cap):
        p *= 2
    return p


def tile_sizes(n: int, v: int, d: int, blocks: Blocks, *, backward: bool = False) -> tuple[int, int, int] | None:
    """(BM, BV, BK) for an (n, d) x (v, d) problem, or None where a tile cannot be formed (D not a multiple of 16)."""
    bk = fit_pow2(blocks.block_k, d)
    if d % bk:
        return None
    return _pow2_at_most(n, blocks.block_m), _pow2_at_most(v, blocks.bwd_block_v if backward else blocks.block_v), bk


def _logits_tile(h_ref, e_ref, b_ref, rows_ok, cols_ok, *, bk: int):
    """float32 (BM, BV) logits of the tile: h E^T over a K loop of BK columns, plus the bias. `rows_ok` / `cols_ok`
    are None where the tile is whole, else masks of the rows / columns inside the arrays (the rest load as 0)."""
    bm, d = h_ref.shape
    bv = e_ref.shape[0]

    def load(ref, ok, s):
        if ok is None:
            return ref[:, s]
        return pltriton.load(ref.at[:, s], mask=ok[:, None], other=0)

    def body(k, acc):
        s = pl.ds(pl.multiple_of(k * bk, bk), bk)
        return acc + pltriton.dot(load(h_ref, rows_ok, s), load(e_ref, cols_ok, s), trans_b=True)

    acc = lax.fori_loop(0, d // bk, body, jnp.zeros((bm, bv), jnp.float32))
    bias = b_ref[...] if cols_ok is None else pltriton.load(b_ref, mask=cols_ok, other=0)
    return acc + bias.astype(jnp.float32)[None, :]


def _indices(bm: int, bv: int, n: int, v: int, valid: int):
    """This program's column indices and three masks, each None where the shape has none (decided statically): rows
    inside N, columns inside V, and real columns (below `valid`: neither padding nor past V)."""
    rows = pl.program_id(0) * bm + jnp.arange(bm, dtype=jnp.int32)
    cols = pl.program_id(1) * bv + jnp.arange(bv, dtype=jnp.int32)
    cols_ok = cols < v if v % bv else None
    real = cols < valid if valid < v or cols_ok is not None else None
    return cols, (rows < n if n % bm else None), cols_ok, real


def _tile_mask(rows_ok, cols_ok, shape):
    """The (BM, BV) mask of a tile's elements inside the array, or None where the tile is whole."""
    if rows_ok is None and cols_ok is None:
        return None
    rows_ok = jnp.ones(shape[:1], jnp.bool_) if rows_ok is None else rows_ok
    cols_ok = jnp.ones(shape[1:], jnp.bool_) if cols_ok is None else cols_ok
    return rows_ok[:, None] & cols_ok[None, :]


def _load_rows(ref, rows_ok, other):
    return ref[...] if rows_ok is None else pltriton.load(ref, mask=rows_ok, other=other)


def _store(ref, value, mask):
    if mask is None:
        ref[...] = value
    else:
        pltriton.store(ref, value, mask=mask)


def _fwd_kernel(h_ref, e_ref, b_ref, lab_ref, m_ref, s_ref, ll_ref, am_ref, p_ref=None, *, n, v, valid, bk):
    cols, rows_ok, cols_ok, real = _indices(h_ref.shape[0], e_ref.shape[0], n, v, valid)
    logits = _logits_tile(h_ref, e_ref, b_ref, rows_ok, cols_ok, bk=bk)
    if real is not None:  # padding columns and columns past V never win and add nothing
        logits = jnp.where(real[None, :], logits, -jnp.inf)
    m = jnp.max(logits, axis=1)
    m_safe = jnp.where(m == -jnp.inf, 0.0, m)  # a tile of padding only: sum 0, never the row's max
    labels = _load_rows(lab_ref, rows_ok, -1)
    p = jnp.exp(logits - m_safe[:, None])  # in [0, 1]: 1 at the tile max, 0 on padding columns
    if p_ref is not None:  # the stored-probabilities backward's residual, relative to the tile's own max
        _store(p_ref, p.astype(p_ref.dtype), _tile_mask(rows_ok, cols_ok, p.shape))
    _store(m_ref, m, rows_ok)
    _store(s_ref, jnp.sum(p, axis=1), rows_ok)
    _store(ll_ref, jnp.sum(jnp.where(cols[None, :] == labels[:, None], logits, 0.0), axis=1), rows_ok)
    # first column reaching the max (jnp.argmax's tie rule); fused.py takes the first tile reaching the row's max
    _store(am_ref, jnp.min(jnp.where(logits == m[:, None], cols[None, :], _NO_COLUMN), axis=1), rows_ok)


def _bwd_kernel(h_ref, e_ref, b_ref, lab_ref, logz_ref, g_ref, dl_ref, db_ref, *, n, v, valid, bk):
    cols, rows_ok, cols_ok, real = _indices(h_ref.shape[0], e_ref.shape[0], n, v, valid)
    logits = _logits_tile(h_ref, e_ref, b_ref, rows_ok, cols_ok, bk=bk)
    labels = _load_rows(lab_ref, rows_ok, -1)
    logz = _load_rows(logz_ref, rows_ok, 0.0)
    g = _load_rows(g_ref, rows_ok, 0.0)  # rows past N: g = 0, so their d_logits and bias share are 0
    p = jnp.exp(logits - logz[:, None])
    if real is not None:
        p = jnp.where(real[None, :], p, 0.0)
    d_logits = (p - (cols[None, :] == labels[:, None]).astype(jnp.float32)) * g[:, None]
    _store(dl_ref, d_logits.astype(dl_ref.dtype), _tile_mask(rows_ok, cols_ok, d_logits.shape))
    _store(db_ref, jnp.sum(d_logits, axis=0), cols_ok)


def _specs(bm: int, bv: int, d: int):
    """h (BM, D) at row block i; the table (BV, D) and the bias (BV,) at column block j; labels (BM,) at i."""
    return [pl.BlockSpec((bm, d), lambda i, j: (i, 0)), pl.BlockSpec((bv, d), lambda i, j: (j, 0)),
            pl.BlockSpec((bv,), lambda i, j: (j,)), pl.BlockSpec((bm,), lambda i, j: (i,))]


def forward_partials(h, e, bias, labels, *, valid: int, blocks: Blocks, interpret: bool, probs_dtype=None):
    """h (N, D), e (V, D) in h's dtype, bias (V,) float32, labels (N,) int32 -> four (N, ceil(V / BV)) partials:
    row max, sum of exp(logit - max), the label's logit (0 where the label is not in the tile), first argmax.
    With `probs_dtype`, a fifth output: (N, V) exp(logit - tile max) in that dtype (0 on padding columns)."""
    (n, d), v = h.shape, e.shape[0]
    bm, bv, bk = tile_sizes(n, v, d, blocks)
    grid = (pl.cdiv(n, bm), pl.cdiv(v, bv))
    part = pl.BlockSpec((bm, None), lambda i, j: (i, j))
    specs = [part] * 4
    shapes = [jax.ShapeDtypeStruct((n, grid[1]), jnp.float32)] * 3 + [jax.ShapeDtypeStruct((n, grid[1]), jnp.int32)]
    if probs_dtype is not None:
        specs.append(pl.BlockSpec((bm, bv), lambda i, j: (i, j)))
        shapes.append(jax.ShapeDtypeStruct((n, v), probs_dtype))
    return pl.pallas_call(
        functools.partial(_fwd_kernel, n=n, v=v, valid=valid, bk=bk), grid=grid, in_specs=_specs(bm, bv, d),
        out_specs=specs, out_shape=shapes, compiler_params=compiler_params(blocks.num_warps, blocks.num_stages),
        interpret=interpret, name="mlm_ce_fwd" if probs_dtype is None else "mlm_ce_fwd_probs",
    )(h, e, bias, labels)


def backward_tiles(h, e, bias, labels, logz, g, *, valid: int, blocks: Blocks, interpret: bool):
    """d_logits (N, V) in h's dtype and (ceil(N / BM), V) float32 partial sums of the bias gradient."""
    (n, d), v = h.shape, e.shape[0]
    bm, bv, bk = tile_sizes(n, v, d, blocks, backward=True)
    grid = (pl.cdiv(n, bm), pl.cdiv(v, bv))
    row = pl.BlockSpec((bm,), lambda i, j: (i,))
    return pl.pallas_call(
        functools.partial(_bwd_kernel, n=n, v=v, valid=valid, bk=bk), grid=grid,
        in_specs=_specs(bm, bv, d) + [row, row],
        out_specs=[pl.BlockSpec((bm, bv), lambda i, j: (i, j)), pl.BlockSpec((None, bv), lambda i, j: (i, j))],
        out_shape=[jax.ShapeDtypeStruct((n, v), h.dtype), jax.ShapeDtypeStruct((grid[0], v), jnp.float32)],
        compiler_params=compiler_params(blocks.bwd_num_warps, blocks.bwd_num_stages),
        interpret=interpret, name="mlm_ce_bwd",
    )(h, e, bias, labels, logz, g)
