"""Mosaic GPU (Hopper+) flash attention for long rows: S = T a multiple of 128 above 128 (BERT's 512), H = 64,
bfloat16, the key mask and dropout; the `mosaic_long` implementation. `kernel_mgpu.py` holds the S = T = 128 kernels,
whose tile math (64 x 64 wgmma tiles of two warpgroups, base-2 scores, the dropout index) these reuse.

Why: at S = 512 the Triton kernels multiply with synchronous mma instructions and reach ~150-200 TFLOP/s (forward 86
us, backward 218 us at B16 N16 p = 0.1: kernels-h200.md, Attention); here the products are wgmma from SMEM, the
inputs arrive by TMA a step ahead, and key blocks past a row's last real key are skipped (their probabilities are
exactly zero, so the result is unchanged).

Both kernels are persistent (one CTA per SM, `kernel_mgpu.programs_for`) with two warpgroups; a key or query block is
128 rows, two 64-row warpgroup tiles.

Forward: a CTA loops over units (b, n, query block) pid, pid + G, ...; warpgroup w owns the unit's queries [64w, 64w +
64) and runs FlashAttention-2's online softmax over the key blocks its example visits (`key_blocks`), each as two
64-key halves: S = Q K^T, the running max, P = exp2(S - m), dropout, acc = alpha acc + P V. Key blocks stream through
two SMEM stages: at each step both warpgroups meet (the stage of the step before is free), then each issues its halves
of the step after next's K, V and mask code (the next unit's Q with them), so loads run a step ahead, across units.

Backward: a CTA owns whole heads (b, n), so dQ is summed by one CTA: for each key block it visits it holds K and V and
loops over the 128-query blocks. Per step, as the S = T = 128 kernel per head: warpgroup w owns queries [64w, 64w + 64)
first (S, dP, P, the mask, dS = P (dP - delta), written to SMEM as bf16, and its dQ share dS K, which the first key
block stores and later ones add by a TMA reduction into a float32 dQ), then, after the warpgroups meet, keys [64w,
64w + 64): dV += P^T dO and dK += dS^T Q in registers across the query blocks. Q, dO, lse and delta of the next step
load while this one computes; the next key block's K and V once this step's last product has read them. Key blocks
past the last real key store zeros. XLA forms delta = rowsum(dO O) before it, and rounds dQ into the packed dQKV
after it.

Numerics and conventions follow `tiles.py` and `kernel_mgpu.py`: the same mask codes and scores, the same dropout mask
bit for bit. A Q/K/V bias (`bias`) is added by XLA before the kernels (as at S = 512 by default, where it goes into the
projection's cuBLAS epilogue); with `bias_grad` the bias gradient is dQKV summed over B and S: q's part from the float32
dQ, k's and v's from the stored tiles (column sums on the matrix unit, as `kernel_mgpu.py`).

On the CPU, `interpret=True` runs them in Mosaic GPU's interpret mode (the math and indexing; layouts are ignored, and
the TMA reduction, which that mode lacks, is a read-add-write of the same tile).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from .. import _mgpu
from .kernel_mgpu import (_HALF, _TILES, _WIDTH, _grad_tile, _iota_cols, _keep, _masked_scores, _ones, _per_col,
                          _per_row, _products, _sync_warpgroups, _t, programs_for)
from .tiles import allowed, shapes

__all__ = ["backward", "check_shape", "forward", "key_blocks", "shape_ok"]

_BLOCK = 2 * _HALF  # rows of a key or query block: two warpgroup tiles
_STAGES = 2  # forward: key blocks in flight (this step's and the next's)
_TILES32 = (plgpu.TilingTransform((8, 32)), plgpu.SwizzleTransform(128))  # SMEM tiles of float32 rows


def shape_ok(s: int, t: int, h: int, dtype) -> bool:
    """Whether these kernels take the shape: S = T a multiple of 128 above 128, H = 64, bfloat16."""
    return (s == t and s % _BLOCK == 0 and s > _BLOCK and h == _WIDTH
            and jnp.dtype(dtype) == jnp.dtype(jnp.bfloat16))


def check_shape(s: int, t: int, h: int, dtype) -> None:
    """ValueError naming the value for shapes these kernels do not take (before anything compiles)."""
    if not shape_ok(s, t, h, dtype):
        raise ValueError(f"the Mosaic GPU long-row attention takes S = T a multiple of {_BLOCK} above {_BLOCK}, "
                         f"H = {_WIDTH} and bfloat16; got S={s}, T={t}, H={h}, dtype={jnp.dtype(dtype).name}")


def key_blocks(code):
    """int32 (B,): how many 128-key blocks each example visits, up to the last holding a key of nonzero code (real,
    or every key of an example without real keys). The blocks after it hold padded keys only, whose probability is
    exactly 0: skipping them leaves the result unchanged."""
    b, t = code.shape
    some = jnp.any(code.reshape(b, t // _BLOCK, _BLOCK) != 0, axis=2)
    return jnp.max(jnp.where(some, jnp.arange(1, t // _BLOCK + 1, dtype=jnp.int32), 0), axis=1).astype(jnp.int32)


def _row_words(seed, heads: int, s: int, t: int):
    """(3, S) uint32: the two seed words over every query row, and row s's dropout base ((seed[2] * heads + seed[3])
    * S + s) * T; head (b, n) adds (b * heads + n) * S * T (`_first`), as tiles.py indexes the reference's BNST mask."""
    u32 = jnp.uint32
    rowbase = ((seed[2] * u32(heads) + seed[3]) * u32(s) + jnp.arange(s, dtype=u32)) * u32(t)
    return jnp.stack([jnp.broadcast_to(seed[0], (s,)), jnp.broadcast_to(seed[1], (s,)), rowbase])


def _seeds(words_s, interpret):
    """The seed words of a (3, 64) SMEM block as per-row (64, 64) tiles (what `_keep` takes)."""
    return _per_row(words_s.at[0], interpret), _per_row(words_s.at[1], interpret)


def _first(words_s, bi, ni, heads: int, s: int, t: int, interpret):
    """The first dropout index of each query row of a warpgroup tile of head (bi, ni), (64, 64) uint32."""
    return _per_row(words_s.at[2], interpret) + (bi * heads + ni).astype(jnp.uint32) * jnp.uint32(s * t)


def _vector(x, reduce_axis: int, interpret):
    """A (64,) float32 constant in the layout of a (64, 64) WGMMA tile's reduction over `reduce_axis` (a loop carry
    needs its layout fixed)."""
    return x if interpret else plgpu.layout_cast(x, plgpu.Layout.WGMMA.reduce(reduce_axis))


def _tile(x, interpret):
    """A (64, 64) float32 constant in the WGMMA layout."""
    return x if interpret else plgpu.layout_cast(x, plgpu.Layout.WGMMA)


def _accumulate(interpret, *accs):
    """`_products` into running accumulators: each argument is (value, pairs) and returns value + the pairs'
    products, the chains issued before any wait. (The products go to fresh accumulators and are added in
    registers: jax 0.11's `pl.run_state` over initialised accumulators fails to lower when its body reads an SMEM ref
    indexed by a constant, as these read K and V.)"""
    sums = _products(interpret, *[pairs for _, pairs in accs])
    return tuple(value + s for (value, _), s in zip(accs, sums))


def _call_setup(q, k, seed, bias, *, rate, interpret, heads, packed, programs, units_per_head):
    b, s, n, h, t = shapes(q, k, packed)
    check_shape(s, t, h, q.dtype)
    if bias is not None:
        raise ValueError("the Mosaic GPU long-row attention takes no folded bias (blocks.fold_bias=False: XLA adds it)")
    heads = n if heads is None else heads
    drop = seed is not None and rate > 0.0
    units = b * n * units_per_head
    grid = programs_for(units, interpret) if programs is None else programs
    if not 1 <= grid <= units:
        raise ValueError(f"programs={grid} must be in [1, {units}] (the kernel's units of work)")
    return b, s, n, h, heads, drop, units, grid


# ---------------------------------------------------------------------------------------------------- forward


def forward(q, k, v, code, seed, *, rate: float, interpret: bool, heads: int | None = None, packed: bool = False,
            bias=None, programs: int | None = None):
    """As the Triton `forward.forward` for S = T a multiple of 128 above 128, H = 64, bf16: (o (B, S, N, H), lse
    (B, N, S) fp32, base 2). `programs`: CTAs of the persistent grid (default one per SM). All call sites share one
    compiled kernel (`_mgpu.one_module`)."""
    return _forward_jit(q, k, v, code, seed, bias, rate=float(rate), interpret=interpret, heads=heads,
                        packed=packed, programs=programs)


def _forward(q, k, v, code, seed, bias, *, rate, interpret, heads, packed, programs):
    b, s, n, h, t = shapes(q, k, packed)
    qb = s // _BLOCK
    b, s, n, h, heads, drop, units, grid = _call_setup(q, k, seed, bias, rate=rate, interpret=interpret, heads=heads,
                                                       packed=packed, programs=programs, units_per_head=qb)
    dtype = q.dtype
    scale = h ** -0.5
    kv_loads = 3 * 2  # per stage: K, V and mask-code halves from each warpgroup
    q_loads = 1 + drop  # per query slot and warpgroup: its Q half (and its rows' dropout words)

    def body(*refs):
        refs = list(refs)
        (kv_s, q_s, o_s, code_s, words_s, lse_s), kv_bars, q_bars, sync = refs.pop()
        in_refs = [refs.pop(0) for _ in range(1 if packed else 3)]
        code_ref, nkb_ref = refs.pop(0), refs.pop(0)
        words_ref = refs.pop(0) if drop else None
        o_ref, lse_ref = refs

        pid, w = lax.axis_index("p"), lax.axis_index("wg")
        mine = (units - 1 - pid) // grid + 1  # units pid, pid + grid, ... < B * N * S / 128
        halves = [pl.ds(kh * _HALF, _HALF) for kh in (0, 1)]

        def unit(i):  # (b, n, query block) of this program's i-th unit
            x = jnp.minimum(pid + i * grid, units - 1)  # clamped: the cursor may run past the last unit
            return x // (n * qb), (x // qb) % n, x % qb

        def rows_of(c, bi, ni, r0):  # GMEM (64, H) rows [r0, r0 + 64) of q (c = 0), k (1) or v (2) of head (bi, ni)
            sl = pl.ds(r0, _HALF)
            return in_refs[0].at[bi, sl, c, ni] if packed else in_refs[c].at[bi, sl, ni]

        def issue(cursor, stage):
            """This warpgroup's halves of the step at `cursor` (unit i, key block kb) into `stage` (with the unit's
            Q at its first key block); the cursor of the step after it."""
            i, kb = cursor
            bi, ni, qi = unit(i)

            @pl.when(i < mine)
            def _():
                r0 = kb * _BLOCK + w * _HALF
                mine_rows = pl.ds(w * _HALF, _HALF)
                plgpu.copy_gmem_to_smem(rows_of(1, bi, ni, r0), kv_s.at[stage, 0, mine_rows], kv_bars.at[stage])
                plgpu.copy_gmem_to_smem(rows_of(2, bi, ni, r0), kv_s.at[stage, 1, mine_rows], kv_bars.at[stage])
                plgpu.copy_gmem_to_smem(code_ref.at[bi, pl.ds(r0, _HALF)], code_s.at[stage, mine_rows],
                                        kv_bars.at[stage])

                @pl.when(kb == 0)
                def _():
                    slot, q0 = i % _STAGES, qi * _BLOCK + w * _HALF
                    bar = q_bars.at[slot * 2 + w]
                    plgpu.copy_gmem_to_smem(rows_of(0, bi, ni, q0), q_s.at[slot, w], bar)
                    if drop:
                        plgpu.copy_gmem_to_smem(words_ref.at[:, pl.ds(q0, _HALF)], words_s.at[slot, w], bar)

            last = kb + 1 >= nkb_ref[bi]
            return jnp.where(last, i + 1, i), jnp.where(last, 0, kb + 1)

        cursor = issue((jnp.int32(0), jnp.int32(0)), 0)  # the first step; each step issues the one after it
        cols = _iota_cols(interpret) if drop else None

        def unit_body(i, carry):
            j, cursor = carry
            bi, ni, qi = unit(i)
            slot = i % _STAGES
            plgpu.barrier_wait(q_bars.at[slot * 2 + w])
            q_tile = q_s.at[slot, w]
            if drop:
                seeds = _seeds(words_s.at[slot, w], interpret)
                first = _first(words_s.at[slot, w], bi, ni, heads, s, t, interpret)

            def key_block(kb, carry):
                j, cursor, m, l, acc = carry  # noqa: E741
                stage = j % _STAGES
                _sync_warpgroups(sync)  # both warpgroups are done with step j - 1: its stage takes step j + 1
                cursor = issue(cursor, (j + 1) % _STAGES)
                plgpu.barrier_wait(kv_bars.at[stage])
                k_s, v_s = kv_s.at[stage, 0], kv_s.at[stage, 1]
                s0, s1 = _products(interpret, [(q_tile, _t(k_s.at[halves[0]]))], [(q_tile, _t(k_s.at[halves[1]]))])
                xs = [_masked_scores(sc, allowed(_per_col(code_s.at[stage, halves[kh]], interpret), None), scale)
                      for kh, sc in enumerate((s0, s1))]
                m_new = jnp.maximum(m, jnp.maximum(jnp.max(xs[0], axis=1), jnp.max(xs[1], axis=1)))
                alpha = jnp.exp2(m - m_new)  # rescales the old sums; 0 on the first step (m = -inf)
                ps = [jnp.exp2(x - lax.broadcast_in_dim(m_new, (_HALF, _HALF), [0])) for x in xs]
                l = alpha * l + jnp.sum(ps[0], axis=1) + jnp.sum(ps[1], axis=1)  # before dropout  # noqa: E741
                if drop:
                    ps = [jnp.where(_keep(seeds, first + (kb * _BLOCK).astype(jnp.uint32), cols, kh, rate), p, 0.0)
                          for kh, p in enumerate(ps)]
                (acc,) = _accumulate(interpret, (acc * lax.broadcast_in_dim(alpha, (_HALF, _HALF), [0]),
                                                 [(ps[0].astype(dtype), v_s.at[halves[0]]),
                                                  (ps[1].astype(dtype), v_s.at[halves[1]])]))
                return j + 1, cursor, m_new, l, acc

            init = (j, cursor, _vector(jnp.full((_HALF,), -jnp.inf, jnp.float32), 1, interpret),
                    _vector(jnp.zeros((_HALF,), jnp.float32), 1, interpret),
                    _tile(jnp.zeros((_HALF, _HALF), jnp.float32), interpret))
            j, cursor, m, l, acc = lax.fori_loop(0, nkb_ref[bi], key_block, init)  # noqa: E741
            inv = (1.0 / (1.0 - rate) if drop else 1.0) / l
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the last unit's stores have read o_s and lse_s
            o_s.at[w][...] = (acc * lax.broadcast_in_dim(inv, (_HALF, _HALF), [0])).astype(dtype)
            lse_s.at[w][...] = m + jnp.log2(l)
            plgpu.commit_smem()
            q0 = qi * _BLOCK + w * _HALF
            plgpu.copy_smem_to_gmem(o_s.at[w], o_ref.at[bi, pl.ds(q0, _HALF), ni])
            plgpu.copy_smem_to_gmem(lse_s.at[w], lse_ref.at[bi, ni, pl.ds(q0, _HALF)])
            return j, cursor

        lax.fori_loop(0, mine, unit_body, (jnp.int32(0), cursor))
        plgpu.wait_smem_to_gmem(0)

    def entry(*refs):
        scratch = (
            plgpu.SMEM((_STAGES, 2, _BLOCK, h), dtype, transforms=_TILES),  # K and V of the key blocks in flight
            plgpu.SMEM((_STAGES, 2, _HALF, h), dtype, transforms=_TILES),  # two units' Q, by warpgroup
            plgpu.SMEM((2, _HALF, h), dtype, transforms=_TILES),  # O, staged by warpgroup
            plgpu.SMEM((_STAGES, _BLOCK), jnp.int32),  # mask codes of the key blocks in flight
            plgpu.SMEM((_STAGES, 2, 3, _HALF), jnp.uint32),  # two units' dropout words, by warpgroup
            plgpu.SMEM((2, _HALF), jnp.float32),  # lse, staged by warpgroup
        )
        pl.run_scoped(lambda *scoped: body(*refs, scoped), scratch,
                      plgpu.Barrier(num_arrivals=kv_loads, num_barriers=_STAGES),
                      plgpu.Barrier(num_arrivals=q_loads, num_barriers=2 * _STAGES),
                      plgpu.Barrier(num_arrivals=2), collective_axes="wg")

    out_type = (jax.ShapeDtypeStruct((b, s, n, h), dtype), jax.ShapeDtypeStruct((b, n, s), jnp.float32))
    inputs = ([q] if packed else [q, k, v]) + [code, key_blocks(code)]
    if drop:
        inputs.append(_row_words(seed, heads, s, t))
    return plgpu.kernel(entry, out_type=out_type, grid=(grid,), grid_names=("p",), num_threads=2, thread_name="wg",
                        compiler_params=plgpu.CompilerParams(approx_math=True), kernel_name="flash_attention_long_fwd",
                        interpret=_mgpu.interpret_params(interpret))(*inputs)


_forward_jit = _mgpu.one_module(_forward, ("rate", "interpret", "heads", "packed", "programs"))


# ---------------------------------------------------------------------------------------------------- backward


def backward(q, k, v, code, seed, o, lse, do, *, rate: float, interpret: bool, heads: int | None = None,
             packed: bool = False, bias=None, bias_grad: bool = False, programs: int | None = None):
    """As the Triton `backward.backward`: (dq, dk, dv), or with `packed` the packed dQKV (B, S, 3, N, H); with
    `bias_grad` also dbias (3, N, H) fp32. `programs`: CTAs of the persistent grid (default one per SM, never more
    than the B * N heads). All call sites share one compiled kernel (`_mgpu.one_module`)."""
    return _backward_jit(q, k, v, code, seed, o, lse, do, bias, rate=float(rate), interpret=interpret, heads=heads,
                         packed=packed, bias_grad=bias_grad, programs=programs)


def _snake(i, pid, grid: int):
    """The head index of program `pid` in round i: rounds of `grid` heads, odd rounds in reverse, so that over the
    heads sorted by cost the programs' totals even out (the longest with the shortest)."""
    return i * grid + jnp.where(i % 2 == 0, pid, grid - 1 - pid)


def _rounds(n_heads: int, grid: int, pid):
    """How many heads program `pid` takes under `_snake`: every full round, and the last one if its index is inside."""
    full, rest = divmod(n_heads, grid)
    if rest == 0:
        return full
    last = jnp.where(full % 2 == 0, pid, grid - 1 - pid)
    return full + (last < rest).astype(jnp.int32)


def _add_to(dq_s, dst, value, accumulate, rmw_bar, interpret):
    """Write `value` (64, 64) fp32 to the GMEM tile `dst` through the SMEM staging `dq_s`: a plain store, or where
    `accumulate` (traced) a TMA reduction adding to it. Interpret mode, which has no TMA reductions, reads the tile
    back and adds before the store (one CTA owns the head's dQ, so nothing else writes the tile meanwhile)."""
    if interpret:
        @pl.when(accumulate)
        def _():
            plgpu.copy_gmem_to_smem(dst, dq_s, rmw_bar)
            plgpu.barrier_wait(rmw_bar)

        value = value + jnp.where(accumulate, dq_s[...], 0.0)
        dq_s[...] = value
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(dq_s, dst)
        plgpu.wait_smem_to_gmem(0)
        return
    dq_s[...] = value
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(dq_s, dst, predicate=jnp.logical_not(accumulate))
    plgpu.copy_smem_to_gmem(dq_s, dst, predicate=accumulate, reduction_op="add")


def _backward(q, k, v, code, seed, o, lse, do, bias, *, rate, interpret, heads, packed, bias_grad, programs):
    b, s, n, h, heads, drop, n_heads, grid = _call_setup(q, k, seed, bias, rate=rate, interpret=interpret,
                                                         heads=heads, packed=packed, programs=programs,
                                                         units_per_head=1)
    dtype = q.dtype
    scale = h ** -0.5
    qb_count = kb_count = s // _BLOCK
    step_loads = 2 * (4 + drop)  # per step: Q, dO, lse, delta halves (and dropout words) from each warpgroup
    kv_loads = 3 * 2  # per key block: K, V and mask-code halves from each warpgroup

    def body(*refs):
        refs = list(refs)
        (kv_s, buf, p_s, ds_s, dq_s, lse_s, delta_s, code_s, words_s, ones_s, sum_s), step_bars, kv_bar, rmw_bars, \
            sync = refs.pop()
        in_refs = [refs.pop(0) for _ in range(1 if packed else 3)]
        code_ref, nkb_ref, order_ref, do_ref, lse_ref, delta_ref = refs[:6]
        refs = refs[6:]
        words_ref = refs.pop(0) if drop else None
        out_refs = refs  # dqkv or (dk, dv), then dq (fp32), then the bias-gradient sums
        sums_ref = out_refs.pop() if bias_grad else None
        dq_ref = out_refs.pop()
        grad_refs = out_refs if packed else [None, *out_refs]  # indexed by C as `rows_of` reads q, k, v

        pid, w = lax.axis_index("p"), lax.axis_index("wg")
        rows = pl.ds(w * _HALF, _HALF)  # this warpgroup's half of a block
        halves = [pl.ds(kh * _HALF, _HALF) for kh in (0, 1)]
        mine = _rounds(n_heads, grid, pid)

        def head(i):  # (b, n) of this program's i-th head: round i of the snake over the heads, longest first
            x = order_ref[jnp.minimum(_snake(i, pid, grid), n_heads - 1)]
            return x // n, x % n

        def rows_of(refs_, c, bi, ni, r0):  # GMEM (64, H) rows [r0, r0 + 64) of q / k / v (c = 0, 1, 2) or grads
            sl = pl.ds(r0, _HALF)
            return refs_[0].at[bi, sl, c, ni] if packed else refs_[c].at[bi, sl, ni]

        def issue_kv(i, kb):
            """This warpgroup's halves of K, V and the mask codes of key block kb of head i (if it has one)."""
            @pl.when(i < mine)
            def _():
                bi, ni = head(i)
                r0 = kb * _BLOCK + w * _HALF
                plgpu.copy_gmem_to_smem(rows_of(in_refs, 1, bi, ni, r0), kv_s.at[0, rows], kv_bar)
                plgpu.copy_gmem_to_smem(rows_of(in_refs, 2, bi, ni, r0), kv_s.at[1, rows], kv_bar)
                plgpu.copy_gmem_to_smem(code_ref.at[bi, pl.ds(r0, _HALF)], code_s.at[rows], kv_bar)

        def issue_step(cursor, slot):
            """This warpgroup's halves of the step at `cursor` (head i, key block kb, query block qb) into `slot`;
            the cursor of the step after it."""
            i, kb, qb = cursor
            bi, ni = head(i)

            @pl.when(i < mine)
            def _():
                q0 = qb * _BLOCK + w * _HALF
                bar = step_bars.at[slot]
                plgpu.copy_gmem_to_smem(rows_of(in_refs, 0, bi, ni, q0), buf.at[slot, 0, rows], bar)
                plgpu.copy_gmem_to_smem(do_ref.at[bi, pl.ds(q0, _HALF), ni], buf.at[slot, 1, rows], bar)
                plgpu.copy_gmem_to_smem(lse_ref.at[bi, ni, pl.ds(q0, _HALF)], lse_s.at[slot, rows], bar)
                plgpu.copy_gmem_to_smem(delta_ref.at[bi, ni, pl.ds(q0, _HALF)], delta_s.at[slot, rows], bar)
                if drop:
                    plgpu.copy_gmem_to_smem(words_ref.at[:, pl.ds(q0, _HALF)], words_s.at[slot, w], bar)

            next_kb = qb + 1 >= qb_count
            next_head = next_kb & (kb + 1 >= nkb_ref[bi])
            return (jnp.where(next_head, i + 1, i), jnp.where(next_head, 0, jnp.where(next_kb, kb + 1, kb)),
                    jnp.where(next_kb, 0, qb + 1))

        def meet():
            """Every TMA store of either warpgroup has read its SMEM, and both warpgroups are done with the step
            before: its Q/dO slot, P, dS and the staging buffers may be refilled."""
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)
            _sync_warpgroups(sync)

        issue_kv(jnp.int32(0), jnp.int32(0))
        cursor = issue_step((jnp.int32(0), jnp.int32(0), jnp.int32(0)), 0)
        cols = _iota_cols(interpret) if drop else None
        if bias_grad:
            ones_s[...] = _ones(dtype, interpret)  # made visible by the first step's meeting

        def store_kv(bi, ni, kb, dk, dv):
            """dK and dV rows of key block kb (this warpgroup's 64 keys), staged in its dS half; with `bias_grad`
            their column sums (of the rounded tiles, as stored)."""
            out_k, out_v = ds_s.at[w, pl.ds(0, _HALF)], ds_s.at[w, pl.ds(_HALF, _HALF)]
            out_k[...] = dk.astype(dtype)
            out_v[...] = dv.astype(dtype)
            plgpu.commit_smem()
            r0 = kb * _BLOCK + w * _HALF
            plgpu.copy_smem_to_gmem(out_k, rows_of(grad_refs, 1, bi, ni, r0))
            plgpu.copy_smem_to_gmem(out_v, rows_of(grad_refs, 2, bi, ni, r0))
            if bias_grad:  # (tile^T @ ones)[h, :] = sum over rows of column h
                sums = _products(interpret, [(_t(out_k), ones_s)], [(_t(out_v), ones_s)])
                for c, x in enumerate(sums):
                    sum_s.at[w, c][...] = jnp.max(x, axis=1)
                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(sum_s.at[w], sums_ref.at[bi, kb, w, :, ni])

        def head_body(i, carry):
            j, cursor = carry
            bi, ni = head(i)
            nk = nkb_ref[bi]

            def key_block(kb, carry):
                j, cursor = carry
                plgpu.barrier_wait(kv_bar)
                plgpu.wait_smem_to_gmem(0)  # the previous key block's dQ writes are done before this one adds

                def query_block(qb, carry):
                    j, cursor, dk, dv = carry
                    slot = j % 2
                    meet()
                    cursor = issue_step(cursor, 1 - slot)
                    plgpu.barrier_wait(step_bars.at[slot])
                    q_s, do_s = buf.at[slot, 0], buf.at[slot, 1]

                    # ---- queries [64w, 64w + 64) of the block: S, dP, P, the mask, dS and this key block's dQ share
                    lse = _per_row(lse_s.at[slot, rows], interpret)
                    delta = _per_row(delta_s.at[slot, rows], interpret)
                    if drop:
                        seeds = _seeds(words_s.at[slot, w], interpret)
                        first = (_first(words_s.at[slot, w], bi, ni, heads, s, s, interpret)
                                 + (kb * _BLOCK).astype(jnp.uint32))
                    ds16 = []
                    for kh in (0, 1):  # one key half at a time: two (64, 64) fp32 tiles live, not four
                        sc, dp = _products(interpret, [(q_s.at[rows], _t(kv_s.at[0, halves[kh]]))],
                                           [(do_s.at[rows], _t(kv_s.at[1, halves[kh]]))])
                        keep = _keep(seeds, first, cols, kh, rate) if drop else None
                        pd, ds = _grad_tile(sc, dp, _per_col(code_s.at[halves[kh]], interpret), lse, delta, scale,
                                            keep, rate, dtype)
                        ds16.append(ds)
                        p_s.at[kh, rows][...] = pd  # (key half, query, key)
                        ds_s.at[kh, rows][...] = ds
                    (dq,) = _products(interpret, [(ds16[0], kv_s.at[0, halves[0]]), (ds16[1], kv_s.at[0, halves[1]])])
                    _add_to(dq_s.at[w], dq_ref.at[bi, pl.ds(qb * _BLOCK + w * _HALF, _HALF), ni], dq * scale,
                            kb > 0, rmw_bars.at[w], interpret)
                    _sync_warpgroups(sync)  # P and dS of both query halves in SMEM; K and V read for the last time

                    @pl.when(qb == qb_count - 1)
                    def _():  # the next key block (of this head, or the next head's first) loads while dV, dK run
                        last = kb + 1 >= nk
                        issue_kv(jnp.where(last, i + 1, i), jnp.where(last, 0, kb + 1))

                    # ---- keys [64w, 64w + 64): dV += P^T dO, dK += dS^T Q over the block's 128 queries
                    dv, dk = _accumulate(interpret, (dv, [(_t(p_s.at[w]), do_s)]), (dk, [(_t(ds_s.at[w]), q_s)]))
                    return j + 1, cursor, dk, dv

                zeros = _tile(jnp.zeros((_HALF, _HALF), jnp.float32), interpret)
                j, cursor, dk, dv = lax.fori_loop(0, qb_count, query_block, (j, cursor, zeros, zeros))
                meet()  # both warpgroups' dK products have read dS: its buffer stages the outputs
                store_kv(bi, ni, kb, dk * scale, dv)
                return j, cursor

            j, cursor = lax.fori_loop(0, nk, key_block, (j, cursor))

            @pl.when(nk < kb_count)
            def _():  # key blocks of padding only: zero gradients (and zero bias-gradient sums)
                plgpu.wait_smem_to_gmem(0, wait_read_only=True)
                zeros = _tile(jnp.zeros((_HALF, _HALF), jnp.float32), interpret)

                def zero_block(kb, carry):
                    store_kv(bi, ni, kb, zeros, zeros)
                    plgpu.wait_smem_to_gmem(0, wait_read_only=True)
                    return carry

                lax.fori_loop(nk, kb_count, zero_block, 0)

            return j, cursor

        lax.fori_loop(0, mine, head_body, (jnp.int32(0), cursor))
        plgpu.wait_smem_to_gmem(0)

    if packed:
        out_types = [jax.ShapeDtypeStruct(q.shape, dtype)]  # C = 1, 2 written here, C = 0 from dq below
    else:
        out_types = [jax.ShapeDtypeStruct(k.shape, dtype), jax.ShapeDtypeStruct(v.shape, dtype)]
    out_types.append(jax.ShapeDtypeStruct((b, s, n, h), jnp.float32))
    if bias_grad:
        out_types.append(jax.ShapeDtypeStruct((b, kb_count, 2, 2, n, h), jnp.float32))

    def entry(*refs):
        scratch = (
            plgpu.SMEM((2, _BLOCK, h), dtype, transforms=_TILES),  # K and V of the key block
            plgpu.SMEM((2, 2, _BLOCK, h), dtype, transforms=_TILES),  # two steps' Q and dO
            plgpu.SMEM((2, _BLOCK, _HALF), dtype, transforms=_TILES),  # P (dropped), by key half
            plgpu.SMEM((2, _BLOCK, _HALF), dtype, transforms=_TILES),  # dS by key half; then dK, dV staged
            plgpu.SMEM((2, _HALF, h), jnp.float32, transforms=_TILES32),  # dQ shares, staged by warpgroup
            plgpu.SMEM((2, _BLOCK), jnp.float32), plgpu.SMEM((2, _BLOCK), jnp.float32),  # lse, delta (two steps)
            plgpu.SMEM((_BLOCK,), jnp.int32),  # mask codes of the key block
            plgpu.SMEM((2, 2, 3, _HALF), jnp.uint32),  # two steps' dropout words, by warpgroup
            plgpu.SMEM((_HALF, _HALF), dtype, transforms=_TILES),  # ones, for the bias gradient's column sums
            plgpu.SMEM((2, 2, h), jnp.float32),  # bias-gradient partial sums of each warpgroup
        )
        pl.run_scoped(lambda *scoped: body(*refs, scoped), scratch,
                      plgpu.Barrier(num_arrivals=step_loads, num_barriers=2),
                      plgpu.Barrier(num_arrivals=kv_loads), plgpu.Barrier(num_barriers=2),
                      plgpu.Barrier(num_arrivals=2), collective_axes="wg")

    delta = jnp.einsum("bsnh,bsnh->bns", o.astype(jnp.float32), do.astype(jnp.float32))  # rowsum(dO * O)
    nkb = key_blocks(code)
    order = jnp.argsort(-jnp.repeat(nkb, n), stable=True).astype(jnp.int32)  # heads b * N + n, most key blocks first
    inputs = ([q] if packed else [q, k, v]) + [code, nkb, order, do, lse, delta]
    if drop:
        inputs.append(_row_words(seed, heads, s, s))
    out = list(plgpu.kernel(entry, out_type=tuple(out_types), grid=(grid,), grid_names=("p",), num_threads=2,
                            thread_name="wg", compiler_params=plgpu.CompilerParams(approx_math=True),
                            kernel_name="flash_attention_long_bwd",
                            interpret=_mgpu.interpret_params(interpret))(*inputs))
    sums = out.pop() if bias_grad else None
    dq32 = out.pop()
    if packed:
        grads = out[0].at[:, :, 0].set(dq32.astype(dtype))
    else:
        grads = (dq32.astype(dtype), *out)
    if not bias_grad:
        return grads
    kv_sums = jnp.sum(sums, axis=(0, 1, 2))  # (2, N, H): k's and v's
    return grads, jnp.concatenate([jnp.sum(dq32, axis=(0, 1))[None], kv_sums])


_backward_jit = _mgpu.one_module(_backward, ("rate", "interpret", "heads", "packed", "bias_grad", "programs"))
