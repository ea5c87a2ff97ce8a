"""Mosaic GPU (Hopper+) kernels of BDRLN `y = LN(residual + dropout(x + bias))` and its backward: the same contract as
`kernel.py`'s forward/backward (optional bias/residual are static `None`s; partial sums (G, D) float32).

Streaming as in `pallas_kernels/bias_gelu/kernel_mgpu.py` (shared plumbing: `pallas_kernels/_mgpu.py`): one
warpgroup per program, `steps` tiles of `block_rows` rows each (dealt round-robin: program p takes tiles p,
p + programs, ...; `Blocks.fwd_interleave` / `bwd_interleave`, else a contiguous run), TMA'd GMEM -> SMEM as
(block_rows·D/256, 256) boxes (`emit_pipeline`), and viewed in SMEM as (block_rows, D) (a ref reshape). Registers
use a row layout: warp w holds rows w, w+4, ...; its 32 lanes take 16-byte vectors along D, so a warp reads 512
contiguous bytes and the row statistics (mean, variance, and the backward's two row means) are lane shuffles inside
one warp, no SMEM and no barrier. Row statistics (R,) float32 are stored straight from registers to GMEM (a TMA box
of 4 floats would break SMEM's 128-byte alignment), and so is the forward's y (`Blocks.fwd_direct_store`); the
forward can draw each tile's dropout mask a step ahead, as a loop carry (`Blocks.fwd_mask_ahead`). Backward:
inputs stream through the TMA pipeline as above, the program's row statistics (mean, rstd) reach SMEM in one TMA copy
each before the first step (`Blocks.bwd_stats_smem`; else each tile's are prefetched from GMEM a step ahead as a
loop carry), dx and d_residual go from registers straight to GMEM; the scale/shift/bias gradients are summed elementwise
over the program's tiles, the first `Blocks.bwd_register_sums` of them as register loop carries (as many as fit next
to the tile: all three at 768 wide, two or three at 1024), the others in an SMEM (block_rows, D) float32 accumulator
each, folded over rows once per program (read back row by row from SMEM) and written as one partial row per program.
At 1024 wide with dropout the backward reads its bias and LN scale from an SMEM copy in every step
(`Blocks.bwd_params_smem`), which leaves registers for all three sums. Both kernels compile without Pallas'
automatic barriers (one before and after every store, one before every TMA fetch) and place their own, one per
step and one before the fold (`Blocks.auto_barriers`).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from .. import _mgpu
from .._mgpu import LANES, check_rows, kernel_call, load, pipeline, split_programs
from ..dropout import keep_mask_lanes, keep_scale

__all__ = ["Blocks", "backward", "check_shape", "default_blocks", "forward"]


@dataclasses.dataclass(frozen=True)
class Blocks:
    """Rows per pipeline step (a multiple of 4: one row per warp), tiles in flight, target programs (CTAs)."""
    block_rows: int = 4
    max_concurrent_steps: int = 3
    programs: int = 264
    bwd_block_rows: int = 4
    bwd_max_concurrent_steps: int = 2
    bwd_programs: int = 264
    # The forward's y from registers straight to GMEM (as the backward's dx), not through SMEM and TMA: the forward
    # kernel 0-0.7 us faster at every BERT shape, p = 0 and 0.1 (H200 device time; kernels-h200.md, BDRLN).
    fwd_direct_store: bool = True
    # The forward draws the next tile's dropout mask at the end of each step (a loop carry; the first tile's before the
    # pipeline starts), so no tile waits for its own hash after its data arrive (`default_blocks`: at <= 768 wide).
    fwd_mask_ahead: bool = False
    # How many of the backward's column sums (d_scale, d_shift, d_bias, in that order) are register loop carries; the
    # others are SMEM tiles (`default_blocks` says how many fit).
    bwd_register_sums: int = 0
    # Pallas' automatic warpgroup barriers (before and after every store, GMEM ones included, and before every TMA
    # fetch: 13-15 / 26-30 BAR.SYNC in the forward / backward kernel's SASS at 768-1024 wide); False (the default):
    # the kernels' own, one per step before the pipeline refetches into the slots the step read (with the forward's y
    # through SMEM, one before each y tile's write) and one before the backward's fold of its column sums (2 / 3
    # BAR.SYNC): BDRLN with dropout 1.5-3% faster at 1024 wide, 0-1% at 768 (H200 device time; kernels-h200.md,
    # BDRLN).
    auto_barriers: bool = False
    # The backward's (D,) bias and LN scale copied to SMEM once per program and read from there in every step,
    # instead of held in registers (32 per thread each at 1024 wide) for the whole program (`default_blocks`: at
    # 1024 wide with dropout, where it makes room for all three column sums).
    bwd_params_smem: bool = False
    # The backward's row statistics (mean, rstd) of all the program's tiles TMA'd GMEM -> SMEM once, before its
    # pipeline starts, and read from SMEM in every step, instead of each tile's loaded from GMEM a step ahead as a
    # loop carry: ptxas sinks that prefetch to the end of the step it was meant to run ahead of (at 255 registers),
    # where the carry waits for it (ncu's stall samples; kernels-h200.md, BDRLN). Only where the statistics take at
    # most `_MAX_SMEM_STATS` floats each per program, in copies of whole 128-byte multiples (else the prefetch:
    # `stats_in_smem`).
    bwd_stats_smem: bool = True
    # The forward's / backward's tiles dealt to programs round-robin (program p takes tiles p, p + programs, ...), so
    # that the programs stream through one window of the arrays together, instead of each a contiguous run of tiles:
    # with dropout each kernel alone 0-5% faster at 1024 wide (caches flushed), fwd+bwd back to back -1 to -3%
    # (-0.4 to -4.5 us), equal to -3% at 768 (H200; kernels-h200.md, BDRLN).
    fwd_interleave: bool = True
    bwd_interleave: bool = True
    approx_math: bool = False


_MAX_SMEM_STATS = 1024  # rows of statistics per program that the backward keeps in SMEM (4 KiB each of mean, rstd)
_TMA_BOX = _mgpu.MAX_TILE_ROWS  # elements per dimension of one TMA copy (the statistics' copies are chunked by it)


def _stats_chunks(steps: int) -> list[int]:
    """Steps per TMA copy of a program's statistics: boxes of at most `_TMA_BOX` steps."""
    return [min(_TMA_BOX, steps - c) for c in range(0, steps, _TMA_BOX)]


def stats_in_smem(blocks: Blocks, steps: int) -> bool:
    """Whether the backward copies its program's statistics to SMEM (`Blocks.bwd_stats_smem`) for `steps` steps per
    program: at most `_MAX_SMEM_STATS` rows, and each copy a multiple of 128 bytes (Mosaic GPU splits a TMA copy's
    byte count over the warpgroup's 128 threads and rejects other sizes: 12288 rows, 256 programs of 12 steps of 4
    rows, would copy 192 bytes). Otherwise each step's statistics are prefetched from GMEM."""
    br = blocks.bwd_block_rows
    return (blocks.bwd_stats_smem and steps * br <= _MAX_SMEM_STATS
            and all(n * br * 4 % _mgpu.WARPGROUP == 0 for n in _stats_chunks(steps)))


def default_blocks(rows: int, width: int, rate: float = 0.0) -> Blocks:
    """4 rows per step, 3 (forward; 2 wider than 768) and 2 (backward) steps in flight, 2 programs per SM: the
    fastest or within 1.4 us of it among 12 candidates at 8192-32768 rows of 768 and 1024, p = 0.1.

    The backward's column sums in registers: all three where they take at most 72 per thread (3 x 4 rows x 768 / 128
    threads); else, with dropout (`rate`), all three where they take at most 96 (1024 wide) with the bias and LN scale
    moved to SMEM to make room (`bwd_params_smem`); without, two where they take at most 64; else none. The forward's
    dropout mask is drawn a step ahead (`fwd_mask_ahead`) up to 768 wide, where it saved 0.1-0.3 us per call and cost
    0.3-1.1 us at 1024 wide (its carried mask's registers). All measured as H200 device time (kernels-h200.md, BDRLN).
    """
    del rows
    blocks = Blocks()
    per_sum = blocks.bwd_block_rows * width // _mgpu.WARPGROUP  # float32 registers per thread for one sum
    params_smem = bool(rate) and 72 < 3 * per_sum <= 96
    n_reg = 3 if 3 * per_sum <= 72 or params_smem else 2 if 2 * per_sum <= 64 else 0
    return dataclasses.replace(blocks, bwd_register_sums=n_reg, bwd_params_smem=params_smem,
                               max_concurrent_steps=3 if width <= 768 else 2, fwd_mask_ahead=width <= 768)


def candidate_blocks(around: Blocks, *, stage: str) -> list[Blocks]:
    """Block sizes the autotuner (and `benchmarks/kernels.py --tune`) tries around `around`, per stage: rows per
    step in (4, 8)."""
    return _mgpu.row_block_candidates(around, (4, 8), stage=stage)


class _Tile:
    """Loads, broadcasts and iotas of one (block_rows, D) tile in the row layout (plain ops in interpret mode)."""

    def __init__(self, shape, vec: int, interpret: bool):
        self.shape, self.interpret = shape, interpret
        self.layout = plgpu.Layout.TILED(plgpu.Tiling(((4, 32 * vec), (4, vec))), (-2,), (-3,), -1)

    def _cast(self, value, layout):
        return value if self.interpret else plgpu.layout_cast(value, layout)

    def _load(self, ref, layout):
        if self.interpret:
            return ref[...].astype(jnp.float32)
        return load(ref, layout=layout, optimized=False).astype(jnp.float32)

    def load(self, ref):
        """A (block_rows, D) tile, float32."""
        return self._load(ref, self.layout)

    def param(self, ref):
        """A (D,) parameter broadcast over the tile's rows (free: each warp holds every column)."""
        p = self._load(ref, self.layout.reduce(0))
        return self._cast(lax.broadcast_in_dim(p, self.shape, (1,)), self.layout)

    def stat(self, ref):
        """A (block_rows,) row statistic, float32, in the layout of a row reduction."""
        return self._load(ref, self.layout.reduce(1))

    def rows(self, s):
        """A (block_rows,) row value broadcast along D."""
        return self._cast(lax.broadcast_in_dim(s, self.shape, (0,)), self.layout)

    def keep(self, seeds, first, width: int, rate: float):
        """The dropout keep mask of the tile (`first` = its first logical row, uint32): `keep_mask` of the element
        indices (first + row) * D + col, in the pair form (`keep_mask_lanes`: a row's first index is even, D being
        a multiple of the lanes, and each thread holds `vec` consecutive columns, so the compiler can draw one hash
        per two columns, as bias+GELU's kernel does)."""
        if self.interpret:
            r = lax.broadcast_in_dim(jnp.arange(self.shape[0], dtype=jnp.uint32), self.shape, (0,))
            c = lax.broadcast_in_dim(jnp.arange(self.shape[1], dtype=jnp.uint32), self.shape, (1,))
        else:
            r = plgpu.broadcasted_iota(jnp.uint32, self.shape, 0, layout=self.layout)
            c = plgpu.broadcasted_iota(jnp.uint32, self.shape, 1, layout=self.layout)
        return keep_mask_lanes(seeds, (r + first) * jnp.uint32(width), c, rate)

    def zeros(self):
        return self._cast(jnp.zeros(self.shape, jnp.float32), self.layout)

    def store(self, ref, value):
        """ref[...] = value (a tile or a row statistic), as a plain transfer on every jax (`_mgpu.store`)."""
        _mgpu.store(ref, value, interpret=self.interpret)


def _vec(*dtypes) -> int:
    """16-byte vectors of the narrowest operand (wider operands then load 2 x 16 bytes per vector)."""
    return 16 // min(jnp.dtype(d).itemsize for d in dtypes if d is not None)


def _check(rows, width, dtypes, block_rows, field, vec):
    for d in dtypes:  # lanes x vectors must tile a row
        check_rows(rows, width, d, block_rows, field, multiple=32 * vec)
    if block_rows % 4:
        raise ValueError(f"{field}={block_rows} must be a multiple of 4 (one row per warp)")


def check_shape(rows: int, width: int, x_dtype, out_dtype, blocks: Blocks) -> None:
    """ValueError (before any compile) where `forward` or `backward` would not take a (rows, width) shard of x in
    `x_dtype` whose output, residual and output gradient are in `out_dtype`, with `blocks`."""
    _check(rows, width, (x_dtype, out_dtype), blocks.block_rows, "block_rows", _vec(x_dtype, out_dtype))
    _check(rows, width, (x_dtype, out_dtype), blocks.bwd_block_rows, "bwd_block_rows", _vec(x_dtype, out_dtype))


def _keep(t: _Tile, seeds, first_row, *, width, rate):
    """The dropout keep mask of the tile whose first row is `first_row`."""
    s0, s1, offset = seeds
    return t.keep((s0, s1), offset + first_row.astype(jnp.uint32), width, rate)


def _h(t: _Tile, x_smem, bias, res_smem, seeds, first_row, *, width, rate, keep=None):
    """h = residual + dropout(x + bias), float32, and the keep mask (or None), as kernel.py's `_h`; `keep`: the
    tile's mask if already drawn."""
    h = t.load(x_smem)
    if bias is not None:
        h = h + bias
    if rate:
        if keep is None:
            keep = _keep(t, seeds, first_row, width=width, rate=rate)
        h = jnp.where(keep, h * keep_scale(rate), 0.0)
    if res_smem is not None:
        h = h + t.load(res_smem)
    return h, keep


def _views(block_rows: int, width: int, interpret: bool):
    """(TMA tile shape, GMEM view of an (R, D) array, SMEM view of a tile as (block_rows, D)). Interpret mode
    (jax 0.10.2) cannot reshape refs, so there the arrays stay (R, D) and tiles are (block_rows, D) windows."""
    if interpret:
        return (block_rows, width), (lambda a: a), (lambda ref: ref)
    return ((block_rows * width // LANES, LANES), (lambda a: a.reshape(-1, LANES)),
            (lambda ref: None if ref is None else ref.reshape(block_rows, width)))


def _forward(x, bias, residual, scale, shift, seed_words, *, rate, eps, interpret, blocks: Blocks):
    """x, residual: (R, D); bias, scale, shift: (D,); seed_words uint32[4]. Returns y, mean (R,), rstd (R,)."""
    rows, width = x.shape
    br = blocks.block_rows
    out_dtype = (residual if residual is not None else x).dtype
    vec = _vec(x.dtype, out_dtype)
    _check(rows, width, (x.dtype, out_dtype), br, "block_rows", vec)
    tile, flat, view = _views(br, width, interpret)
    programs, steps = split_programs(rows // br, blocks.programs)
    has_bias, has_res = bias is not None, residual is not None
    direct = blocks.fwd_direct_store
    ahead = bool(rate) and blocks.fwd_mask_ahead
    tile_of = _mgpu.tile_order(blocks.fwd_interleave, programs, steps)
    barrier = functools.partial(_mgpu.warpgroup_barrier, interpret, auto_barriers=blocks.auto_barriers)

    def body(*refs):
        it = iter(refs)
        x_gmem, b_gmem = next(it), next(it) if has_bias else None
        r_gmem = next(it) if has_res else None
        s_gmem, t_gmem, seed_gmem, y_gmem, mean_gmem, rstd_gmem = (next(it) for _ in range(6))
        p = lax.axis_index("p")
        t = _Tile((br, width), vec, interpret)
        b = t.param(b_gmem) if has_bias else None
        g, beta = t.param(s_gmem), t.param(t_gmem)
        seeds = _mgpu.seeds(seed_gmem, rate)

        def step(idx, *smem):
            keep = None  # drawn in this step unless carried from the last (`ahead`)
            if ahead:
                *smem, keep = smem
            x_smem, r_smem = smem[0], smem[1] if has_res else None
            first_row = tile_of(p, idx[0]) * br
            h, _ = _h(t, view(x_smem), b, view(r_smem), seeds, first_row, width=width, rate=rate, keep=keep)
            mean = jnp.sum(h, axis=1) / width
            centered = h - t.rows(mean)
            rstd = lax.rsqrt(jnp.sum(centered * centered, axis=1) / width + eps)
            y = (centered * t.rows(rstd) * g + beta).astype(out_dtype)
            if direct:
                t.store(y_gmem.at[pl.ds(first_row, br)], y)
            else:
                barrier()  # one thread waited for the slot's last TMA store: all wait for it
                view(smem[-1])[...] = y  # the pipeline's commit after the step orders it before the TMA store
            t.store(mean_gmem.at[pl.ds(first_row, br)], mean)
            t.store(rstd_gmem.at[pl.ds(first_row, br)], rstd)
            if direct:  # every warp is done with this step's SMEM tiles before the pipeline refetches into them
                barrier()  # (with y through SMEM, the pipeline's commit barrier after the step does this)
            if ahead:  # the next tile's mask (none after the last tile)
                return lax.cond(idx[0] + 1 < steps,
                                lambda: _keep(t, seeds, tile_of(p, idx[0] + 1) * br, width=width, rate=rate),
                                lambda: keep)
            return None

        spec = plgpu.BlockSpec(tile, lambda s: (tile_of(p, s), 0))
        ins = [x_gmem] + ([r_gmem] if has_res else [])
        pipeline(step, steps=steps, in_specs=[spec] * len(ins), out_specs=[] if direct else [spec],
                 max_concurrent_steps=blocks.max_concurrent_steps, interpret=interpret,
                 init_carry=_keep(t, seeds, tile_of(p, 0) * br, width=width, rate=rate) if ahead else None,
                 )(*ins, *([] if direct else [y_gmem]))

    args = [flat(x)] + ([bias] if has_bias else []) + ([flat(residual)] if has_res else []) + [scale, shift,
                                                                                               seed_words]
    stat = jax.ShapeDtypeStruct((rows,), jnp.float32)
    out = (jax.ShapeDtypeStruct((rows, width) if direct else flat(x).shape, out_dtype), stat, stat)
    y, mean, rstd = kernel_call(body, out, programs=programs, interpret=interpret, approx_math=blocks.approx_math,
                                name="bdrln_fwd_mgpu", auto_barriers=blocks.auto_barriers)(*args)
    return y.reshape(rows, width), mean, rstd


def _backward(x, bias, residual, scale, seed_words, mean, rstd, dy, *, rate, interpret, blocks: Blocks):
    """Returns dx (R, D), d_residual (R, D) or None, and partial sums (G, D) of d_scale, d_shift, d_bias (or None)."""
    rows, width = x.shape
    br = blocks.bwd_block_rows
    has_bias, has_res = bias is not None, residual is not None
    want_dres = has_res and bool(rate)  # without dropout dx == d_residual: the caller reuses dx
    dtypes = (x.dtype, dy.dtype) + ((residual.dtype,) if has_res else ())
    vec = _vec(*dtypes)
    _check(rows, width, dtypes, br, "bwd_block_rows", vec)
    tile, flat, view = _views(br, width, interpret)
    programs, steps = split_programs(rows // br, blocks.bwd_programs)
    n_acc = 3 if has_bias else 2
    in_smem = blocks.bwd_params_smem
    barrier = functools.partial(_mgpu.warpgroup_barrier, interpret, auto_barriers=blocks.auto_barriers)
    stats_smem = stats_in_smem(blocks, steps)
    chunks = _stats_chunks(steps)  # steps per TMA copy of each statistic, all arriving on one barrier
    interleave = blocks.bwd_interleave
    tile_of = _mgpu.tile_order(interleave, programs, steps)
    # The (R,) statistics as 2-D views in which program p's step s is one (br,) window: (tiles, br), row p·steps + s;
    # interleaved (steps, programs·br), row s, columns p·br + [0, br). A program's windows are then one box.
    stat_view = (lambda a: a.reshape(steps, programs * br)) if interleave else (lambda a: a.reshape(-1, br))

    def body(*refs):
        it = iter(refs)
        x_gmem, b_gmem = next(it), next(it) if has_bias else None
        r_gmem = next(it) if has_res else None
        s_gmem, seed_gmem, mean_gmem, rstd_gmem, dy_gmem, dx_gmem = (next(it) for _ in range(6))
        dres_gmem = next(it) if want_dres else None
        dscale_gmem, dshift_gmem = next(it), next(it)
        dbias_gmem = next(it) if has_bias else None
        acc_smem = next(it)  # (n_acc, br, D) float32: d_scale, d_shift[, d_bias] summed over this program's tiles
        par_smem = next(it) if in_smem else None  # (2, D) float32: the scale and the bias
        # (steps, br) float32 each: the program's means and rstds, and the barrier of their copies
        mean_smem, rstd_smem, stats_bar = (next(it), next(it), next(it)) if stats_smem else (None,) * 3
        p = lax.axis_index("p")
        t = _Tile((br, width), vec, interpret)
        g_src, b_src = s_gmem, b_gmem  # where each step reads the LN scale and the bias
        if in_smem:  # GMEM -> registers (strided over the warpgroup) -> SMEM, once
            for k, ref in enumerate((s_gmem, b_gmem) if has_bias else (s_gmem,)):
                t.store(par_smem.at[k], _mgpu.strided(ref[...], math.gcd(width // _mgpu.WARPGROUP, 4), interpret))
            barrier()  # other warps read what each wrote
            g_src, b_src = par_smem.at[0], par_smem.at[1]

        def params():  # (bias or None, scale) broadcast over a tile
            return (t.param(b_src) if has_bias else None), t.param(g_src)

        held = None if in_smem else params()  # in registers for the whole program
        seeds = _mgpu.seeds(seed_gmem, rate)
        n_reg = min(blocks.bwd_register_sums, n_acc)  # sums 0..n_reg-1 in registers, the rest in SMEM
        for k in range(n_reg, n_acc):
            t.store(acc_smem.at[k], t.zeros())

        def windows(ref, first, n):  # program p's statistics of steps first .. first + n - 1, (n, br)
            if interleave:
                return ref.at[pl.ds(first, n), pl.ds(p * br, br)]
            return ref.at[pl.ds(p * steps + first, n)]

        def stats(s):  # (mean, rstd) of the rows of program p's step s, straight from GMEM
            return t.stat(windows(mean_gmem, s, 1).at[0]), t.stat(windows(rstd_gmem, s, 1).at[0])

        if stats_smem:  # issued before the pipeline's first fetches; waited for in the first step
            for src, dst in ((mean_gmem, mean_smem), (rstd_gmem, rstd_smem)):
                for c, n in enumerate(chunks):
                    plgpu.copy_gmem_to_smem(windows(src, c * _TMA_BOX, n), dst.at[pl.ds(c * _TMA_BOX, n)], stats_bar)

        def step(idx, *smem_and_carry):
            *smem, (prefetched, sums) = smem_and_carry
            if stats_smem:
                @pl.when(idx[0] == 0)
                def _():
                    plgpu.barrier_wait(stats_bar)

                mean_, rstd_, next_stats = t.stat(mean_smem.at[idx[0]]), t.stat(rstd_smem.at[idx[0]]), ()
            else:
                (mean_, rstd_), next_stats = prefetched, stats(jnp.minimum(idx[0] + 1, steps - 1))
            b, g = params() if in_smem else held
            x_smem = smem.pop(0)
            r_smem = smem.pop(0) if has_res else None
            dy_smem = smem.pop(0)
            tile_index = tile_of(p, idx[0])
            first_row = tile_index * br
            h, keep = _h(t, view(x_smem), b, view(r_smem), seeds, first_row, width=width, rate=rate)
            r = t.rows(rstd_)
            xhat = (h - t.rows(mean_)) * r
            d = t.load(view(dy_smem))
            dg = d * g
            # d/dh of LN: rstd * (dg - mean(dg) - xhat * mean(dg * xhat))   (biased variance, as the reference)
            c1 = jnp.sum(dg, axis=1) / width
            c2 = jnp.sum(dg * xhat, axis=1) / width
            dh = (dg - t.rows(c1) - xhat * t.rows(c2)) * r
            dx = dh if keep is None else jnp.where(keep, dh * keep_scale(rate), 0.0)
            # Outputs go straight from registers to GMEM (each warp stores 512 contiguous bytes): no SMEM staging,
            # which leaves room in SMEM for two programs per SM next to the accumulators.
            rows_ = pl.ds(first_row, br)
            t.store(dx_gmem.at[rows_], dx.astype(dx_gmem.dtype))
            if dres_gmem is not None:
                t.store(dres_gmem.at[rows_], dh.astype(dres_gmem.dtype))
            terms = (d * xhat, d, dx)[:n_acc]
            for k in range(n_reg, n_acc):  # each thread reads and writes its own elements: no barrier needed
                t.store(acc_smem.at[k], t.load(acc_smem.at[k]) + terms[k])
            barrier()  # every warp is done with the SMEM tiles before the pipeline refetches into them
            return next_stats, tuple(s_ + v for s_, v in zip(sums, terms[:n_reg]))

        spec = plgpu.BlockSpec(tile, lambda s: (tile_of(p, s), 0))
        ins = [x_gmem] + ([r_gmem] if has_res else []) + [dy_gmem]
        zeros = tuple(t.zeros() for _ in range(n_reg))
        _, sums = pipeline(step, steps=steps, in_specs=[spec] * len(ins), out_specs=[],
                           max_concurrent_steps=blocks.bwd_max_concurrent_steps, interpret=interpret,
                           init_carry=(() if stats_smem else stats(0), zeros))(*ins)
        for k, s_ in enumerate(sums):  # register sums: into the SMEM tiles once, for the fold below
            t.store(acc_smem.at[k], s_)
        barrier()  # the fold reads rows other warps wrote
        # Fold the accumulators' rows, reading them back row by row in the plain strided layout (a cross-warp
        # `jnp.sum(axis=0)` of 8-float vectors has no Mosaic GPU lowering); the barrier above (or Pallas' after the
        # last store) orders this.
        for k, ref in enumerate((dscale_gmem, dshift_gmem, dbias_gmem)[:n_acc]):
            total = acc_smem[k, 0]
            for r in range(1, br):
                total = total + acc_smem[k, r]
            ref[p] = total

    args = ([flat(x)] + ([bias] if has_bias else []) + ([flat(residual)] if has_res else [])
            + [scale, seed_words, stat_view(mean), stat_view(rstd), flat(dy)])
    big = lambda dt: jax.ShapeDtypeStruct((rows, width), dt)  # noqa: E731
    part = jax.ShapeDtypeStruct((programs, width), jnp.float32)
    out = [big(x.dtype)] + ([big(residual.dtype)] if want_dres else []) + [part] * n_acc
    scratch = [plgpu.SMEM((n_acc, br, width), jnp.float32)]  # in the order `body` takes them
    if in_smem:
        scratch.append(plgpu.SMEM((2, width), jnp.float32))
    if stats_smem:
        scratch += [plgpu.SMEM((steps, br), jnp.float32)] * 2 + [plgpu.Barrier(num_arrivals=2 * len(chunks))]
    res = list(kernel_call(body, tuple(out), programs=programs, interpret=interpret,
                           approx_math=blocks.approx_math, name="bdrln_bwd_mgpu", auto_barriers=blocks.auto_barriers,
                           scratch_types=tuple(scratch))(*args))
    dx = res.pop(0)
    dres = res.pop(0) if want_dres else None
    dscale, dshift = res.pop(0), res.pop(0)
    dbias = res.pop(0) if has_bias else None
    return dx, dres, dscale, dshift, dbias


forward = _mgpu.one_module(_forward, ("rate", "eps", "interpret", "blocks"))
backward = _mgpu.one_module(_backward, ("rate", "interpret", "blocks"))
