"""Pallas (Triton) kernels of the embedding block: `y = dropout(LN(word[ids] + position[s] + token_type[tt]))` over rows
of width D (packed rows: position[position_ids[b, s]]), and its backward; the table gathers happen inside the kernels
(pointer loads at the ids' rows).

Forward: each program takes `tiles_per_program` tiles of `block_rows` consecutive rows (row r = b·S + s of the shard,
the next tile's word rows fetched while this one computes), loads their word, position (row s = r mod S; with
position ids, the row's id, gathered and fetched ahead with the word rows) and token-type rows from the tables, sums
them in float32, normalises, applies the dropout mask (`pallas_kernels.dropout`, drawn from the element index), and
writes y and the float32 row statistics (mean, rstd).
Backward: program (s, k) takes position s of the batch rows k·`bwd_batch_per_program`.. in chunks of `bwd_block_rows`
(rows b·S + s), recomputes h from the tables and the stored statistics, regenerates the mask, and writes the float32
gradient of h (the gathered rows' gradient, which the caller scatter-adds into the word table: XLA's scatter), with
float32 partial sums per program of the LN scale/shift gradients, of the position row's gradient (all its rows are
this program's) and of each token type's rows: partial row g = s·programs_per_position + k of each, summed by the
caller. With position ids a program's rows hold different positions: it gathers them by id and writes no position
partials, and the caller scatter-adds dh by position id into the position table's gradient (as the word table's).

Bytes (R rows, D wide, float32 tables, 2-byte y): forward reads the gathered word rows (4RD) and writes y (2RD); the
position and token-type rows are S·D (P·D with position ids) and T·D, read from L2. Backward reads dy (2RD) and the
word rows again (4RD) and writes dh (4RD). Ids outside [-V, V) (type ids outside [-T, T), position ids outside
[-P, P) of a (P, D) table) give NaN rows, negative ones count from the end: `jnp.take`'s "fill" semantics, as the
reference gathers.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from .. import _pallas as pk
from ..dropout import keep_scale


@dataclasses.dataclass(frozen=True)
class Blocks:
    """Forward rows per tile and tiles per program; backward batch rows per chunk and per program (one position per
    program)."""
    block_rows: int = 1
    num_warps: int = 4
    # Tiles of `block_rows` per forward program: > 1 loops over them with the next tile's rows fetched ahead.
    tiles_per_program: int = 8
    bwd_block_rows: int = 2
    bwd_batch_per_program: int = 32
    bwd_num_warps: int = 4
    num_stages: int = 1
    bwd_num_stages: int = 1
    # The backward fetches the next chunk's gathered word rows and dy at the start of each step (a loop carry), so
    # their DRAM latency overlaps this chunk's arithmetic.
    bwd_prefetch: bool = True


def default_blocks(rows: int, width: int, rate: float = 0.0) -> Blocks:
    """Measured on an H200 at BERT-large's B64 S128 and B16 S512 with dropout (device time; kernels-h200.md,
    embedding). Forward: 8 tiles of one row per program, 4 warps, the next tile's word rows fetched ahead (23.2 /
    23.4 us, the fastest of 11 candidates). Backward: chunks of 2 rows (1 wider than 1024), 32 batch rows per program,
    the next chunk prefetched (the fastest or within 0.7 us of it among 16); Triton's own pipeline stages 2-3 changed
    nothing."""
    del rows, rate
    return Blocks(bwd_block_rows=2 if pk.next_pow2(width) <= 1024 else 1)


def candidate_blocks(around: Blocks, *, stage: str) -> list[Blocks]:
    """Block sizes `benchmarks/kernels.py --tune` tries around `around`: stage "fwd" the forward's rows per program
    and warps, "bwd" the backward's rows per chunk, batch rows per program and warps."""
    if stage == "fwd":
        return [dataclasses.replace(around, block_rows=br, num_warps=w, tiles_per_program=t)
                for br, w, t in ((1, 4, 1), (2, 4, 1), (4, 8, 1), (8, 8, 1), (1, 4, 8), (2, 4, 4), (2, 4, 8),
                                 (4, 4, 4), (4, 8, 2), (4, 8, 4))]
    if stage == "bwd":
        return [dataclasses.replace(around, bwd_block_rows=br, bwd_batch_per_program=bpp, bwd_num_warps=w,
                                    bwd_num_stages=st)
                for br, bpp, w in ((1, 16, 4), (2, 16, 4), (2, 32, 4), (4, 16, 8)) for st in (1, 2, 3)] + [
            dataclasses.replace(around, bwd_block_rows=br, bwd_batch_per_program=bpp, bwd_prefetch=True)
            for br, bpp in ((1, 16), (2, 16), (2, 32), (4, 32))]
    raise ValueError(f"{stage=} must be 'fwd' or 'bwd'")


def _table_rows(ref, ids, n: int, c, m):
    """float32 rows `ids` (an int vector) of an (n, D) table at columns c, masked by m; NaN rows where an id is out of
    [-n, n) (negative ids count from the end), as `jnp.take(..., mode="fill")`."""
    ids = jnp.where(ids < 0, ids + n, ids)
    ok = (ids >= 0) & (ids < n)
    rows = pltriton.load(ref.at[jnp.clip(ids, 0, n - 1)[:, None], c[None, :]], mask=m, other=0.0)
    return jnp.where(ok[:, None], rows.astype(jnp.float32), jnp.nan)


def _pick(values, lanes, i):
    """values[i] for a vector `i` of lanes (`lanes` = arange of values' length): a one-hot sum, since a register
    tensor cannot be indexed dynamically inside a Triton kernel."""
    return jnp.sum(jnp.where(lanes[None, :] == i[:, None], values[None, :], jnp.zeros_like(values)[None, :]), axis=1)


def _fwd_kernel(ids_ref, tt_ref, pid_ref, word_ref, pos_ref, type_ref, scale_ref, shift_ref, seed_ref, y_ref,
                mean_ref, rstd_ref, *, rows, width, seq, rate, eps, block_rows, tiles):
    """Program i normalises `tiles` consecutive tiles of `block_rows` rows. With more than one, the program's ids are
    loaded once before its loop and the next tile's word rows are fetched while this tile computes (a loop carry), so
    their DRAM latency overlaps the arithmetic; with one, a plain tile. `pid_ref`: the rows' position ids, whose
    position rows are gathered (and fetched ahead) with the word rows; None (no such operand): row r adds position
    row r mod S."""
    wp = y_ref.shape[-1]
    c = jnp.arange(wp, dtype=jnp.int32)
    scale = pk.load(scale_ref, c < width, 0.0).astype(jnp.float32)
    shift = pk.load(shift_ref, c < width, 0.0).astype(jnp.float32)
    first = pl.program_id(0) * (tiles * block_rows)
    lanes = jnp.arange(pk.next_pow2(tiles * block_rows), dtype=jnp.int32)
    r_all = first + lanes
    ok_all = (r_all < rows) & (lanes < tiles * block_rows)
    ids_all, tt_all = (pltriton.load(ref.at[r_all], mask=ok_all, other=0) for ref in (ids_ref, tt_ref))
    if pid_ref is not None:
        pid_all = pltriton.load(pid_ref.at[r_all], mask=ok_all, other=0)

    def rows_of(j):  # the tile's lanes of the program's rows, its rows, which of them exist, and the tile's mask
        i = j * block_rows + jnp.arange(block_rows, dtype=jnp.int32)
        r = first + i
        row_ok = (r < rows) & (i < tiles * block_rows)
        return i, r, row_ok, row_ok[:, None] & (c < width)[None, :]

    def fetch(j):  # the tile's gathered word rows (and, with position ids, its gathered position rows)
        i, _, _, m = rows_of(j)
        word = _table_rows(word_ref, _pick(ids_all, lanes, i), word_ref.shape[0], c, m)
        if pid_ref is None:
            return word
        return word, _table_rows(pos_ref, _pick(pid_all, lanes, i), pos_ref.shape[0], c, m)

    def tile(j, fetched):  # `fetched`: this tile's rows, fetched in the step before (with one tile, fetched here)
        if tiles > 1:
            nxt = fetch(jnp.minimum(j + 1, tiles - 1))
        else:
            fetched, nxt = fetch(j), ()
        i, r, row_ok, m = rows_of(j)
        if pid_ref is None:
            word = fetched
            pos = pltriton.load(pos_ref.at[(r % seq)[:, None], c[None, :]], mask=m, other=0.0).astype(jnp.float32)
        else:
            word, pos = fetched
        tt = _pick(tt_all, lanes, i)
        h = word + pos + _table_rows(type_ref, tt, type_ref.shape[0], c, m)  # the reference's order
        h = jnp.where(m, h, 0.0)
        mean = jnp.sum(h, axis=1) / width
        centered = jnp.where(m, h - mean[:, None], 0.0)
        rstd = jax.lax.rsqrt(jnp.sum(centered * centered, axis=1) / width + eps)
        y = centered * rstd[:, None] * scale[None, :] + shift[None, :]
        if rate:
            y = jnp.where(pk.keep(seed_ref, r, 0, wp, width, rate), y * keep_scale(rate), 0.0)
        pk.store(y_ref.at[r[:, None], c[None, :]], y, m)
        pk.store(mean_ref.at[r], mean, row_ok)
        pk.store(rstd_ref.at[r], rstd, row_ok)
        return nxt

    if tiles == 1:
        tile(0, ())
    else:
        jax.lax.fori_loop(0, tiles, tile, fetch(0))


def _bwd_kernel(ids_ref, tt_ref, pid_ref, word_ref, pos_ref, type_ref, scale_ref, seed_ref, mean_ref, rstd_ref,
                dy_ref, dh_ref, dscale_ref, dshift_ref, dpos_ref, dtype_ref, *, batch, width, seq, rate, block_rows,
                batch_per_program, prefetch):
    """Program (s, k): position s of its batch rows. With position ids (`pid_ref`) the position rows are gathered by
    id and there is no `dpos_ref` (None): a program's rows then hold different positions, so the caller scatter-adds
    dh by position id instead; without (`pid_ref` None) every row adds position row s."""
    wp = dh_ref.shape[-1]
    s, k = pl.program_id(0), pl.program_id(1)
    n_types = type_ref.shape[0]
    c = jnp.arange(wp, dtype=jnp.int32)
    col_ok = c < width
    scale = pk.load(scale_ref, col_ok, 0.0).astype(jnp.float32)
    # The program's ids, type ids and statistics, loaded once before its loop: no load in the loop then depends on
    # another load of the same step (the gathers' addresses are register math), so Triton's software pipeline
    # (`bwd_num_stages` > 1) can issue a step's loads ahead of it.
    lanes = jnp.arange(pk.next_pow2(batch_per_program), dtype=jnp.int32)
    b_all = k * batch_per_program + lanes
    ok_all = (b_all < batch) & (lanes < batch_per_program)
    r_all = b_all * seq + s
    ids_all, tt_all = (pltriton.load(ref.at[r_all], mask=ok_all, other=0) for ref in (ids_ref, tt_ref))
    if pid_ref is not None:
        pid_all = pltriton.load(pid_ref.at[r_all], mask=ok_all, other=0)
    n_pos = 1 if pid_ref is None else 0  # position s's partial sum (unpacked rows only)
    mean_all, rstd_all = (pltriton.load(ref.at[r_all], mask=ok_all, other=0.0) for ref in (mean_ref, rstd_ref))

    def rows_of(j):  # the chunk's lanes of the program's rows, their rows r, and masks
        i = j * block_rows + jnp.arange(block_rows, dtype=jnp.int32)
        b = k * batch_per_program + i
        row_ok = (b < batch) & (i < batch_per_program)
        return i, b * seq + s, row_ok[:, None] & col_ok[None, :]

    def fetch(j):  # the chunk's rows from DRAM: the gathered word rows and dy (the rest is L2's or registers')
        i, r, m = rows_of(j)
        word = _table_rows(word_ref, _pick(ids_all, lanes, i), word_ref.shape[0], c, m)
        return word, pltriton.load(dy_ref.at[r[:, None], c[None, :]], mask=m, other=0.0).astype(jnp.float32)

    def chunk(j, carry):
        sums, fetched = carry
        if prefetch:  # this chunk's rows were fetched in the step before; fetch the next one's now
            (word, dy), fetched = fetched, fetch(jnp.minimum(j + 1, steps - 1))
        else:
            word, dy = fetch(j)
        i, r, m = rows_of(j)
        tt = _pick(tt_all, lanes, i)
        if pid_ref is None:
            pos = pltriton.load(pos_ref.at[(r % seq)[:, None], c[None, :]], mask=m, other=0.0).astype(jnp.float32)
        else:  # the position table is small (L2's), as in the unpacked case: gathered here, not fetched ahead
            pos = _table_rows(pos_ref, _pick(pid_all, lanes, i), pos_ref.shape[0], c, m)
        h = word + pos + _table_rows(type_ref, tt, n_types, c, m)  # the reference's order
        mean, rstd = _pick(mean_all, lanes, i), _pick(rstd_all, lanes, i)
        xhat = jnp.where(m, (h - mean[:, None]) * rstd[:, None], 0.0)
        if rate:
            dy = jnp.where(pk.keep(seed_ref, r, 0, wp, width, rate), dy * keep_scale(rate), 0.0)
        dyg = dy * scale[None, :]
        # d/dh of LN: rstd * (dyg - mean(dyg) - xhat * mean(dyg * xhat))   (biased variance, as the reference)
        c1 = jnp.sum(dyg, axis=1) / width
        c2 = jnp.sum(dyg * xhat, axis=1) / width
        dh = jnp.where(m, (dyg - c1[:, None] - xhat * c2[:, None]) * rstd[:, None], 0.0)
        pk.store(dh_ref.at[r[:, None], c[None, :]], dh, m)
        dscale, dshift, *rest = sums
        dpos, dtypes = rest[:n_pos], rest[n_pos:]
        dtypes = [acc + jnp.sum(jnp.where((tt == t)[:, None], dh, 0.0), axis=0) for t, acc in enumerate(dtypes)]
        return (dscale + jnp.sum(dy * xhat, axis=0), dshift + jnp.sum(dy, axis=0),
                *(acc + jnp.sum(dh, axis=0) for acc in dpos), *dtypes), fetched

    steps = pl.cdiv(batch_per_program, block_rows)
    zero = jnp.zeros((wp,), jnp.float32)
    sums, _ = jax.lax.fori_loop(0, steps, chunk, ((zero,) * (2 + n_pos + n_types), fetch(0) if prefetch else ()))
    for ref, total in zip((dscale_ref, dshift_ref, dpos_ref)[:2 + n_pos], sums):
        pk.store(ref, total[None, :], col_ok[None, :])
    for t in range(n_types):
        pk.store(dtype_ref.at[pl.ds(t, 1)], sums[2 + n_pos + t][None, None, :], col_ok[None, None, :])


def _whole(shape):
    """A BlockSpec of a whole array (every program sees all of it: the tables, the ids, the statistics)."""
    return pl.BlockSpec(shape, lambda *_: (0,) * len(shape))


def _id_table_specs(rows: int, wp: int, n_ids: int, *tables):
    """The specs both kernels take first: the `n_ids` (R,) id arrays (ids, type ids and, for packed rows, position
    ids), then each (n, D) table whole (D padded to wp)."""
    return [_whole((rows,))] * n_ids + [_whole((t.shape[0], wp)) for t in tables]


def _absent(kernel, *at: int):
    """`kernel` given None for its refs at positions `at` (ascending): the operands or outputs a variant lacks."""
    def body(*refs):
        refs = list(refs)
        for i in at:
            refs.insert(i, None)
        return kernel(*refs)
    return body


def check_shapes(ids, word, position, token_type, position_ids=None):
    """ValueError (before any compile) naming the operand whose shape or dtype the kernels do not take. Without
    `position_ids` the position table is the S rows of positions 0..S-1; with them, any table they index."""
    if ids.ndim != 2:
        raise ValueError(f"input_ids.shape={ids.shape} must be (B, S)")
    if not jnp.issubdtype(ids.dtype, jnp.integer):
        raise ValueError(f"input_ids.dtype={ids.dtype} must be an integer type")
    d = word.shape[-1]
    for name, t in (("word", word), ("position", position), ("token_type", token_type)):
        if t.ndim != 2 or t.shape[-1] != d:
            raise ValueError(f"{name}.shape={t.shape} must be (n, {d}) like word.shape={word.shape}")
    if position_ids is not None:
        if position_ids.shape != ids.shape:
            raise ValueError(f"position_ids.shape={position_ids.shape} must be input_ids.shape={ids.shape}")
        if not jnp.issubdtype(position_ids.dtype, jnp.integer):
            raise ValueError(f"position_ids.dtype={position_ids.dtype} must be an integer type")
        if position.shape[0] < 1:
            raise ValueError(f"position.shape={position.shape} must have a row for position_ids to index")
    elif position.shape[0] != ids.shape[1]:
        raise ValueError(f"position.shape={position.shape} must have S = {ids.shape[1]} rows (input_ids.shape="
                         f"{ids.shape}): the positions' rows of this sequence length")


def _id_arrays(rows: int, ids, types, position_ids):
    """The id operands, flat: ids, type ids and (packed rows) position ids."""
    return tuple(a.reshape(rows) for a in (ids, types, position_ids) if a is not None)


def forward(ids, types, word, position, token_type, scale, shift, seed_words, *, rate, eps, out_dtype, interpret,
            blocks: Blocks, position_ids=None):
    """ids, types: (B, S) int32; word (V, D), position (S, D), token_type (T, D); scale, shift (D,); seed_words
    uint32[4] (row offset in rows). With `position_ids` (B, S) int32, `position` is the whole (P, D) table and row
    (b, s) adds position[position_ids[b, s]]. Returns y (B·S, D) in out_dtype, mean (B·S,), rstd (B·S,)."""
    check_shapes(ids, word, position, token_type, position_ids)
    (batch, seq), width = ids.shape, word.shape[1]
    rows, wp, br = batch * seq, pk.next_pow2(width), blocks.block_rows
    tiles = max(1, min(blocks.tiles_per_program, pl.cdiv(rows, br)))
    id_arrays = _id_arrays(rows, ids, types, position_ids)
    ins = (*id_arrays, word, position, token_type, scale, shift, seed_words)
    specs = _id_table_specs(rows, wp, len(id_arrays), word, position, token_type)
    specs += [_whole((wp,))] * 2 + [_whole((4,))]
    body = functools.partial(_fwd_kernel, rows=rows, width=width, seq=seq, rate=rate, eps=eps, block_rows=br,
                             tiles=tiles)
    return pl.pallas_call(
        body if position_ids is not None else _absent(body, 2),  # no position ids: no pid_ref
        out_shape=(jax.ShapeDtypeStruct((rows, width), out_dtype),
                   jax.ShapeDtypeStruct((rows,), jnp.float32), jax.ShapeDtypeStruct((rows,), jnp.float32)),
        grid=(pl.cdiv(rows, br * tiles),),
        in_specs=specs,
        out_specs=[_whole((rows, wp)), _whole((rows,)), _whole((rows,))],
        compiler_params=pk.compiler_params(blocks.num_warps, blocks.num_stages),
        interpret=interpret,
        name="embedding_ln_fwd",
    )(*ins)


def _batch_per_program(batch: int, blocks: Blocks) -> int:
    """The backward's batch rows per program: `bwd_batch_per_program`, at most the batch."""
    return max(1, min(blocks.bwd_batch_per_program, batch))


def programs_per_position(batch: int, blocks: Blocks) -> int:
    """The backward's programs per position (its grid is (S, this)), each `_batch_per_program` batch rows."""
    return pl.cdiv(batch, _batch_per_program(batch, blocks))


def backward(ids, types, word, position, token_type, scale, seed_words, mean, rstd, dy, *, rate, interpret,
             blocks: Blocks, position_ids=None):
    """dy (B·S, D). Returns dh (B·S, D) float32 (the gathered rows' gradient) and float32 partial sums, G = S x
    `programs_per_position` rows each, row s·programs_per_position + k: d_scale (G, D), d_shift (G, D), d_position
    (G, D) (row s's partials are position s's), d_token_type (T, G, D). With `position_ids` (`forward`'s) d_position
    is None: the position table's gradient is dh scatter-added by position id (the caller's)."""
    (batch, seq), width = ids.shape, word.shape[1]
    rows, wp = batch * seq, pk.next_pow2(width)
    n_types = token_type.shape[0]
    bpp = _batch_per_program(batch, blocks)
    per_pos = programs_per_position(batch, blocks)
    groups = seq * per_pos
    packed = position_ids is not None
    id_arrays = _id_arrays(rows, ids, types, position_ids)
    ins = (*id_arrays, word, position, token_type, scale, seed_words, mean, rstd, dy)
    specs = _id_table_specs(rows, wp, len(id_arrays), word, position, token_type)
    specs += [_whole((wp,)), _whole((4,)), _whole((rows,)), _whole((rows,)), _whole((rows, wp))]
    part = jax.ShapeDtypeStruct((groups, width), jnp.float32)
    part_spec = pl.BlockSpec((1, wp), lambda s, k: (s * per_pos + k, 0))
    n_parts = 2 if packed else 3  # d_scale, d_shift and (unpacked rows) d_position
    body = functools.partial(_bwd_kernel, batch=batch, width=width, seq=seq, rate=rate,
                             block_rows=min(blocks.bwd_block_rows, pk.next_pow2(bpp)), batch_per_program=bpp,
                             prefetch=blocks.bwd_prefetch)
    out = pl.pallas_call(
        _absent(body, 14) if packed else _absent(body, 2),  # packed: no dpos_ref (ref 14); else no pid_ref (ref 2)
        out_shape=(jax.ShapeDtypeStruct((rows, width), jnp.float32), *(part,) * n_parts,
                   jax.ShapeDtypeStruct((n_types, groups, width), jnp.float32)),
        grid=(seq, per_pos),
        in_specs=specs,
        out_specs=[_whole((rows, wp)), *(part_spec,) * n_parts,
                   pl.BlockSpec((n_types, 1, wp), lambda s, k: (0, s * per_pos + k, 0))],
        compiler_params=pk.compiler_params(blocks.bwd_num_warps, blocks.bwd_num_stages),
        interpret=interpret,
        name="embedding_ln_bwd",
    )(*ins)
    if packed:
        dh, dscale, dshift, dtypes = out
        return dh, dscale, dshift, None, dtypes
    return out
