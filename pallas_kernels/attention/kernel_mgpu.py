"""Mosaic GPU (Hopper+) flash attention for S = T = 128 and head width 64: a one-kernel backward with the same
contract as the Triton `backward.backward` (the key mask or packed rows' segment ids, dropout, packed q/k/v, the
folded Q/K/V bias and its gradient; the `mosaic_bwd` implementation, the default where it runs), and a forward with
`forward.forward`'s (the opt-in `mosaic` implementation: measured no faster than Triton's), persistent alike.

Why: at S = 128 the Triton one-kernel backward multiplies 32 x 128 x 64 tiles with synchronous mma instructions at
~100 TFLOP/s and is latency-bound (~95 us at B64 N16); here the products are Hopper's asynchronous wgmma on 64-row
warpgroup tiles read from SMEM, and the whole (b, n) head moves through SMEM by TMA once (kernels-h200.md, Attention).

A persistent grid: one CTA per SM (`programs_for`), each looping over heads (b, n) = pid, pid + G, ... with two
warpgroups and two input buffers, so the next head's q, k, v, dO, O, lse and mask rows load (TMA) while this head
computes (the backward 70.1 -> 59.2 us of device time at B64 N16 p = 0.1 on an H200). Per head, warpgroup w
owns queries [64w, 64w + 64) first: scores S = Q_w K^T and dP = dO_w V^T (as two 64 x 64 key halves), P = exp2(S *
scale * log2 e - lse), the dropout mask, dS = P * (dP - delta) (kept in registers) and dQ_w = dS K, staged in the
consumed O rows and stored. It writes P (dropped) in bf16 to SMEM, laid out as (key half, query, key) tiles; after a
barrier between the warpgroups, warpgroup w owns keys [64w, 64w + 64) and forms dV_w = P^T dO (wgmma's transposed left
operand), staged in the consumed V rows; both warpgroups then overwrite P with dS in the same buffer and form
dK_w = dS^T Q, staged in the consumed K rows. delta = rowsum(dO * O) is formed from the warpgroup's O and dO tiles.
The inputs of two heads (160 KB), P/dS (32 KB) and the small vectors fit one CTA's SMEM (~206 KB).

Numerics and conventions follow `tiles.py`: base-2 scores, padded keys at finfo.min (exactly zero probability), a
constant score 0 for every key of an all-padded example, the mask drawn from the same hash and index
((b*N + n)*S + s)*T + t as `pallas_kernels.dropout.keep_mask` (bit for bit; each row's first index is formed in the
kernel from the head and a per-row base XLA builds once, (S,) words), P cast to the inputs' dtype for the products.
The Q and V biases (`bias`) are added to the q and v tiles in SMEM and rounded there, as XLA rounds its add (k's
bias cannot change the softmax: its gradient is the column sum of dK, near zero). With `bias_grad`, each
warpgroup sums the columns of the dQ, dK and dV tiles it stores, exactly (a wgmma with a ones tile), and XLA adds
the (B, 2, 3, N, H) partial sums.

Every call goes through one `jax.jit` (see `backward`), so a model's call sites share one compiled kernel.
On the CPU, `interpret=True` runs it in Mosaic GPU's interpret mode (the math and indexing; layouts are ignored).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from .. import _mgpu
from ..dropout import keep_mask_lanes
from .tiles import allowed, masked_ds, shapes

__all__ = ["backward", "check_shape", "forward", "programs_for", "shape_ok"]

_LOG2E = math.log2(math.e)
_PADDED = float(jnp.finfo(jnp.float32).min)  # as tiles.py
_HALF = 64  # rows of a warpgroup's wgmma tile; S = T = 2 * _HALF
_TILES = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))  # SMEM tiles of bf16 rows, 128-byte swizzle
_SEQ, _WIDTH = 2 * _HALF, 64


def shape_ok(s: int, t: int, h: int, dtype) -> bool:
    """Whether this kernel takes the shape: S = T = 128, H = 64, bfloat16 (the dtype checked compiled on the GPU;
    float16 would lower the same way but has not run there)."""
    return s == t == _SEQ and h == _WIDTH and jnp.dtype(dtype) == jnp.dtype(jnp.bfloat16)


def check_shape(s: int, t: int, h: int, dtype) -> None:
    """ValueError naming the value for shapes this kernel does not take (before anything compiles)."""
    if not shape_ok(s, t, h, dtype):
        raise ValueError(f"the Mosaic GPU attention backward takes S = T = {_SEQ}, H = {_WIDTH} and bfloat16; "
                         f"got S={s}, T={t}, H={h}, dtype={jnp.dtype(dtype).name}")


# ---------------------------------------------------------------------------------------------------- layouts


def _load(ref, layout, interpret):
    """A whole SMEM ref in registers in `layout` (interpret mode has no layouts: a plain load)."""
    return ref[...] if interpret else _mgpu.load(ref, layout=layout)


def _per_row(ref, interpret):
    """(64,) values per query row of a warpgroup tile, broadcast along its keys: (64, 64)."""
    v = _load(ref, plgpu.Layout.WGMMA.reduce(1), interpret)
    return lax.broadcast_in_dim(v, (_HALF, _HALF), [0])


def _per_col(ref, interpret):
    """(64,) values per column (key, or head feature), broadcast along the tile's rows: (64, 64)."""
    v = _load(ref, plgpu.Layout.WGMMA.reduce(0), interpret)
    return lax.broadcast_in_dim(v, (_HALF, _HALF), [1])


def _iota_cols(interpret):
    """uint32 column index of a (64, 64) WGMMA tile."""
    if interpret:
        return lax.broadcasted_iota(jnp.uint32, (_HALF, _HALF), 1)
    return plgpu.broadcasted_iota(jnp.uint32, (_HALF, _HALF), 1, layout=plgpu.Layout.WGMMA)


def _ones(dtype, interpret):
    """A (64, 64) tile of ones in the WGMMA layout (the bias gradient's column sums multiply by it)."""
    x = jnp.ones((_HALF, _HALF), dtype)
    return x if interpret else plgpu.layout_cast(x, plgpu.Layout.WGMMA)


class _t:
    """wgmma's transposed view of a (rows, cols) SMEM tile: (cols, rows)."""

    def __init__(self, ref):
        self.ref = ref


def _products(interpret, *accs):
    """Run wgmma chains: each argument is a list of (a, b) operand pairs (SMEM refs, `_t` views, or for `a` a
    register array) summed into one fresh fp32 (64, 64) accumulator; returns the accumulators' values. One scope, so
    the chains are issued before any wait. Interpret mode (whose wgmma takes no transposed views) multiplies the
    loaded operands in fp32 instead: the same products."""
    if interpret:
        def val(x):
            if isinstance(x, _t):
                return x.ref[...].T.astype(jnp.float32)
            return (x if isinstance(x, jax.Array) else x[...]).astype(jnp.float32)
        return tuple(sum(jnp.dot(val(a), val(b)) for a, b in pairs) for pairs in accs)

    view = lambda x: x.ref.transpose((1, 0)) if isinstance(x, _t) else x  # noqa: E731

    def body(*refs):
        for ref, pairs in zip(refs, accs):
            for a, b in pairs:
                plgpu.wgmma(ref, view(a), view(b))
        return tuple(ref[...] for ref in refs)

    return pl.run_scoped(body, *[plgpu.ACC((_HALF, _HALF), jnp.float32) for _ in accs])



def _dropout_words(seed, heads: int):
    """(2, 3, 64) uint32 for the kernels' dropout index, one (3, 64) block per warpgroup's query rows: the two seed
    words, each over 64 entries, and each row's base ((seed[2] * heads + seed[3]) * S + s) * T. Row s of head (b, n)
    starts at index (((b + seed[2]) * heads + n + seed[3]) * S + s) * T (as tiles.py), i.e. base[s] plus
    (b * heads + n) * S * T, which the kernels add (`_first_index`)."""
    u32 = jnp.uint32
    rowbase = ((seed[2] * u32(heads) + seed[3]) * u32(_SEQ) + jnp.arange(_SEQ, dtype=u32)) * u32(_SEQ)
    words = jnp.stack([jnp.broadcast_to(seed[0], (_SEQ,)), jnp.broadcast_to(seed[1], (_SEQ,)), rowbase])  # (3, S)
    return words.reshape(3, 2, _HALF).transpose(1, 0, 2)


def _load_words(words_ref, words_s, words_bar, w, interpret):
    """Warpgroup w's seed words and row bases (`_dropout_words`) into SMEM, once per program: (the two seed words as
    per-row (64, 64) tiles, the column iota), what `_keep` takes."""
    plgpu.copy_gmem_to_smem(words_ref.at[w], words_s.at[w], words_bar.at[w])
    plgpu.barrier_wait(words_bar.at[w])
    return (_per_row(words_s.at[w, 0], interpret), _per_row(words_s.at[w, 1], interpret)), _iota_cols(interpret)


def _first_index(rowbase_ref, bi, ni, heads: int, interpret):
    """The first dropout index of each query row of head (bi, ni)'s warpgroup tile, (64, 64) uint32: its row bases
    (SMEM) plus (bi * heads + ni) * S * T."""
    return _per_row(rowbase_ref, interpret) + (bi * heads + ni).astype(jnp.uint32) * jnp.uint32(_SEQ * _SEQ)


def _masked_scores(sc, kept, scale):
    """Base-2 scores of a (queries, key half) tile, as `tiles.scores`: with `kept` = `tiles.allowed(code, qcode)`
    (the per-key code and, with segments, the query rows'), the kept scores scaled, the others at their fill
    (finfo.min, or 0 for every key of an example without real keys)."""
    keep, fill = kept
    return jnp.where(keep, sc * (scale * _LOG2E), fill)


def _grad_tile(sc, dp, code, lse, delta, scale, keep, rate, dtype, qcode=None):
    """(P dropped, dS) of a (queries, key half) tile in `dtype`, as `tiles.grad_tile`: P from the raw scores `sc`,
    the per-key `code` (with segments also the query rows' `qcode`) and the rows' base-2 `lse`; with `keep` (the
    dropout mask) P and dP scaled by 1/(1 - rate) where kept, 0 elsewhere; dS = P (dP - delta), none at masked
    scores."""
    kept = allowed(code, qcode)
    p = jnp.exp2(_masked_scores(sc, kept, scale) - lse)
    pd = p
    if keep is not None:
        inv_keep = 1.0 / (1.0 - rate)
        pd = jnp.where(keep, p * inv_keep, 0.0)
        dp = jnp.where(keep, dp * inv_keep, 0.0)
    return pd.astype(dtype), masked_ds(p, dp, delta, kept[0], qcode is not None).astype(dtype)


def _keep(seeds, first, cols, kh, rate):
    """The keep mask of key half `kh` of a warpgroup tile. The key half's offset goes to the rows' first index, so
    the two lanes of a pair hash one expression (`keep_mask_lanes`)."""
    return keep_mask_lanes(seeds, first + jnp.uint32(kh * _HALF), cols, rate)


# ---------------------------------------------------------------------------------------------------- kernel


def _sync_warpgroups(sync):
    """This warpgroup's SMEM writes made visible to the other's wgmma (async proxy), then both warpgroups meet."""
    plgpu.commit_smem()
    plgpu.barrier_arrive(sync)
    plgpu.barrier_wait(sync)


def _begin_head(i, slot, mine, issue_loads, bars, n_loads, sync):
    """The persistent loop's turn for head i, whose inputs are loading into buffer `slot`: once head i - 1's stores
    have read their SMEM and both warpgroups are done with it, buffer 1 - slot takes head i + 1's loads (if this CTA
    has one of its `mine` heads left); then wait for head i's."""
    plgpu.wait_smem_to_gmem(0, wait_read_only=True)
    _sync_warpgroups(sync)

    @pl.when(i + 1 < mine)
    def _():
        issue_loads(i + 1, 1 - slot)

    for j in range(2 * n_loads):
        plgpu.barrier_wait(bars.at[slot * 2 * n_loads + j])


def _add_bias(tiles_and_biases, rows, dtype, interpret):
    """q + bq and v + bv in their SMEM tiles (this warpgroup's `rows`), each rounded to the inputs' dtype, as XLA's add
    (k's bias is left out: softmax is invariant to it)."""
    for tile, bias in tiles_and_biases:
        x = _load(tile.at[rows], plgpu.Layout.WGMMA, interpret).astype(jnp.float32)
        tile.at[rows][...] = (x + _per_col(bias, interpret).astype(jnp.float32)).astype(dtype)


def programs_for(heads_total: int, interpret: bool) -> int:
    """CTAs of the persistent grid: one per SM (each loops over heads pid, pid + G, ...), never more than the heads.
    Interpret mode takes 3, so that the CPU tests meet programs with unequal numbers of heads."""
    if interpret:
        return min(heads_total, 3)
    try:
        sms = int(jax.local_devices()[0].core_count)  # this process's GPUs (a multi-host mesh has others too)
    except Exception:  # no core count on this device: an H100/H200's
        sms = 132
    return max(1, min(heads_total, sms))


def backward(q, k, v, code, seed, o, lse, do, *, rate: float, interpret: bool, heads: int | None = None,
             packed: bool = False, bias=None, bias_grad: bool = False, programs: int | None = None,
             segments: bool = False):
    """As the Triton `backward.backward` (the one-kernel form): (dq, dk, dv), or with `packed` the packed dQKV (B, S, 3, N, H);
    with `bias_grad` also dbias (3, N, H) fp32. `seed` is the uint32[4] seed words or None (no dropout).
    `programs`: CTAs of the persistent grid (default `programs_for`). `segments`: `code` holds packed rows' segment
    codes (`tiles.mask_code(segments=True)`), read for the query rows too (`tiles.allowed`); the row's one key block
    is never skipped, so the cost is one compare per score.

    Every call goes through one `jax.jit` (`_mgpu.one_module`), so all call sites (the layers of a model) share one
    Mosaic GPU module and compile it once per program (bare calls compile one per call site: ~2.8 s per layer)."""
    return _backward_jit(q, k, v, code, seed, o, lse, do, bias, rate=float(rate), interpret=interpret, heads=heads,
                         packed=packed, bias_grad=bias_grad, programs=programs, segments=bool(segments))


def _call_setup(q, k, seed, bias, *, rate, interpret, heads, packed, programs):
    """What the forward and the backward both derive from their operands, checked: (b, s, n, h, heads, drop, n_heads,
    grid, extras), `extras` the operands after the mask code (the dropout words, the bias in q's dtype)."""
    b, s, n, h, t = shapes(q, k, packed)
    check_shape(s, t, h, q.dtype)
    heads = n if heads is None else heads
    drop = seed is not None and rate > 0.0
    n_heads = b * n
    grid = programs_for(n_heads, interpret) if programs is None else programs
    if not 1 <= grid <= n_heads:
        raise ValueError(f"programs={grid} must be in [1, B*N={n_heads}]")
    extras = [_dropout_words(seed, heads)] if drop else []
    if bias is not None:
        extras.append(bias.astype(q.dtype))
    return b, s, n, h, heads, drop, n_heads, grid, extras


def _backward(q, k, v, code, seed, o, lse, do, bias, *, rate, interpret, heads, packed, bias_grad, programs,
              segments):
    b, s, n, h, heads, drop, n_heads, grid, extras = _call_setup(q, k, seed, bias, rate=rate, interpret=interpret,
                                                                 heads=heads, packed=packed, programs=programs)
    dtype = q.dtype
    scale = h ** -0.5
    with_bias = bias is not None
    n_loads = 7 + with_bias  # per head and warpgroup: q, k, v, dO, O halves, lse, mask code (+ a bias vector)

    def body(*refs):
        refs = list(refs)
        (buf, pds, ones_s, lse_s, code_s, words_s, bias_s, sum_s), bars, words_bar, sync = refs.pop()
        in_refs = [refs.pop(0) for _ in range(1 if packed else 3)]  # the packed qkv, or q, k, v
        code_ref, o_ref, do_ref, lse_ref = refs[:4]
        refs = refs[4:]
        words_ref = refs.pop(0) if drop else None
        bias_ref = refs.pop(0) if with_bias else None
        out_refs = refs  # dqkv or (dq, dk, dv), then the bias-gradient sums
        sums_ref = out_refs.pop() if bias_grad else None

        pid, w = lax.axis_index("p"), lax.axis_index("wg")
        rows = pl.ds(w * _HALF, _HALF)
        mine = (n_heads - 1 - pid) // grid + 1  # heads pid, pid + grid, ... < B * N

        def head(i):  # (b, n) of this program's i-th head
            x = pid + i * grid
            return x // n, x % n

        def half(refs_, c, bi, ni):  # GMEM (64, H) rows of this warpgroup's half of q (c = 0), k (1), v (2), or grads
            return refs_[0].at[bi, rows, c, ni] if packed else refs_[c].at[bi, rows, ni]

        def issue_loads(i, slot):
            """This warpgroup's halves of head i's inputs into buffer `slot` (each on its own barrier)."""
            bi, ni = head(i)
            tiles = buf.at[slot]
            loads = [(half(in_refs, c, bi, ni), tiles.at[c, rows]) for c in range(3)]
            loads += [(do_ref.at[bi, rows, ni], tiles.at[3, rows]), (o_ref.at[bi, rows, ni], tiles.at[4, rows]),
                      (lse_ref.at[bi, ni, rows], lse_s.at[slot, rows]), (code_ref.at[bi, rows], code_s.at[slot, rows])]
            if with_bias:  # warpgroup 0 brings q's bias (C = 0), warpgroup 1 v's (C = 2)
                loads.append((bias_ref.at[2 * w, ni], bias_s.at[slot, w]))
            for j, (g, sm) in enumerate(loads):
                plgpu.copy_gmem_to_smem(g, sm, bars.at[(slot * n_loads + j) * 2 + w])

        issue_loads(0, 0)
        if drop:
            seeds, cols = _load_words(words_ref, words_s, words_bar, w, interpret)
        if bias_grad:
            ones_s[...] = _ones(dtype, interpret)  # made visible by the first head's syncs
        keys = [pl.ds(kh * _HALF, _HALF) for kh in (0, 1)]

        def step(i, carry):
            slot = i % 2
            bi, ni = head(i)
            q_s, k_s, v_s, do_s, o_s = (buf.at[slot, c] for c in range(5))
            _begin_head(i, slot, mine, issue_loads, bars, n_loads, sync)

            if with_bias:
                _add_bias(((q_s, bias_s.at[slot, 0]), (v_s, bias_s.at[slot, 1])), rows, dtype, interpret)
                _sync_warpgroups(sync)

            # ---- queries [64w, 64w + 64): S, dP, P, the mask, dS and dQ
            lse = _per_row(lse_s.at[slot, rows], interpret)
            dot_o = (_load(o_s.at[rows], plgpu.Layout.WGMMA, interpret).astype(jnp.float32)
                     * _load(do_s.at[rows], plgpu.Layout.WGMMA, interpret).astype(jnp.float32))
            delta = lax.broadcast_in_dim(jnp.sum(dot_o, axis=1), (_HALF, _HALF), [0])  # rowsum(dO * O) per query
            s0, s1, dp0, dp1 = _products(
                interpret,
                [(q_s.at[rows], _t(k_s.at[keys[0]]))], [(q_s.at[rows], _t(k_s.at[keys[1]]))],
                [(do_s.at[rows], _t(v_s.at[keys[0]]))], [(do_s.at[rows], _t(v_s.at[keys[1]]))])
            first = _first_index(words_s.at[w, 2], bi, ni, heads, interpret) if drop else None
            qcode = _per_row(code_s.at[slot, rows], interpret) if segments else None  # S = T: the same codes
            ds16 = []
            for kh, (sc, dp) in enumerate(((s0, dp0), (s1, dp1))):
                keep = _keep(seeds, first, cols, kh, rate) if drop else None
                pd, ds = _grad_tile(sc, dp, _per_col(code_s.at[slot, keys[kh]], interpret), lse, delta, scale, keep,
                                    rate, dtype, qcode)
                ds16.append(ds)
                pds.at[kh, rows][...] = pd  # P (dropped), (key half, query, key)

            (dq,) = _products(interpret, [(ds16[0], k_s.at[keys[0]]), (ds16[1], k_s.at[keys[1]])])
            o_s.at[rows][...] = (dq * scale).astype(dtype)  # staged in the consumed O rows
            _sync_warpgroups(sync)  # P of both query halves in SMEM; K, V, O read by both warpgroups for the last time
            plgpu.copy_smem_to_gmem(o_s.at[rows], half(out_refs, 0, bi, ni))

            # ---- keys [64w, 64w + 64): dV = P^T dO, then dS through the same buffer, dK = dS^T Q
            (dv,) = _products(interpret, [(_t(pds.at[w]), do_s)])
            v_s.at[rows][...] = dv.astype(dtype)  # staged in the consumed V rows
            _sync_warpgroups(sync)  # both warpgroups' dV products have read P
            for kh in (0, 1):
                pds.at[kh, rows][...] = ds16[kh]
            _sync_warpgroups(sync)
            (dk,) = _products(interpret, [(_t(pds.at[w]), q_s)])
            k_s.at[rows][...] = (dk * scale).astype(dtype)  # staged in the consumed K rows
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(k_s.at[rows], half(out_refs, 1, bi, ni))
            plgpu.copy_smem_to_gmem(v_s.at[rows], half(out_refs, 2, bi, ni))
            if bias_grad:  # column sums of the tiles as stored: (tile^T @ ones)[h, :] = sum over rows of column h
                sums = _products(interpret, *[[(_t(x.at[rows]), ones_s)] for x in (o_s, k_s, v_s)])
                for c, x in enumerate(sums):
                    sum_s.at[w, c][...] = jnp.max(x, axis=1)
                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(sum_s.at[w], sums_ref.at[bi, w, :, ni])
            return carry

        lax.fori_loop(0, mine, step, None)
        plgpu.wait_smem_to_gmem(0)

    out_types = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in ((q,) if packed else (q, k, v))]
    if bias_grad:
        out_types.append(jax.ShapeDtypeStruct((b, 2, 3, n, h), jnp.float32))

    def entry(*refs):
        scratch = (
            plgpu.SMEM((2, 5, _SEQ, h), dtype, transforms=_TILES),  # two heads' q, k, v, dO, O (outputs in O, K, V)
            plgpu.SMEM((2, _SEQ, _HALF), dtype, transforms=_TILES),  # P (dropped), then dS, by key half
            plgpu.SMEM((_HALF, _HALF), dtype, transforms=_TILES),  # ones, for the bias gradient's column sums
            plgpu.SMEM((2, _SEQ), jnp.float32), plgpu.SMEM((2, _SEQ), jnp.int32),  # lse, mask code (two heads)
            plgpu.SMEM((2, 3, _HALF), jnp.uint32),  # per warpgroup: seed words, each over 64 entries; row bases
            plgpu.SMEM((2, 2, h), dtype),  # two heads' q and v biases
            plgpu.SMEM((2, 3, h), jnp.float32),  # bias-gradient partial sums of each warpgroup
        )
        pl.run_scoped(lambda *scoped: body(*refs, scoped), scratch,
                      plgpu.Barrier(num_barriers=4 * n_loads), plgpu.Barrier(num_barriers=2),
                      plgpu.Barrier(num_arrivals=2), collective_axes="wg")

    inputs = ([q] if packed else [q, k, v]) + [code, o, do, lse] + extras
    out = plgpu.kernel(entry, out_type=tuple(out_types), grid=(grid,), grid_names=("p",), num_threads=2,
                       thread_name="wg", compiler_params=plgpu.CompilerParams(approx_math=True),
                       interpret=_mgpu.interpret_params(interpret))(*inputs)
    out = list(out)
    if bias_grad:
        sums = out.pop()
        dbias = jnp.sum(sums, axis=(0, 1))  # (B, 2, 3, N, H) -> (3, N, H)
    grads = out[0] if packed else tuple(out)
    return (grads, dbias) if bias_grad else grads


_backward_jit = _mgpu.one_module(_backward, ("rate", "interpret", "heads", "packed", "bias_grad", "programs",
                                            "segments"))


# ---------------------------------------------------------------------------------------------------- forward


def forward(q, k, v, code, seed, *, rate: float, interpret: bool, heads: int | None = None, packed: bool = False,
            bias=None, programs: int | None = None, segments: bool = False):
    """As the Triton `forward.forward` at S = T = 128, H = 64, bf16: (o (B, S, N, H), lse (B, N, S) fp32, base 2),
    persistent as `backward` (one CTA per SM looping over the heads, the next head's q, k, v loaded while this one
    computes), all call sites through one `jax.jit`. Only in the opt-in `mosaic` implementation: on an H200 it took
    31.0 against 34.1 us of device time (B64 N16, p = 0.1), but timed fwd+bwd chains did not resolve a gain and
    BERT-large's train step was unchanged (kernels-h200.md, Attention). `segments` as in `backward`."""
    return _forward_jit(q, k, v, code, seed, bias, rate=float(rate), interpret=interpret, heads=heads, packed=packed,
                        programs=programs, segments=bool(segments))


def _forward(q, k, v, code, seed, bias, *, rate, interpret, heads, packed, programs, segments):
    b, s, n, h, heads, drop, n_heads, grid, extras = _call_setup(q, k, seed, bias, rate=rate, interpret=interpret,
                                                                 heads=heads, packed=packed, programs=programs)
    dtype = q.dtype
    scale = h ** -0.5
    with_bias = bias is not None
    n_loads = 4 + with_bias  # per head and warpgroup: q, k, v halves, mask code (+ a bias vector)

    def body(*refs):
        refs = list(refs)
        (buf, code_s, words_s, bias_s, lse_s), bars, words_bar, sync = refs.pop()
        in_refs = [refs.pop(0) for _ in range(1 if packed else 3)]
        code_ref = refs.pop(0)
        words_ref = refs.pop(0) if drop else None
        bias_ref = refs.pop(0) if with_bias else None
        o_ref, lse_ref = refs

        pid, w = lax.axis_index("p"), lax.axis_index("wg")
        rows = pl.ds(w * _HALF, _HALF)
        mine = (n_heads - 1 - pid) // grid + 1

        def head(i):
            x = pid + i * grid
            return x // n, x % n

        def half(c, bi, ni):  # GMEM (64, H) rows of this warpgroup's half of q (c = 0), k (1) or v (2)
            return in_refs[0].at[bi, rows, c, ni] if packed else in_refs[c].at[bi, rows, ni]

        def issue_loads(i, slot):
            bi, ni = head(i)
            loads = [(half(c, bi, ni), buf.at[slot, c, rows]) for c in range(3)]
            loads.append((code_ref.at[bi, rows], code_s.at[slot, rows]))
            if with_bias:  # warpgroup 0 brings q's bias (C = 0), warpgroup 1 v's (C = 2)
                loads.append((bias_ref.at[2 * w, ni], bias_s.at[slot, w]))
            for j, (g, sm) in enumerate(loads):
                plgpu.copy_gmem_to_smem(g, sm, bars.at[(slot * n_loads + j) * 2 + w])

        issue_loads(0, 0)
        if drop:
            seeds, cols = _load_words(words_ref, words_s, words_bar, w, interpret)
        keys = [pl.ds(kh * _HALF, _HALF) for kh in (0, 1)]

        def step(i, carry):
            slot = i % 2
            bi, ni = head(i)
            q_s, k_s, v_s = (buf.at[slot, c] for c in range(3))
            _begin_head(i, slot, mine, issue_loads, bars, n_loads, sync)
            if with_bias:
                _add_bias(((q_s, bias_s.at[slot, 0]), (v_s, bias_s.at[slot, 1])), rows, dtype, interpret)
                _sync_warpgroups(sync)

            s0, s1 = _products(interpret, [(q_s.at[rows], _t(k_s.at[keys[0]]))],
                               [(q_s.at[rows], _t(k_s.at[keys[1]]))])
            qcode = _per_row(code_s.at[slot, rows], interpret) if segments else None  # S = T: the same codes
            xs = []
            for kh, sc in enumerate((s0, s1)):  # masked base-2 scores, as tiles.scores
                code = _per_col(code_s.at[slot, keys[kh]], interpret)
                xs.append(_masked_scores(sc, allowed(code, qcode), scale))
            m = jnp.maximum(jnp.max(xs[0], axis=1), jnp.max(xs[1], axis=1))
            ps = [jnp.exp2(x - lax.broadcast_in_dim(m, (_HALF, _HALF), [0])) for x in xs]
            l = jnp.sum(ps[0], axis=1) + jnp.sum(ps[1], axis=1)  # the normaliser sums before dropout  # noqa: E741
            if drop:
                first = _first_index(words_s.at[w, 2], bi, ni, heads, interpret)
                ps = [jnp.where(_keep(seeds, first, cols, kh, rate), p, 0.0) for kh, p in enumerate(ps)]
            (acc,) = _products(interpret, [(ps[0].astype(dtype), v_s.at[keys[0]]),
                                           (ps[1].astype(dtype), v_s.at[keys[1]])])
            inv = (1.0 / (1.0 - rate) if drop else 1.0) / l
            q_s.at[rows][...] = (acc * lax.broadcast_in_dim(inv, (_HALF, _HALF), [0])).astype(dtype)  # staged
            lse_s.at[rows][...] = m + jnp.log2(l)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(q_s.at[rows], o_ref.at[bi, rows, ni])
            plgpu.copy_smem_to_gmem(lse_s.at[rows], lse_ref.at[bi, ni, rows])
            return carry

        lax.fori_loop(0, mine, step, None)
        plgpu.wait_smem_to_gmem(0)

    def entry(*refs):
        scratch = (
            plgpu.SMEM((2, 3, _SEQ, h), dtype, transforms=_TILES),  # two heads' q, k, v (o staged in q's rows)
            plgpu.SMEM((2, _SEQ), jnp.int32),  # two heads' mask codes
            plgpu.SMEM((2, 3, _HALF), jnp.uint32),  # per warpgroup: seed words and row bases
            plgpu.SMEM((2, 2, h), dtype),  # two heads' q and v biases
            plgpu.SMEM((_SEQ,), jnp.float32),  # lse, staged
        )
        pl.run_scoped(lambda *scoped: body(*refs, scoped), scratch,
                      plgpu.Barrier(num_barriers=4 * n_loads), plgpu.Barrier(num_barriers=2),
                      plgpu.Barrier(num_arrivals=2), collective_axes="wg")

    out_type = (jax.ShapeDtypeStruct((b, s, n, h), dtype), jax.ShapeDtypeStruct((b, n, s), jnp.float32))
    inputs = ([q] if packed else [q, k, v]) + [code] + extras
    return plgpu.kernel(entry, out_type=out_type, grid=(grid,), grid_names=("p",), num_threads=2, thread_name="wg",
                        compiler_params=plgpu.CompilerParams(approx_math=True),
                        interpret=_mgpu.interpret_params(interpret))(*inputs)


_forward_jit = _mgpu.one_module(_forward, ("rate", "interpret", "heads", "packed", "programs", "segments"))
