"""Mosaic GPU (Hopper+) one-kernel flash-attention backward for S = T = 128 and head width 64: the same contract as
`kernel.backward` with the key mask, dropout, packed q/k/v, the folded Q/K/V bias and its gradient.

Why: at S = 128 the Triton one-kernel backward (`kernel._bwd_fused_kernel`) multiplies 32 x 128 x 64 tiles with
synchronous mma instructions at ~100 TFLOP/s and is latency-bound (~95 us at B64 N16: kernels-h200.md, session 7);
here the products are Hopper's asynchronous wgmma on 64-row warpgroup tiles read from SMEM, and the whole (b, n) head
moves through SMEM by TMA once (session 18's prototype: 52.6 us at p = 0).

One CTA per (b, n), two warpgroups. Warpgroup w owns queries [64w, 64w + 64) first: scores S = Q_w K^T and
dP = dO_w V^T (as two 64 x 64 key halves), P = exp2(S * scale * log2 e - lse), the dropout mask, dS = P * (dP - delta),
and dQ_w = dS K, complete in registers and stored at once. It writes P (dropped) and dS in bf16 to SMEM, laid out as
(key half, query, key) tiles; after a barrier between the warpgroups, warpgroup w owns keys [64w, 64w + 64) and forms
dV_w = P^T dO and dK_w = dS^T Q from SMEM (wgmma's transposed left operand). delta = rowsum(dO * O) is formed from
the warpgroup's O and dO tiles.

Numerics and conventions follow `kernel.py`: base-2 scores, padded keys at finfo.min (exactly zero probability), a
constant score 0 for every key of an all-padded example, the mask drawn from the same hash and index
((b*N + n)*S + s)*T + t as `pallas_kernels.dropout.keep_mask` (bit for bit), P cast to the inputs' dtype for the
products. The Q and V biases (`bias`) are added to the q and v tiles in SMEM and rounded there, as XLA rounds its
add (k's bias cannot change the softmax: its gradient is the column sum of dK, near zero). With `bias_grad`, each
warpgroup sums the columns of the dQ, dK and dV tiles it stores, exactly (a wgmma with a ones tile), and XLA adds
the (B, 2, 3, N, H) partial sums.

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

__all__ = ["backward", "check_shape", "shape_ok", "supported"]

_LOG2E = math.log2(math.e)
_PADDED = float(jnp.finfo(jnp.float32).min)  # as kernel.py
_HALF = 64  # rows of a warpgroup's wgmma tile; S = T = 2 * _HALF
_SEQ, _WIDTH = 2 * _HALF, 64

supported = _mgpu.supported


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


# ---------------------------------------------------------------------------------------------------- kernel


def backward(q, k, v, code, seed, o, lse, do, *, rate: float, interpret: bool, heads: int | None = None,
             packed: bool = False, bias=None, bias_grad: bool = False):
    """As `kernel.backward` (the one-kernel form): (dq, dk, dv), or with `packed` the packed dQKV (B, S, 3, N, H);
    with `bias_grad` also dbias (3, N, H) fp32. `seed` is the uint32[4] seed words or None (no dropout)."""
    if packed:
        b, s, _, n, h = q.shape
        t = s
    else:
        b, s, n, h = q.shape
        t = k.shape[1]
    check_shape(s, t, h, q.dtype)
    heads = n if heads is None else heads
    dtype = q.dtype
    scale = h ** -0.5
    drop = seed is not None and rate > 0.0
    with_bias = bias is not None
    extras = []
    if drop:
        u32 = jnp.uint32
        head_row = ((jnp.arange(b, dtype=u32)[:, None] + seed[2]) * u32(heads) + jnp.arange(n, dtype=u32)[None, :]
                    + seed[3]) * u32(s)  # (B, N): the (b, n) head's first row of the BNST index, as kernel.py
        first = (head_row[:, :, None] + jnp.arange(s, dtype=u32)[None, None, :]) * u32(t)  # (B, N, S), wrapping
        extras += [first, jnp.broadcast_to(seed[:2, None], (2, _HALF))]
    if with_bias:
        extras.append(bias.astype(dtype))
    tr = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))

    def body(*refs):
        refs = list(refs)
        (qkv_scratch, p_s, ds_s, out_s, ones_s, lse_s, code_s, first_s, seed_s, bias_s, sum_s), bars, sync \
            = refs.pop()
        in_refs = [refs.pop(0) for _ in range(1 if packed else 3)]  # the packed qkv, or q, k, v
        code_ref, o_ref, do_ref, lse_ref = refs[:4]
        refs = refs[4:]
        first_ref, seed_ref = (refs.pop(0), refs.pop(0)) if drop else (None, None)
        bias_ref = refs.pop(0) if with_bias else None
        out_refs = refs  # dqkv or (dq, dk, dv), then the bias-gradient sums
        sums_ref = out_refs.pop() if bias_grad else None

        bi, ni, w = lax.axis_index("b"), lax.axis_index("n"), lax.axis_index("wg")
        rows = pl.ds(w * _HALF, _HALF)
        q_s, k_s, v_s, do_s, o_s = (qkv_scratch.at[i] for i in range(5))

        def half(refs_, c):  # GMEM (64, H) rows of this warpgroup's half of q (c = 0), k (1), v (2) or their gradients
            return refs_[0].at[bi, rows, c, ni] if packed else refs_[c].at[bi, rows, ni]

        # Each warpgroup loads its half of every per-head input; both wait for both halves.
        loads = [(half(in_refs, 0), q_s.at[rows]), (half(in_refs, 1), k_s.at[rows]), (half(in_refs, 2), v_s.at[rows]),
                 (do_ref.at[bi, rows, ni], do_s.at[rows]), (o_ref.at[bi, rows, ni], o_s.at[rows]),
                 (lse_ref.at[bi, ni, rows], lse_s.at[rows]), (code_ref.at[bi, rows], code_s.at[rows])]
        if drop:
            loads += [(first_ref.at[bi, ni, rows], first_s.at[rows]), (seed_ref.at[w], seed_s.at[w])]
        if with_bias:  # warpgroup 0 brings q's bias (C = 0), warpgroup 1 v's (C = 2)
            loads.append((bias_ref.at[2 * w, ni], bias_s.at[w]))
        for i, (g, sm) in enumerate(loads):
            plgpu.copy_gmem_to_smem(g, sm, bars.at[2 * i + w])
        for i in range(2 * len(loads)):
            plgpu.barrier_wait(bars.at[i])

        def sync_warpgroups():
            plgpu.commit_smem()  # this warpgroup's SMEM writes, visible to the other's wgmma (async proxy)
            plgpu.barrier_arrive(sync)
            plgpu.barrier_wait(sync)

        if with_bias:  # q + bq and v + bv in place, each rounded to the inputs' dtype, as XLA's add
            for tile, c in ((q_s, 0), (v_s, 1)):
                x = _load(tile.at[rows], plgpu.Layout.WGMMA, interpret).astype(jnp.float32)
                tile.at[rows][...] = (x + _per_col(bias_s.at[c], interpret).astype(jnp.float32)).astype(dtype)
        if bias_grad:
            ones_s[...] = _ones(dtype, interpret)
        if with_bias or bias_grad:
            sync_warpgroups()

        lse = _per_row(lse_s.at[rows], interpret)
        dot_o = (_load(o_s.at[rows], plgpu.Layout.WGMMA, interpret).astype(jnp.float32)
                 * _load(do_s.at[rows], plgpu.Layout.WGMMA, interpret).astype(jnp.float32))
        delta = lax.broadcast_in_dim(jnp.sum(dot_o, axis=1), (_HALF, _HALF), [0])  # rowsum(dO * O) per query
        keys = [pl.ds(kh * _HALF, _HALF) for kh in (0, 1)]
        # scores and dP of this warpgroup's queries, one 64 x 64 tile per key half
        s0, s1, dp0, dp1 = _products(
            interpret,
            [(q_s.at[rows], _t(k_s.at[keys[0]]))], [(q_s.at[rows], _t(k_s.at[keys[1]]))],
            [(do_s.at[rows], _t(v_s.at[keys[0]]))], [(do_s.at[rows], _t(v_s.at[keys[1]]))])
        if drop:
            first = _per_row(first_s.at[rows], interpret)
            seeds = (_per_row(seed_s.at[0], interpret), _per_row(seed_s.at[1], interpret))
            cols = _iota_cols(interpret)
        ds16 = []
        for kh, (sc, dp) in enumerate(((s0, dp0), (s1, dp1))):
            code = _per_col(code_s.at[keys[kh]], interpret)
            real = code > 0
            p = jnp.exp2(jnp.where(real, sc * (scale * _LOG2E), jnp.where(code == 0, _PADDED, 0.0)) - lse)
            pd = p
            if drop:
                keep = keep_mask_lanes(seeds, first, cols + jnp.uint32(kh * _HALF), rate)
                inv_keep = 1.0 / (1.0 - rate)
                pd = jnp.where(keep, p * inv_keep, 0.0)
                dp = jnp.where(keep, dp * inv_keep, 0.0)
            ds = jnp.where(real, p * (dp - delta), 0.0).astype(dtype)
            p_s.at[kh, rows][...] = pd.astype(dtype)
            ds_s.at[kh, rows][...] = ds
            ds16.append(ds)

        (dq,) = _products(interpret, [(ds16[0], k_s.at[keys[0]]), (ds16[1], k_s.at[keys[1]])])
        out_s.at[0, rows][...] = (dq * scale).astype(dtype)
        sync_warpgroups()  # P and dS of both query halves are in SMEM (and this dQ tile)
        plgpu.copy_smem_to_gmem(out_s.at[0, rows], half(out_refs, 0))

        # keys [64w, 64w + 64): dV = P^T dO and dK = dS^T Q over all 128 queries
        dv, dk = _products(interpret, [(_t(p_s.at[w]), do_s)],
                           [(_t(ds_s.at[w]), q_s)])
        out_s.at[1, rows][...] = (dk * scale).astype(dtype)
        out_s.at[2, rows][...] = dv.astype(dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(out_s.at[1, rows], half(out_refs, 1))
        plgpu.copy_smem_to_gmem(out_s.at[2, rows], half(out_refs, 2))
        if bias_grad:  # column sums of the tiles as stored: (tile^T @ ones)[h, :] = sum over rows of column h
            sums = _products(interpret, *[[(_t(out_s.at[c, rows]), ones_s)] for c in range(3)])
            for c, x in enumerate(sums):
                sum_s.at[w, c][...] = jnp.max(x, axis=1)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(sum_s.at[w], sums_ref.at[bi, w, :, ni])
        plgpu.wait_smem_to_gmem(0)

    out_types = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in ((q,) if packed else (q, k, v))]
    if bias_grad:
        out_types.append(jax.ShapeDtypeStruct((b, 2, 3, n, h), jnp.float32))
    n_loads = 7 + 2 * drop + with_bias

    def entry(*refs):
        tile = (_SEQ, h)
        scratch = (
            plgpu.SMEM((5, *tile), dtype, transforms=tr),  # q, k, v, dO, O
            plgpu.SMEM((2, _SEQ, _HALF), dtype, transforms=tr),  # P (dropped) by key half
            plgpu.SMEM((2, _SEQ, _HALF), dtype, transforms=tr),  # dS by key half
            plgpu.SMEM((3, *tile), dtype, transforms=tr),  # dQ, dK, dV as stored
            plgpu.SMEM((_HALF, _HALF), dtype, transforms=tr),  # ones, for the bias gradient's column sums
            plgpu.SMEM((_SEQ,), jnp.float32),  # lse
            plgpu.SMEM((_SEQ,), jnp.int32), plgpu.SMEM((_SEQ,), jnp.uint32),  # mask code, dropout first index
            plgpu.SMEM((2, _HALF), jnp.uint32),  # the two seed words, each broadcast over 64 entries
            plgpu.SMEM((2, h), dtype),  # q's and v's bias
            plgpu.SMEM((2, 3, h), jnp.float32),  # bias-gradient partial sums of each warpgroup
        )
        pl.run_scoped(lambda *scoped: body(*refs, scoped), scratch,
                      plgpu.Barrier(num_barriers=2 * n_loads), plgpu.Barrier(num_arrivals=2),
                      collective_axes="wg")

    inputs = ([q] if packed else [q, k, v]) + [code, o, do, lse] + extras
    out = plgpu.kernel(entry, out_type=tuple(out_types), grid=(b, n), grid_names=("b", "n"), num_threads=2,
                       thread_name="wg", compiler_params=plgpu.CompilerParams(approx_math=True),
                       interpret=_mgpu.interpret_params(interpret))(*inputs)
    out = list(out)
    if bias_grad:
        sums = out.pop()
        dbias = jnp.sum(sums, axis=(0, 1))  # (B, 2, 3, N, H) -> (3, N, H)
    grads = out[0] if packed else tuple(out)
    return (grads, dbias) if bias_grad else grads
