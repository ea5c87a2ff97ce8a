"""Pallas (Triton) kernels of bias + exact GELU (+ dropout), forward (BAD/BRD) and backward (BDRB + bias grad).

Forward: `y = dropout(gelu(x + bias))`, an element-wise pass over (R, F) tiles of `block_rows` x `block_cols`
(F = 3072 is three 1024-wide column blocks, no masked lanes). Backward: `dx = dy * dropout' * gelu'(x + bias)`,
recomputed from x (the pre-activation is not stored), with float32 partial sums of the bias gradient kept in
registers per program (`rows_per_program` rows) and summed by the caller.
Bytes (2-byte activations): forward reads x, writes y (2RF·2); backward reads x, dy, writes dx (3RF·2).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from .. import _pallas as pk
from ..dropout import keep_scale
from .._math import _SQRT_HALF, divide, gelu_grad, gelu_terms


@dataclasses.dataclass(frozen=True)
class Blocks:
    block_rows: int = 8
    block_cols: int = 1024
    num_warps: int = 4
    bwd_block_rows: int = 8
    bwd_rows_per_program: int = 64
    bwd_num_warps: int = 4
    num_stages: int = 1
    bwd_num_stages: int = 1  # >1 lets Triton prefetch the next chunk of the backward's row loop


def default_blocks(rows: int, width: int, rate: float = 0.0) -> Blocks:
    """Measured on an H200 (benchmarks/results/kernels-h200.md, --tune): 8 x 1024 tiles; the backward with 8 warps.
    The same with and without dropout."""
    del rows, rate
    bc = min(pk.next_pow2(width), 1024)
    br = max(1, 8192 // bc)
    if width >= 4096:
        return Blocks(block_rows=br, block_cols=bc, num_warps=8, bwd_block_rows=4, bwd_rows_per_program=16,
                      bwd_num_warps=8)
    # F = 3072: a 2-stage pipelined backward (4-row chunks, 16 rows/program, 8 warps) measured 97.6 us vs 122.7.
    return Blocks(block_rows=br, block_cols=bc, num_warps=4, bwd_block_rows=4, bwd_rows_per_program=16,
                  bwd_num_warps=8, bwd_num_stages=2)


def candidate_blocks(around: Blocks, *, stage: str) -> list[Blocks]:
    """Block sizes the autotuner (and `benchmarks/kernels.py --tune`) tries around `around`, per stage."""
    return pk.row_block_candidates(around, stage=stage)


def _tile(x_ref, bias_ref, seed_ref, first_row, first_col, *, rows, width, rate, block_rows, block_cols):
    """x (float32), b/√2 (broadcast over the rows), the keep mask (or None) and the bounds mask of one tile."""
    r = first_row + jnp.arange(block_rows, dtype=jnp.int32)
    c = first_col + jnp.arange(block_cols, dtype=jnp.int32)
    m = (r < rows)[:, None] & (c < width)[None, :]
    bc = (pk.load(bias_ref, c < width).astype(jnp.float32) * _SQRT_HALF)[None, :]
    keep = pk.keep(seed_ref, r, first_col, block_cols, width, rate) if rate else None
    return pk.load(x_ref, m).astype(jnp.float32), bc, keep, m


def _fwd_kernel(x_ref, bias_ref, seed_ref, y_ref, *, rows, width, rate, block_rows, block_cols):
    x, bc, keep, m = _tile(x_ref, bias_ref, seed_ref, pl.program_id(0) * block_rows, pl.program_id(1) * block_cols,
                           rows=rows, width=width, rate=rate, block_rows=block_rows, block_cols=block_cols)
    z, cdf = gelu_terms(x, bc, keep_scale(rate), divide)  # GELU in z = (x + b)/√2 (`_math`)
    if keep is not None:
        cdf = jnp.where(keep, cdf, 0.0)
    pk.store(y_ref, z * cdf, m)


def _bwd_kernel(x_ref, bias_ref, seed_ref, dy_ref, dx_ref, dbias_ref, *, rows, width, rate, block_rows, block_cols,
                rows_per_program):
    first_row = pl.program_id(0) * rows_per_program
    first_col = pl.program_id(1) * block_cols

    def chunk(j, dbias):
        rs = pl.ds(j * block_rows, block_rows)
        x, bc, keep, m = _tile(x_ref.at[rs, :], bias_ref, seed_ref, first_row + j * block_rows, first_col,
                               rows=rows, width=width, rate=rate, block_rows=block_rows, block_cols=block_cols)
        grad = gelu_grad(x, bc, keep_scale(rate), divide)  # times the dropout scale
        if keep is not None:
            grad = jnp.where(keep, grad, 0.0)
        dx = jnp.where(m, pk.load(dy_ref.at[rs, :], m).astype(jnp.float32) * grad, 0.0)
        pk.store(dx_ref.at[rs, :], dx, m)
        return dbias + jnp.sum(dx, axis=0)

    dbias = jax.lax.fori_loop(0, rows_per_program // block_rows, chunk, jnp.zeros((block_cols,), jnp.float32))
    c = first_col + jnp.arange(block_cols)
    pk.store(dbias_ref, dbias[None, :], (c < width)[None, :])


def forward(x, bias, seed_words, *, rate, interpret, blocks: Blocks):
    rows, width = x.shape
    br, bc = blocks.block_rows, blocks.block_cols
    kernel = functools.partial(_fwd_kernel, rows=rows, width=width, rate=rate, block_rows=br, block_cols=bc)
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((rows, width), x.dtype),
        grid=(pl.cdiv(rows, br), pl.cdiv(width, bc)),
        in_specs=[pl.BlockSpec((br, bc), lambda i, j: (i, j)), pl.BlockSpec((bc,), lambda i, j: (j,)),
                  pl.BlockSpec((4,), lambda i, j: (0,))],
        out_specs=pl.BlockSpec((br, bc), lambda i, j: (i, j)),
        compiler_params=pk.compiler_params(blocks.num_warps, blocks.num_stages),
        interpret=interpret,
        name="bias_gelu_fwd",
    )(x, bias, seed_words)


def backward(x, bias, seed_words, dy, *, rate, interpret, blocks: Blocks):
    """Returns dx (R, F) and the bias gradient's partial sums (G, F), float32."""
    rows, width = x.shape
    br, bc = blocks.bwd_block_rows, blocks.block_cols
    rpp = max(br, min(blocks.bwd_rows_per_program, pk.next_pow2(rows)))
    groups = pl.cdiv(rows, rpp)
    kernel = functools.partial(_bwd_kernel, rows=rows, width=width, rate=rate, block_rows=br, block_cols=bc,
                               rows_per_program=rpp)
    tile = pl.BlockSpec((rpp, bc), lambda i, j: (i, j))
    return pl.pallas_call(
        kernel,
        out_shape=(jax.ShapeDtypeStruct((rows, width), x.dtype), jax.ShapeDtypeStruct((groups, width), jnp.float32)),
        grid=(groups, pl.cdiv(width, bc)),
        in_specs=[tile, pl.BlockSpec((bc,), lambda i, j: (j,)), pl.BlockSpec((4,), lambda i, j: (0,)), tile],
        out_specs=(tile, pl.BlockSpec((1, bc), lambda i, j: (i, j))),
        compiler_params=pk.compiler_params(blocks.bwd_num_warps, blocks.bwd_num_stages),
        interpret=interpret,
        name="bias_gelu_bwd",
    )(x, bias, seed_words, dy)
