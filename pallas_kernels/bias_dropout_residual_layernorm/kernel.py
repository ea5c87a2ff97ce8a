"""Pallas (Triton) kernels of BDRLN: `y = LN(residual + dropout(x + bias))` over rows of width D, and its backward.

Forward (Ivanov's BDRLN): one pass, each program normalises `block_rows` rows held in registers (a power-of-two
tile, columns past D masked), writes y and the float32 row statistics (mean, rstd).
Backward (BLNRD + EBSB/BSB + BAOB in one kernel): each program walks `rows_per_program` rows in `block_rows` chunks,
recomputes h = residual + dropout(x + bias) from the inputs and the stored statistics (the dropout mask is
regenerated from the seed, never stored), writes d_residual = dh and dx = dropout'(dh), and keeps float32 partial
sums of the scale, shift and bias gradients in registers, written once per program and summed by the caller.

Bytes (R rows, D wide, 2-byte activations): forward reads x, residual and writes y (3RD·2); backward reads x,
residual, dy and writes dx, d_residual (5RD·2; 4RD·2 without dropout, where dx = d_residual is written once).
Optional operands (no bias, no residual: the MLM head's plain layernorm) are static `None`s.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from .. import _pallas as pk
from ..dropout import keep_scale


@dataclasses.dataclass(frozen=True)
class Blocks:
    """Tile sizes; `block_rows` rows of next_pow2(D) per tile. Tuned per width on the GPU (benchmarks/kernels.py)."""
    block_rows: int = 4
    num_warps: int = 4
    bwd_block_rows: int = 4
    bwd_rows_per_program: int = 64
    bwd_num_warps: int = 4
    num_stages: int = 1
    bwd_num_stages: int = 1  # >1 lets Triton prefetch the next chunk of the backward's row loop


def bwd_rows_per_program(rows: int, programs: int = 512, least: int = 16) -> int:
    """Rows per program of the backward, which leaves per-program partial sums (G, D) for the caller to
    sum: `least` (16: enough programs in flight at 8192 rows), growing with the rows so that about `programs`
    partial rows are left. With 16 rows per program at 32768 rows the 2048 partial rows per gradient took 18-26 us
    to sum (H100), and the op at 32768x1024 with dropout took 179.1 us against 166.0 (H200 device time,
    kernels-h200.md, BDRLN). bias+GELU's backward measured equal either way and keeps 16."""
    return max(least, pk.next_pow2(-(-rows // programs)))


def default_blocks(rows: int, width: int, rate: float = 0.0) -> Blocks:
    """Measured on an H200 (benchmarks/results/kernels-h200.md, --tune): ~4096-element forward tiles, small
    backward chunks with 16 rows per program at 8192 rows (512 programs: enough in flight to cover the latency),
    more at more rows (`bwd_rows_per_program`: about 512 programs, so the partial sums stay small). The same with
    and without dropout."""
    del rate
    rpp = bwd_rows_per_program(rows)
    if pk.next_pow2(width) <= 1024:
        return Blocks(block_rows=max(1, 4096 // pk.next_pow2(width)), num_warps=8,
                      bwd_block_rows=2, bwd_rows_per_program=rpp, bwd_num_warps=4)
    return Blocks(block_rows=1, num_warps=8, bwd_block_rows=1, bwd_rows_per_program=rpp, bwd_num_warps=8)


def candidate_blocks(around: Blocks, *, stage: str) -> list[Blocks]:
    """Block sizes the autotuner (and `benchmarks/kernels.py --tune`) tries around `around`, per stage."""
    return pk.row_block_candidates(around, stage=stage)


def _h(x_ref, bias_ref, res_ref, seed_ref, m, r, c, *, width, rate):
    """h = residual + dropout(x + bias) in float32 for one tile (0 outside it); also the keep mask (or None)."""
    h = pk.load(x_ref, m).astype(jnp.float32)
    if bias_ref is not None:
        h = h + pk.load(bias_ref, c < width, 0.0).astype(jnp.float32)[None, :]
    keep = None
    if rate:
        keep = pk.keep(seed_ref, r, 0, c.shape[0], width, rate)
        h = jnp.where(keep, h * keep_scale(rate), 0.0)
    if res_ref is not None:
        h = h + pk.load(res_ref, m).astype(jnp.float32)
    return h, keep


def _fwd_kernel(x_ref, bias_ref, res_ref, scale_ref, shift_ref, seed_ref, y_ref, mean_ref, rstd_ref, *,
                rows, width, rate, eps, block_rows):
    first = pl.program_id(0) * block_rows
    r, c, m = pk.row_col_mask(first, block_rows, rows, y_ref.shape[-1], width)
    h, _ = _h(x_ref, bias_ref, res_ref, seed_ref, m, r, c, width=width, rate=rate)
    mean = jnp.sum(h, axis=1) / width
    centered = jnp.where(m, h - mean[:, None], 0.0)
    rstd = jax.lax.rsqrt(jnp.sum(centered * centered, axis=1) / width + eps)
    scale = pk.load(scale_ref, c < width, 0.0).astype(jnp.float32)
    shift = pk.load(shift_ref, c < width, 0.0).astype(jnp.float32)
    pk.store(y_ref, centered * rstd[:, None] * scale[None, :] + shift[None, :], m)
    pk.store(mean_ref, mean, r < rows)
    pk.store(rstd_ref, rstd, r < rows)


def _bwd_kernel(x_ref, bias_ref, res_ref, scale_ref, seed_ref, mean_ref, rstd_ref, dy_ref,
                dx_ref, dres_ref, dscale_ref, dshift_ref, dbias_ref, *,
                rows, width, rate, block_rows, rows_per_program):
    wp = x_ref.shape[-1]
    program_first = pl.program_id(0) * rows_per_program
    scale = pk.load(scale_ref, jnp.arange(wp) < width, 0.0).astype(jnp.float32)

    def chunk(j, sums):
        first = program_first + j * block_rows
        r, c, m = pk.row_col_mask(first, block_rows, rows, wp, width)
        rs = pl.ds(j * block_rows, block_rows)
        at = lambda ref: None if ref is None else ref.at[rs, :]  # noqa: E731
        h, keep = _h(at(x_ref), bias_ref, at(res_ref), seed_ref, m, r, c, width=width, rate=rate)
        mean = pk.load(mean_ref.at[rs], r < rows, 0.0)
        rstd = pk.load(rstd_ref.at[rs], r < rows, 0.0)
        xhat = jnp.where(m, (h - mean[:, None]) * rstd[:, None], 0.0)
        dy = pk.load(dy_ref.at[rs, :], m, 0.0).astype(jnp.float32)
        dyg = dy * scale[None, :]
        # d/dh of LN: rstd * (dyg - mean(dyg) - xhat * mean(dyg * xhat))   (biased variance, as the reference)
        c1 = jnp.sum(dyg, axis=1) / width
        c2 = jnp.sum(dyg * xhat, axis=1) / width
        dh = jnp.where(m, (dyg - c1[:, None] - xhat * c2[:, None]) * rstd[:, None], 0.0)
        dx = dh if keep is None else jnp.where(keep, dh * keep_scale(rate), 0.0)
        pk.store(dx_ref.at[rs, :], dx, m)
        if dres_ref is not None:
            pk.store(dres_ref.at[rs, :], dh, m)
        dscale, dshift, dbias = sums
        return dscale + jnp.sum(dy * xhat, axis=0), dshift + jnp.sum(dy, axis=0), dbias + jnp.sum(dx, axis=0)

    zero = jnp.zeros((wp,), jnp.float32)
    dscale, dshift, dbias = jax.lax.fori_loop(0, rows_per_program // block_rows, chunk, (zero, zero, zero))
    cm = (jnp.arange(wp) < width)[None, :]
    pk.store(dscale_ref, dscale[None, :], cm)
    pk.store(dshift_ref, dshift[None, :], cm)
    if dbias_ref is not None:
        pk.store(dbias_ref, dbias[None, :], cm)


def _spec(kind, block_rows, wp, operand):
    """BlockSpec by kind: 'rows' (R, D) tiles, 'vec' (D,) whole, 'stat' (R,) tiles, 'seed' (4,) whole, 'part' one
    row of per-program partial sums. None for an absent operand: pallas_call passes it to the kernel as None."""
    if operand is None:
        return None
    return {
        "rows": lambda: pl.BlockSpec((block_rows, wp), lambda i: (i, 0)),
        "vec": lambda: pl.BlockSpec((wp,), lambda i: (0,)),
        "stat": lambda: pl.BlockSpec((block_rows,), lambda i: (i,)),
        "seed": lambda: pl.BlockSpec((4,), lambda i: (0,)),
        "part": lambda: pl.BlockSpec((1, wp), lambda i: (i, 0)),
    }[kind]()


def forward(x, bias, residual, scale, shift, seed_words, *, rate, eps, interpret, blocks: Blocks):
    """x, residual: (R, D); bias, scale, shift: (D,); seed_words uint32[4]. Returns y, mean (R,), rstd (R,)."""
    rows, width = x.shape
    wp, br = pk.next_pow2(width), blocks.block_rows
    out_dtype = (residual if residual is not None else x).dtype
    args = (x, bias, residual, scale, shift, seed_words)
    kinds = ("rows", "vec", "rows", "vec", "vec", "seed")
    return pl.pallas_call(
        functools.partial(_fwd_kernel, rows=rows, width=width, rate=rate, eps=eps, block_rows=br),
        out_shape=(jax.ShapeDtypeStruct((rows, width), out_dtype),
                   jax.ShapeDtypeStruct((rows,), jnp.float32), jax.ShapeDtypeStruct((rows,), jnp.float32)),
        grid=(pl.cdiv(rows, br),),
        in_specs=[_spec(k, br, wp, a) for k, a in zip(kinds, args)],
        out_specs=[_spec(k, br, wp, True) for k in ("rows", "stat", "stat")],
        compiler_params=pk.compiler_params(blocks.num_warps, blocks.num_stages),
        interpret=interpret,
        name="bdrln_fwd",
    )(*args)


def backward(x, bias, residual, scale, seed_words, mean, rstd, dy, *, rate, interpret, blocks: Blocks):
    """Returns dx (R, D), d_residual (R, D) or None, and partial sums (G, D) of d_scale, d_shift, d_bias (or None)."""
    rows, width = x.shape
    wp = pk.next_pow2(width)
    br = blocks.bwd_block_rows
    rpp = max(br, min(blocks.bwd_rows_per_program, pk.next_pow2(rows)))
    groups = pl.cdiv(rows, rpp)
    # Without dropout dx == d_residual: write it once (the caller reuses it) and save a pass over R x D.
    want_dres = residual is not None and bool(rate)
    args = (x, bias, residual, scale, seed_words, mean, rstd, dy)
    kinds = ("rows", "vec", "rows", "vec", "seed", "stat", "stat", "rows")
    part = jax.ShapeDtypeStruct((groups, width), jnp.float32)
    outs = (jax.ShapeDtypeStruct((rows, width), x.dtype),
            jax.ShapeDtypeStruct((rows, width), residual.dtype) if want_dres else None,
            part, part, part if bias is not None else None)
    return pl.pallas_call(
        functools.partial(_bwd_kernel, rows=rows, width=width, rate=rate, block_rows=br, rows_per_program=rpp),
        out_shape=outs,
        grid=(groups,),
        in_specs=[_spec(k, rpp, wp, a) for k, a in zip(kinds, args)],
        out_specs=[_spec(k, rpp, wp, o) for k, o in zip(("rows", "rows", "part", "part", "part"), outs)],
        compiler_params=pk.compiler_params(blocks.bwd_num_warps, blocks.bwd_num_stages),
        interpret=interpret,
        name="bdrln_bwd",
    )(*args)
