"""Flash attention (FlashAttention-2, Dao 2023) with a key padding mask and counter-based dropout, as Pallas kernels
lowered through Triton.

Layout BSNH end to end: q, do, dq blocks are (block_q, H) slices of (B, S, N, H) arrays and k, v, dk, dv blocks are
(block_k, H) slices of (B, T, N, H), with B and N squeezed by the BlockSpecs, so the wrapper never transposes.

Numerics: scores and softmax in fp32 in base 2 (s2 = q.k * H**-0.5 * log2(e), so exp2 replaces exp); the only
residual besides the inputs and the output is the fp32 base-2 logsumexp `lse` (B, N, S) of each query row. The
probabilities are cast to v's dtype for the P@V product, as flash attention usually does.

Key mask: the wrapper turns the (B, T) mask into an int32 code per key (`mask_code`): 1 real, 0 padded, -1 a key of
an example with no real key at all. Padded keys get the reference's score finfo.min, so their probability is exactly
0. The reference gives an all-padded example the uniform distribution (softmax of T equal scores); a constant score
0 does the same while keeping its logsumexp finite (log2 T) for the backward, where finfo.min + log2 T would round
back to finfo.min and make every recomputed probability 1 instead of 1/T.

Backward: either a dQ kernel (one program per query block, looping over key blocks; it also forms delta =
rowsum(dO * O) of its rows) and then a dK/dV kernel (one per key block, looping over query blocks); or, with
`BlockSizes.store_ds` (the default for the key-major pair, T > 128), the dK/dV kernel first (delta from XLA), storing
dS, then a dQ = dS K kernel; or, where a program can hold all T keys (`BlockSizes.fused_bwd`, the default at
T <= 128), one kernel per (b, n) that forms each query block's probabilities once for dV, dK and dQ together.
At S = T = 128, H = 64 with bfloat16 inputs on Hopper-or-newer GPUs that one kernel is `kernel_mgpu.py`'s (Mosaic GPU:
wgmma, TMA, one persistent CTA per SM looping over the heads; `BlockSizes.mgpu_bwd`), the same contract.
With `key_major` the tiles are (keys, queries), so dK and dV accumulate with the key block as the product's rows.

Dropout: probability element (b, n, s, t) is kept iff `pallas_kernels.dropout.keep_mask` keeps index
((b*N + n)*S + s)*T + t of the reference's BNST tensor (one hash per two neighbouring keys, `keep_mask_tile`), so the
masks agree bit for bit. The backward regenerates the mask from the seed; it is never stored.
"""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from .._pallas import compiler_params, fit_pow2
from ..dropout import keep_mask_tile
from . import kernel_mgpu

_LOG2E = math.log2(math.e)
_PADDED = float(jnp.finfo(jnp.float32).min)  # the score of a padded key, as in the reference softmax


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Tile sizes (powers of two >= 16; S and T must be multiples of them) and Triton launch parameters."""

    block_q: int = 128  # forward: query rows per program
    block_k: int = 64  # forward: keys per inner-loop step
    block_q_dkv: int = 32  # dK/dV kernel: query rows per inner-loop step
    block_k_dkv: int = 64  # dK/dV kernel: keys per program
    block_q_dq: int = 64  # dQ kernel: query rows per program
    block_k_dq: int = 32  # dQ kernel: keys per inner-loop step
    num_warps: int = 4
    num_stages: int = 3  # 3 measured faster than 2 for all three kernels at S=128 and 512 (kernels-h200.md)
    num_warps_bwd: int = 4  # the dK/dV kernel (and the dQ kernel unless set below)
    num_stages_bwd: int = 3
    num_warps_dq: int | None = None  # None: num_warps_bwd
    num_stages_dq: int | None = None  # None: num_stages_bwd
    # One backward kernel per (b, n) holding all T keys (dQ, dK, dV in one pass; T a power of two) instead of the
    # dK/dV + dQ pair; it steps over query rows by block_q_dkv with num_warps_fused / num_stages_bwd.
    fused_bwd: bool = False
    num_warps_fused: int = 8
    # Backward tiles key-major, (keys, queries) instead of (queries, keys), in the dK/dV and one-kernel backward: the
    # dK and dV products then have the key block, not the query block, as their rows (M of the matrix unit).
    key_major: bool = False
    # `flash_attention_qkv(bias=)`: add the Q/K/V bias inside the kernels (True) or by XLA before them (False).
    # Measured per backward form on an H200 (kernels-h200.md, session 8): the train step +2.3% with the one-kernel
    # backward (S=128), -1% with the dK/dV + dQ pair (S=512), so the default follows `fused_bwd`.
    fold_bias: bool = False
    # The dK/dV + dQ pair only (ignored with `fused_bwd`): the dK/dV kernel runs first and also stores dS (in q's
    # dtype, as the dQ product reads it; (B, N, T, S) with key-major tiles, else (B, N, S, T)), and the dQ kernel
    # multiplies it by K instead of recomputing the scores, probabilities, dropout mask and dP (delta then comes
    # from an XLA pass before the pair). Trades the dQ kernel's recompute for one write and one read of dS.
    store_ds: bool = False
    # The one-kernel backward in Mosaic GPU (`kernel_mgpu.py`: wgmma, TMA) instead of Triton's (needs `fused_bwd`;
    # Hopper or newer, S = T = 128, H = 64, bfloat16). The default where it runs (session 18, kernels-h200.md).
    mgpu_bwd: bool = False
    # The forward in Mosaic GPU (`kernel_mgpu.forward`; Hopper or newer, S = T = 128, H = 64, bfloat16). Off by
    # default: on an H200 it saved ~3 us of a 34 us forward in device time, but neither timed chains nor the train
    # step showed a gain (session 20, kernels-h200.md).
    mgpu_fwd: bool = False


def default_block_sizes(s: int, h: int, t: int | None = None, dtype=None) -> BlockSizes:
    """Defaults for query length S, head width H and key length T (= S unless given), for inputs of `dtype`.

    H <= 64 (BERT): 128x64 forward tiles with 4 warps, as Triton's fused-attention tutorial uses; the backward
    tiles are smaller because each step holds four fp32 (block_q, block_k) tiles (s/p, dp, ds, the hash) at once,
    key-major. T <= 128 (a power of two): the one-kernel backward (`fused_bwd`, 32 query rows per step, 8 warps),
    else the dK/dV (64x64 tiles) + dQ pair. Measured per kernel on an H200 (kernels-h200.md, session 7): at B64
    S128 p=0.1 the backward fell from 110.5 us (+15 us of XLA for delta) to 101.3; at B16 S512 from 320.6 to 267.0.
    The key-major pair stores dS for a dQ = dS K kernel with 128x64 tiles (`store_ds`; session 12, B16 S512 p=0.1:
    dK/dV 153.6 -> 167.7 us, dQ 116.6 -> 50.1, plus a 5.1 us XLA delta: -48.7 us per call; row-major tiles store
    it slower). Wider heads (not tuned): row-major pair, the key tile halved and the warps doubled to keep the fp32
    accumulators in registers. On Hopper-or-newer GPUs, at S = T = 128, H = 64 and bfloat16 `dtype`, the one-kernel
    backward is the Mosaic GPU one (`mgpu_bwd`; session 18, B64 N16 S128: backward 94.3 -> 58.1 us at p = 0, 103.7 ->
    70.5 at p = 0.1; session 19's persistent form: 70.1 -> 59.2 at p = 0.1).
    """
    t = s if t is None else t
    wide = h > 64
    fused = t <= 128 and _is_pow2(t) and not wide
    store_ds = not fused and not wide
    return BlockSizes(
        block_q=fit_pow2(128, s), block_k=fit_pow2(32 if wide else 64, t),
        block_q_dkv=fit_pow2(32 if fused or wide else 64, s), block_k_dkv=fit_pow2(64, t),
        block_q_dq=fit_pow2(128 if store_ds else 64, s), block_k_dq=fit_pow2(64 if store_ds else 32, t),
        num_warps=8 if wide else 4, num_warps_bwd=8 if wide else 4,
        fused_bwd=fused, key_major=not wide, fold_bias=fused, store_ds=store_ds,
        mgpu_bwd=fused and dtype is not None and kernel_mgpu.shape_ok(s, t, h, dtype) and kernel_mgpu.supported(),
    )


def candidate_block_sizes(around: BlockSizes, s: int, h: int, t: int | None = None, *, stage: str):
    """Block sizes to try around `around` (for the autotuner and `benchmarks/kernels.py --tune`): stage "fwd" the
    forward tiles, "bwd" the backward's form (pair or one kernel, row- or key-major) and tiles; session 7's search
    space. Every candidate fits S and T (`fit_pow2`)."""
    t = s if t is None else t
    if stage == "fwd":
        return [dataclasses.replace(around, block_q=fit_pow2(bq, s), block_k=fit_pow2(bk, t), num_warps=w, num_stages=st)
                for bq, bk, w, st in ((128, 64, 4, 3), (64, 64, 4, 3), (128, 32, 4, 3), (128, 64, 8, 3),
                                      (128, 64, 4, 2))]
    if stage != "bwd":
        raise ValueError(f"{stage=} must be 'fwd' or 'bwd'")
    # dS stored only with key-major tiles (row-major measured slower: session 12); one candidate toggles it.
    # Triton candidates only (`mgpu_bwd` off); a Mosaic GPU default stays in the race as `around`.
    pairs = [dataclasses.replace(around, fused_bwd=False, mgpu_bwd=False, key_major=km, block_q_dkv=fit_pow2(bq, s),
                                 block_k_dkv=fit_pow2(bk, t), num_warps_bwd=w, store_ds=km and around.store_ds)
             for km in (False, True) for bq, bk, w in ((32, 64, 4), (64, 64, 4), (32, 32, 4), (64, 128, 8))]
    pairs.append(dataclasses.replace(around, fused_bwd=False, mgpu_bwd=False, store_ds=not around.store_ds))
    fused = [dataclasses.replace(around, fused_bwd=True, mgpu_bwd=False, key_major=km, block_q_dkv=fit_pow2(bq, s),
                                 num_warps_fused=w)
             for km in (False, True) for bq, w in ((16, 4), (32, 8), (64, 8))] if t <= 128 and _is_pow2(t) else []
    return pairs + fused


def _is_pow2(x: int) -> bool:
    return x >= 1 and x & (x - 1) == 0


def check_inputs(q, k, v, mask, blocks: BlockSizes) -> None:
    """Raise ValueError, naming the value, for shapes the kernels cannot take (before anything compiles)."""
    if q.ndim != 4 or k.ndim != 4:
        raise ValueError(f"q and k must be (B, S, N, H) and (B, T, N, H); got {q.shape=} {k.shape=}")
    b, s, n, h = q.shape
    t = k.shape[1]
    if k.shape != (b, t, n, h) or v.shape != k.shape:
        raise ValueError(f"k and v must be (B, T, N, H) matching {q.shape=}; got {k.shape=} {v.shape=}")
    if mask.shape != (b, t):
        raise ValueError(f"mask must be (B, T) = {(b, t)}; got {mask.shape=}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype; got {q.dtype=} {k.dtype=} {v.dtype=}")
    if not _is_pow2(h) or h < 16:
        raise ValueError(f"head width {h=} must be a power of two >= 16 (Triton tiles)")
    for name, block in dataclasses.asdict(blocks).items():
        if name.startswith("block_") and (not _is_pow2(block) or block < 16):
            raise ValueError(f"{name}={block} must be a power of two >= 16")
    if blocks.fused_bwd and not _is_pow2(t):
        raise ValueError(f"fused_bwd holds all T={t} keys in one tile: T must be a power of two")
    if blocks.mgpu_bwd and not blocks.fused_bwd:
        raise ValueError("mgpu_bwd=True is a one-kernel backward: it needs fused_bwd=True")
    if blocks.mgpu_bwd or blocks.mgpu_fwd:
        kernel_mgpu.check_shape(s, t, h, q.dtype)
    for name, length in (("block_q", s), ("block_q_dkv", s), ("block_q_dq", s),
                         ("block_k", t), ("block_k_dkv", t), ("block_k_dq", t)):
        block = getattr(blocks, name)
        if length % block:
            dim = "S" if name.startswith("block_q") else "T"
            raise ValueError(f"{dim}={length} must be a multiple of {name}={block}")


def mask_code(mask):
    """int32 (B, T): 1 at real keys, 0 at padded keys, -1 at every key of an example without real keys."""
    real = mask.astype(bool)
    return jnp.where(real, 1, jnp.where(jnp.any(real, axis=1, keepdims=True), 0, -1)).astype(jnp.int32)


# ---------------------------------------------------------------------------------------------- shared tile math


# The Q/K/V projection's bias (AIB), folded into the kernels instead of a pass over the projection's output. Adding
# it to a tile loaded inside a loop, between the load and its `dot`, slowed every kernel (session 6, reverted), so
# only tiles loaded once per program get it added (`_biased`); the rest follows from exact identities:
# - k's bias adds q.bk to every score of a query row: softmax is invariant to that, so it is left out everywhere
#   (its gradient, a sum of dK, is zero up to rounding: the rows of dS sum to zero);
# - v's bias adds rowsum(P * D) bv to the output (the forward accumulates that row sum, `ld`), and dO.bv to every
#   dP of a query row (`_grad_tile(cq=)`);
# - q's bias adds bq.k_t to every score of key t (`_grad_tile(kb=)`), and colsum(dS) bq to dK.


def _biased(x, bias_ref):
    """A tile loaded once per program plus its head's bias (H,): added in fp32 and rounded to the tile's dtype, as
    XLA's bf16 add of the bias to the projection rounds it."""
    if bias_ref is None:
        return x
    return (x.astype(jnp.float32) + bias_ref[...].astype(jnp.float32)[None, :]).astype(x.dtype)


def _bias_dot(x, bias_ref):
    """x (rows, H) . bias (H,) in fp32, per row; None without a bias."""
    if bias_ref is None:
        return None
    return jnp.sum(x.astype(jnp.float32) * bias_ref[...].astype(jnp.float32)[None, :], axis=1)


def _scores(q, k, code, qk_scale):
    """Masked base-2 scores (block_q, block_k) in fp32."""
    s = pltriton.dot(q, k, trans_b=True) * qk_scale
    fill = jnp.where(code == 0, _PADDED, 0.0)[None, :]
    return jnp.where(code[None, :] > 0, s, fill)


def _dropout_base(seed_ref, *, heads, s_len):
    """(seed0, seed1, (b*N + n)*S in uint32) for the program's (b, n) = grid axes 1, 2; None without dropout.

    seed_ref holds uint32 [seed0, seed1, batch_offset, head_offset]: b counts from the shard's first example and n
    from its first head, with `heads` the total (unsharded) head count, so a batch or head (tensor-parallel) shard
    draws the same mask as the unsharded reference. Called at the kernel's top level: the seed is loaded
    once, and interpret mode substitutes program_id only there, not inside loop bodies.
    """
    if seed_ref is None:
        return None
    u32 = jnp.uint32
    b = pl.program_id(1).astype(u32) + seed_ref[2]
    head_row = (b * u32(heads) + pl.program_id(2).astype(u32) + seed_ref[3]) * u32(s_len)
    return seed_ref[0], seed_ref[1], head_row


def _keep(drop, q_start, k_start, block_q, block_k, *, t_len, rate, key_major=False):
    """Keep mask (block_q, block_k) of the tile at rows q_start.., keys k_start.. ((block_k, block_q) if key_major);
    None when dropout is off.

    Index ((b*N + n)*S + s)*T + t in uint32 (wrapping as the reference's uint32 arange would). Drawn row-major (one
    hash per two neighbouring keys) and transposed for key-major tiles: measured faster than one hash per score in
    the key-major orientation (session 8, keep_cost.py).
    """
    if drop is None:
        return None
    seed0, seed1, head_row = drop
    rows = head_row + (q_start + jnp.arange(block_q, dtype=jnp.int32)).astype(jnp.uint32)
    keep = keep_mask_tile(seed0, seed1, rows, k_start, block_k, t_len, rate)
    return keep.T if key_major else keep


def _grad_tile(q, k, v, do, code, lse, delta, keep, *, qk_scale, rate, key_major=False, kb=None, cq=None):
    """(dropped probabilities for dV, dS w.r.t. the natural-log scores) of one tile; FlashAttention-2 Alg. 2.

    With D = keep / (1 - rate): O = (P*D) V, so dP = D * (dO V^T) and dS = P * (dP - rowsum(P * dP)), where
    rowsum(P * dP) = rowsum(dO * O) = delta still holds with dropout. Tiles are (block_q, block_k), or with
    `key_major` their transposes (Pd^T, dS^T) from k @ q^T and v @ dO^T (`keep` from `_keep(..., key_major=True)`).
    `kb` (per key) is added to the raw scores and `cq` (per query) to dO V^T: the q and v biases (see above).
    """
    if key_major:  # per-key values run down the rows, per-query values along them
        s, dp = pltriton.dot(k, q, trans_b=True), pltriton.dot(v, do, trans_b=True)
        code, lse, delta = code[:, None], lse[None, :], delta[None, :]
        kb, cq = (None if kb is None else kb[:, None]), (None if cq is None else cq[None, :])
    else:
        s, dp = pltriton.dot(q, k, trans_b=True), pltriton.dot(do, v, trans_b=True)
        code, lse, delta = code[None, :], lse[:, None], delta[:, None]
        kb, cq = (None if kb is None else kb[None, :]), (None if cq is None else cq[:, None])
    if kb is not None:
        s = s + kb
    if cq is not None:
        dp = dp + cq
    real = code > 0
    p = jnp.exp2(jnp.where(real, s * qk_scale, jnp.where(code == 0, _PADDED, 0.0)) - lse)  # as `_scores`
    pd = p
    if keep is not None:
        inv_keep = 1.0 / (1.0 - rate)
        pd = jnp.where(keep, p * inv_keep, 0.0)
        dp = jnp.where(keep, dp * inv_keep, 0.0)
    # The reference's `where` passes no gradient to padded keys; only all-padded examples (code -1) have p != 0 there.
    return pd, jnp.where(real, p * (dp - delta), 0.0)


def _dk_with_bias(dk, ds_sum, qb_ref):
    """dK = sum_s dS_st (q_s + bq) = (dS^T Q)_t + colsum(dS)_t bq (before the score scale)."""
    if qb_ref is None:
        return dk
    return dk + ds_sum[:, None] * qb_ref[...].astype(jnp.float32)[None, :]


def _accumulate_dkdv(dk, dv, pd, ds, q, do, *, key_major):
    """dV += Pd^T dO and dK += dS^T Q for one tile from `_grad_tile` (key-major tiles are the transposes already)."""
    return (dk + pltriton.dot(ds.astype(q.dtype), q, trans_a=not key_major),
            dv + pltriton.dot(pd.astype(do.dtype), do, trans_a=not key_major))


def _store_dkdv(refs, dk, dv):
    """Write dK (already scaled) and dV: `refs` is (dk_ref, dv_ref), or (one block of the packed dQKV,) whose C = 1, 2
    rows take them. Returns them as stored (rounded)."""
    dk, dv = dk.astype(refs[0].dtype), dv.astype(refs[-1].dtype)
    if len(refs) == 2:
        refs[0][...] = dk
        refs[1][...] = dv
    else:
        refs[0][:, 1, :] = dk
        refs[0][:, 2, :] = dv
    return dk, dv


def _colsum(x):
    """Column sums (over the rows) of a stored gradient tile, in fp32: this block's share of the Q/K/V bias gradient
    (`backward(bias_grad=True)`), summed from the values as written, so no pass re-reads dQKV for it.

    16-bit tiles go through the matrix unit, ones (16, rows) @ x: every product is exact and accumulates in fp32, each
    of the 16 result rows is the column sum, and `max` picks one within a warp. A plain sum over the rows reduces
    across warps through shared memory and measured 7.6 us more in the S=512 dK/dV kernel (session 11, run 10)."""
    if x.dtype == jnp.float32 or x.shape[0] < 16:
        return jnp.sum(x.astype(jnp.float32), axis=0)
    return jnp.max(pltriton.dot(jnp.ones((16, x.shape[0]), x.dtype), x), axis=0)


# ---------------------------------------------------------------------------------------------- kernels


def _fwd_kernel(q_ref, k_ref, v_ref, qb_ref, vb_ref, code_ref, seed_ref, o_ref, lse_ref, *, scale, block_k, heads,
                s_len, rate):
    # q_ref (block_q, H); k_ref, v_ref (T, H); qb_ref, vb_ref (H,) q and v biases or None; code_ref (T,);
    # o_ref (block_q, H); lse_ref (block_q,)
    block_q, h = q_ref.shape
    t_len = k_ref.shape[0]
    q_start = pl.program_id(0) * block_q
    drop = _dropout_base(seed_ref, heads=heads, s_len=s_len)
    qk_scale = scale * _LOG2E
    q = _biased(q_ref[...], qb_ref)
    kept_sum = vb_ref is not None and seed_ref is not None  # v's bias needs rowsum(P * keep): l only without dropout

    def body(j, carry):  # online softmax over key blocks (FlashAttention-2 Alg. 1), unnormalised accumulator
        acc, m, l, ld = carry
        k_start = pl.multiple_of(j * block_k, block_k)
        kv = pl.ds(k_start, block_k)
        s = _scores(q, k_ref[kv, :], code_ref[kv], qk_scale)
        m_new = jnp.maximum(m, jnp.max(s, axis=1))
        alpha = jnp.exp2(m - m_new)  # rescales the old sums; 0 on the first step (m = -inf)
        p = jnp.exp2(s - m_new[:, None])
        l = alpha * l + jnp.sum(p, axis=1)  # the normaliser sums the probabilities before dropout
        keep = _keep(drop, q_start, k_start, block_q, block_k, t_len=t_len, rate=rate)
        if keep is not None:  # dropout is linear, so it may drop unnormalised terms; 1/(1-rate) comes at the end
            p = jnp.where(keep, p, 0.0)
        if kept_sum:
            ld = alpha * ld + jnp.sum(p, axis=1)
        v = v_ref[kv, :]
        return alpha[:, None] * acc + pltriton.dot(p.astype(v.dtype), v), m_new, l, ld

    zeros = jnp.zeros((block_q,), jnp.float32)
    init = (jnp.zeros((block_q, h), jnp.float32), jnp.full((block_q,), -jnp.inf, jnp.float32), zeros, zeros)
    acc, m, l, ld = lax.fori_loop(0, t_len // block_k, body, init)
    if vb_ref is not None:  # sum_t p_t keep_t (v_t + bv) = acc + (kept row sum) bv
        acc = acc + (ld if kept_sum else l)[:, None] * vb_ref[...].astype(jnp.float32)[None, :]
    inv = (1.0 / (1.0 - rate)) / l if seed_ref is not None else 1.0 / l
    o_ref[...] = (acc * inv[:, None]).astype(o_ref.dtype)
    lse_ref[...] = m + jnp.log2(l)


def _dkdv_kernel(q_ref, k_ref, v_ref, qb_ref, vb_ref, code_ref, seed_ref, do_ref, lse_ref, delta_ref, *out_refs,
                 scale, block_q, heads, t_len, rate, key_major=False, bias_grad=False, aliased=False,
                 store_ds=False):
    # q_ref, do_ref (S, H); lse_ref, delta_ref (S,); k_ref, v_ref (block_k, H); code_ref (block_k,); biases as forward;
    # out_refs: dk_ref, dv_ref (block_k, H), or one (block_k, 3, H) block of the packed dQKV, whose C = 1, 2 rows are
    # written here (`aliased`: the dQ kernel's dQKV, passed first as an unread input); then with bias_grad a (2, H)
    # block for the column sums of dK and dV; last with store_ds this key block's dS, (block_k, S) key-major or
    # (S, block_k)
    ds_ref = sum_ref = None
    if store_ds:
        *out_refs, ds_ref = out_refs
    if bias_grad:
        *out_refs, sum_ref = out_refs
    if aliased:  # drop the aliased input
        out_refs = out_refs[1:]
    block_k, h = k_ref.shape
    s_len = q_ref.shape[0]
    k_start = pl.program_id(0) * block_k
    drop = _dropout_base(seed_ref, heads=heads, s_len=s_len)
    k, v, code = k_ref[...], _biased(v_ref[...], vb_ref), code_ref[...]
    kb = _bias_dot(k, qb_ref)  # q's bias: bq.k_t added to every score of key t

    def body(i, carry):  # dV = sum_i Pd_i^T dO_i, dK = sum_i dS_i^T Q_i over query blocks
        dk, dv, ds_sum = carry
        q_start = pl.multiple_of(i * block_q, block_q)
        rows = pl.ds(q_start, block_q)
        q, do = q_ref[rows, :], do_ref[rows, :]
        keep = _keep(drop, q_start, k_start, block_q, block_k, t_len=t_len, rate=rate, key_major=key_major)
        pd, ds = _grad_tile(q, k, v, do, code, lse_ref[rows], delta_ref[rows], keep,
                            qk_scale=scale * _LOG2E, rate=rate, key_major=key_major, kb=kb)
        if kb is not None:
            ds_sum = ds_sum + jnp.sum(ds, axis=1 if key_major else 0)
        if ds_ref is not None:  # rounded as the dK product (and the dQ kernel's) takes it
            if key_major:
                ds_ref[:, rows] = ds.astype(ds_ref.dtype)
            else:
                ds_ref[rows, :] = ds.astype(ds_ref.dtype)
        return *_accumulate_dkdv(dk, dv, pd, ds, q, do, key_major=key_major), ds_sum

    zeros = jnp.zeros((block_k, h), jnp.float32)
    dk, dv, ds_sum = lax.fori_loop(0, s_len // block_q, body, (zeros, zeros, jnp.zeros((block_k,), jnp.float32)))
    dk, dv = _store_dkdv(out_refs, _dk_with_bias(dk, ds_sum, qb_ref) * scale, dv)  # d(q.k * scale)/dk = scale * q
    if sum_ref is not None:
        sum_ref[0, :] = _colsum(dk)
        sum_ref[1, :] = _colsum(dv)


def _dq_kernel(q_ref, k_ref, v_ref, qb_ref, vb_ref, code_ref, seed_ref, do_ref, lse_ref, o_ref, dq_ref, delta_ref,
               *sum_ref, scale, block_k, heads, s_len, rate):
    # q_ref, do_ref, o_ref, dq_ref (block_q, H) (dq_ref: the C = 0 block of the packed dQKV when packed); lse_ref,
    # delta_ref (block_q,); k_ref, v_ref (T, H); code_ref (T,); sum_ref: optional (H,) block for dQ's column sums.
    # Runs before the dK/dV kernel: it forms delta = rowsum(dO * O) of its rows (read once here, not by a separate
    # XLA pass) and writes it for that kernel.
    block_q, h = q_ref.shape
    t_len = k_ref.shape[0]
    q_start = pl.program_id(0) * block_q
    drop = _dropout_base(seed_ref, heads=heads, s_len=s_len)
    q, do, lse = _biased(q_ref[...], qb_ref), do_ref[...], lse_ref[...]
    delta = jnp.sum(o_ref[...].astype(jnp.float32) * do.astype(jnp.float32), axis=1)
    delta_ref[...] = delta
    cq = _bias_dot(do, vb_ref)  # v's bias: dO_s.bv added to every dP of query s

    def body(j, dq):  # dQ = sum_j dS_j K_j over key blocks
        k_start = pl.multiple_of(j * block_k, block_k)
        kv = pl.ds(k_start, block_k)
        k = k_ref[kv, :]
        keep = _keep(drop, q_start, k_start, block_q, block_k, t_len=t_len, rate=rate)
        _, ds = _grad_tile(q, k, v_ref[kv, :], do, code_ref[kv], lse, delta, keep,
                           qk_scale=scale * _LOG2E, rate=rate, cq=cq)
        return dq + pltriton.dot(ds.astype(k.dtype), k)

    _store_dq(dq_ref, sum_ref, lax.fori_loop(0, t_len // block_k, body, jnp.zeros((block_q, h), jnp.float32)), scale)


def _dq_from_ds_kernel(ds_ref, k_ref, *refs, scale, block_k, key_major, aliased):
    # ds_ref: this query block's dS as the dK/dV kernel stored it, (T, block_q) key-major or (block_q, T); k_ref (T, H);
    # refs: (the packed dQKV as an aliased input, unread, if `aliased`), dq_ref (block_q, H), then optionally a (H,)
    # block for dQ's column sums. dQ = dS K: no scores, mask or probabilities here (`BlockSizes.store_ds`).
    dq_ref, *sum_ref = refs[1:] if aliased else refs
    t_len, h = k_ref.shape

    def body(j, dq):
        kv = pl.ds(pl.multiple_of(j * block_k, block_k), block_k)
        ds = ds_ref[kv, :] if key_major else ds_ref[:, kv]
        return dq + pltriton.dot(ds, k_ref[kv, :], trans_a=key_major)

    zeros = jnp.zeros((dq_ref.shape[0], h), jnp.float32)
    _store_dq(dq_ref, sum_ref, lax.fori_loop(0, t_len // block_k, body, zeros), scale)


def _store_dq(dq_ref, sum_ref, dq, scale):
    """Write dQ (the fp32 sum over key blocks, times the score scale) and, if `sum_ref` holds a (H,) block, its
    column sums as stored (the dQ kernels' share of the bias gradient)."""
    dq = (dq * scale).astype(dq_ref.dtype)
    dq_ref[...] = dq
    if sum_ref:
        sum_ref[0][...] = _colsum(dq)


def _bwd_fused_kernel(q_ref, k_ref, v_ref, qb_ref, vb_ref, code_ref, seed_ref, do_ref, lse_ref, o_ref, *out_refs,
                      scale, block_q, heads, rate, key_major=False, bias_grad=False):
    # One program per (b, n) with all T keys: q_ref, do_ref, o_ref (S, H); lse_ref (S,); k_ref, v_ref (T, H);
    # code_ref (T,); out_refs: dq_ref (S, H), dk_ref, dv_ref (T, H), or one (S, 3, H) block of the packed dQKV; with
    # bias_grad last a (3, H) block for the column sums of dQ, dK, dV.
    # Each query block's probabilities (and dropout mask) are computed once, for dV, dK and dQ together; delta =
    # rowsum(dO * O) is formed here too. dQ rows are final after their step (all keys seen) and stored at once.
    t_len, h = k_ref.shape
    s_len = q_ref.shape[0]
    sum_ref = None
    if bias_grad:
        *out_refs, sum_ref = out_refs
    packed = len(out_refs) == 1
    drop = _dropout_base(seed_ref, heads=heads, s_len=s_len)
    k, v, code = k_ref[...], _biased(v_ref[...], vb_ref), code_ref[...]
    kb = _bias_dot(k, qb_ref)  # q's bias, as in the dK/dV kernel

    def body(i, carry):
        dk, dv, ds_sum, dq_sum = carry
        q_start = pl.multiple_of(i * block_q, block_q)
        rows = pl.ds(q_start, block_q)
        q, do = q_ref[rows, :], do_ref[rows, :]
        delta = jnp.sum(o_ref[rows, :].astype(jnp.float32) * do.astype(jnp.float32), axis=1)
        keep = _keep(drop, q_start, 0, block_q, t_len, t_len=t_len, rate=rate, key_major=key_major)
        pd, ds = _grad_tile(q, k, v, do, code, lse_ref[rows], delta, keep, qk_scale=scale * _LOG2E, rate=rate,
                            key_major=key_major, kb=kb)
        if kb is not None:
            ds_sum = ds_sum + jnp.sum(ds, axis=1 if key_major else 0)
        ds = ds.astype(k.dtype)
        # The order below (dQ product, dV, dK, then the dQ store) is the one verified on the GPU. Issuing the dQ store
        # before the dK/dV products and dK before dV (same math; interpret mode passes) gave a wrong dV, differently
        # from run to run, compiled by Triton 3.6 on an H200 with key-major tiles (session 8, run 1): keep it.
        dq = pltriton.dot(ds, k, trans_a=key_major)
        dv = dv + pltriton.dot(pd.astype(do.dtype), do, trans_a=not key_major)
        dk = dk + pltriton.dot(ds, q, trans_a=not key_major)
        dq = (dq * scale).astype(out_refs[0].dtype)
        if packed:
            out_refs[0][rows, 0, :] = dq
        else:
            out_refs[0][rows, :] = dq
        if sum_ref is not None:
            dq_sum = dq_sum + _colsum(dq)
        return dk, dv, ds_sum, dq_sum

    zeros = jnp.zeros((t_len, h), jnp.float32)
    init = (zeros, zeros, jnp.zeros((t_len,), jnp.float32), jnp.zeros((h,), jnp.float32))
    dk, dv, ds_sum, dq_sum = lax.fori_loop(0, s_len // block_q, body, init)
    dk, dv = _store_dkdv(out_refs if packed else out_refs[1:], _dk_with_bias(dk, ds_sum, qb_ref) * scale, dv)
    if sum_ref is not None:
        sum_ref[0, :] = dq_sum
        sum_ref[1, :] = _colsum(dk)
        sum_ref[2, :] = _colsum(dv)


# ---------------------------------------------------------------------------------------------- pallas_calls


def _seed_spec(seed):
    return None if seed is None else pl.BlockSpec((4,), lambda *_: (0,))  # [seed0, seed1, b offset, n offset]


def _qkv_spec(packed: bool, c: int, rows: int, h: int, row_block):
    """BlockSpec of q (c=0), k (1) or v (2): (rows, H) tiles of a (B, S, N, H) array, or of the C = c slice of a
    packed (B, S, 3, N, H) one; grid (i, b, n) and the row block index `row_block(i)`."""
    if packed:
        return pl.BlockSpec((None, rows, None, None, h), lambda i, b_, n_: (b_, row_block(i), c, n_, 0))
    return pl.BlockSpec((None, rows, None, h), lambda i, b_, n_: (b_, row_block(i), n_, 0))


def _ds_shape(blocks: BlockSizes, b: int, n: int, s: int, t: int):
    """The stored dS (`BlockSizes.store_ds`) in q's dtype: (B, N, T, S) with key-major tiles (as the dK/dV kernel
    forms them), else (B, N, S, T)."""
    return (b, n, t, s) if blocks.key_major else (b, n, s, t)


def _ds_spec(blocks: BlockSizes, keys: int, queries: int, key_block, query_block):
    """BlockSpec of a (keys x queries) block of the stored dS (laid out as `_ds_shape`); grid (i, b, n), with the
    key and query block indices `key_block(i)`, `query_block(i)`."""
    if blocks.key_major:
        return pl.BlockSpec((None, None, keys, queries), lambda i, b_, n_: (b_, n_, key_block(i), query_block(i)))
    return pl.BlockSpec((None, None, queries, keys), lambda i, b_, n_: (b_, n_, query_block(i), key_block(i)))


def _bias_specs(bias):
    """BlockSpecs of the q and v biases: the (H,) rows C = 0 and 2 of bias (3, N, H) at the program's head n (k's
    bias is never read: see the shared tile math); two Nones without a bias (Pallas drops None operands)."""
    if bias is None:
        return [None, None]
    h = bias.shape[-1]
    return [pl.BlockSpec((None, None, h), lambda i, b_, n_, c=c: (c, n_, 0)) for c in (0, 2)]


def _bias_args(bias, dtype):
    """The q and v bias operands: the bias rounded to the activations' dtype first, as the layer's XLA add rounds it."""
    return (None, None) if bias is None else (bias.astype(dtype),) * 2


_shapes = kernel_mgpu.shapes  # (B, S, N, H, T) of q and k, unpacked or packed


def forward(q, k, v, code, seed, *, rate: float, blocks: BlockSizes, interpret: bool, heads: int | None = None,
            packed: bool = False, bias=None):
    """Context (B, S, N, H) in q's dtype and the fp32 base-2 logsumexp (B, N, S).

    `code` from `mask_code`; `seed` from `seed_words`, or None for no dropout (the kernel then has no dropout code).
    `heads`: the total head count of the dropout index when q holds a tensor-parallel shard of them (default N).
    `packed`: q, k and v are the same (B, S, 3, N, H) array (C = q, k, v), read in place (no slices).
    `bias`: None, or the (3, N, H) Q/K/V projection bias, applied inside the kernels (AIB fused; see the shared tile
    math for how: only tiles loaded once per program get it added).
    """
    b, s, n, h, t = _shapes(q, k, packed)
    heads = n if heads is None else heads
    if blocks.mgpu_fwd:
        return kernel_mgpu.forward(q, k, v, code, seed, rate=rate, interpret=interpret, heads=heads, packed=packed,
                                   bias=bias)
    bq = blocks.block_q
    out_block = pl.BlockSpec((None, bq, None, h), lambda i, b_, n_: (b_, i, n_, 0))
    return pl.pallas_call(
        functools.partial(_fwd_kernel, scale=h**-0.5, block_k=blocks.block_k, heads=heads, s_len=s, rate=rate),
        grid=(s // bq, b, n),
        in_specs=[_qkv_spec(packed, 0, bq, h, lambda i: i), _qkv_spec(packed, 1, t, h, lambda i: 0),
                  _qkv_spec(packed, 2, t, h, lambda i: 0), *_bias_specs(bias),
                  pl.BlockSpec((None, t), lambda i, b_, n_: (b_, 0)), _seed_spec(seed)],
        out_specs=[out_block, pl.BlockSpec((None, None, bq), lambda i, b_, n_: (b_, n_, i))],
        out_shape=[jax.ShapeDtypeStruct((b, s, n, h), q.dtype), jax.ShapeDtypeStruct((b, n, s), jnp.float32)],
        compiler_params=compiler_params(blocks.num_warps, blocks.num_stages),
        interpret=interpret, name="flash_attention_fwd",
    )(q, k, v, *_bias_args(bias, q.dtype), code, seed)


def backward(q, k, v, code, seed, o, lse, do, *, rate: float, blocks: BlockSizes, interpret: bool,
             heads: int | None = None, packed: bool = False, bias=None, bias_grad: bool = False):
    """(dq, dk, dv) in the dtypes of (q, k, v); `heads` and `bias` as in `forward`. `packed` (q, k, v one
    (B, S, 3, N, H) array): the packed dQKV (B, S, 3, N, H), written in place by both kernels (no concatenation).
    `bias_grad`: ((those), dbias) with dbias (3, N, H) in fp32, the sums of dQ, dK, dV over B and S (the gradient of
    a Q/K/V bias added before attention, folded or not): each program sums the columns of the tiles it stores, and
    XLA adds those per-program sums, so dQKV is not read again for it."""
    b, s, n, h, t = _shapes(q, k, packed)
    heads = n if heads is None else heads
    if blocks.mgpu_bwd:
        return kernel_mgpu.backward(q, k, v, code, seed, o, lse, do, rate=rate, interpret=interpret, heads=heads,
                                    packed=packed, bias=bias, bias_grad=bias_grad)
    if blocks.fused_bwd:
        return _backward_fused(q, k, v, code, seed, o, lse, do, rate=rate, blocks=blocks, interpret=interpret,
                               heads=heads, packed=packed, bias=bias, bias_grad=bias_grad)
    if blocks.store_ds:
        return _backward_stored_ds(q, k, v, code, seed, o, lse, do, rate=rate, blocks=blocks, interpret=interpret,
                                   heads=heads, packed=packed, bias=bias, bias_grad=bias_grad)
    # dQ first: it also forms delta = rowsum(dO * O) (B, N, S) in fp32, which the dK/dV kernel reads in full.
    bq = blocks.block_q_dq
    row_block = pl.BlockSpec((None, bq, None, h), lambda i, b_, n_: (b_, i, n_, 0))
    stat_block = pl.BlockSpec((None, None, bq), lambda i, b_, n_: (b_, n_, i))
    dq, delta, *dq_sums = pl.pallas_call(
        functools.partial(_dq_kernel, scale=h**-0.5, block_k=blocks.block_k_dq, heads=heads, s_len=s, rate=rate),
        grid=(s // bq, b, n),
        in_specs=[_qkv_spec(packed, 0, bq, h, lambda i: i), _qkv_spec(packed, 1, t, h, lambda i: 0),
                  _qkv_spec(packed, 2, t, h, lambda i: 0), *_bias_specs(bias),
                  pl.BlockSpec((None, t), lambda i, b_, n_: (b_, 0)), _seed_spec(seed), row_block, stat_block,
                  row_block],
        # packed: the C = 0 blocks of a new (B, S, 3, N, H) dQKV, whose C = 1, 2 rows the dK/dV kernel writes
        out_specs=[_qkv_spec(packed, 0, bq, h, lambda i: i), stat_block, *_dq_sum_spec(bias_grad, h)],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((b, n, s), jnp.float32),
                   *_dq_sum_shape(bias_grad, s // bq, b, n, h)],
        compiler_params=compiler_params(blocks.num_warps_dq or blocks.num_warps_bwd,
                                        blocks.num_stages_dq or blocks.num_stages_bwd),
        interpret=interpret, name="flash_attention_dq",
    )(q, k, v, *_bias_args(bias, q.dtype), code, seed, do, lse, o)
    dkdv, dkdv_sums, _ = _dkdv_call(q, k, v, code, seed, do, lse, delta, rate=rate, blocks=blocks,
                                    interpret=interpret, heads=heads, packed=packed, bias=bias, bias_grad=bias_grad,
                                    dqkv=dq if packed else None)
    grads = dkdv[0] if packed else (dq, *dkdv)
    return (grads, _pair_dbias(dq_sums[0], dkdv_sums)) if bias_grad else grads


def _dq_sum_spec(bias_grad: bool, h: int):
    """The dQ kernels' per-program column sums of dQ: a (H,) block of a (S // block_q, B, N, H) array (none without
    bias_grad)."""
    return [pl.BlockSpec((None, None, None, h), lambda i, b_, n_: (i, b_, n_, 0))] if bias_grad else []


def _dq_sum_shape(bias_grad: bool, *shape):
    return [jax.ShapeDtypeStruct(shape, jnp.float32)] if bias_grad else []


def _pair_dbias(dq_sums, dkdv_sums):
    """(3, N, H) bias gradient from the pair's per-program column sums: dQ's (S/bq, B, N, H), dK/dV's (T/bk, B, N, 2,
    H)."""
    return jnp.concatenate([jnp.sum(dq_sums, axis=(0, 1))[None], jnp.sum(dkdv_sums, axis=(0, 1)).swapaxes(0, 1)])


def _dkdv_call(q, k, v, code, seed, do, lse, delta, *, rate, blocks, interpret, heads, packed, bias, bias_grad,
               dqkv=None):
    """The dK/dV kernel: ((dk, dv) or (packed dQKV,), per-program column sums or None, dS or None). Packed, it
    writes C = 1, 2 of `dqkv` in place (aliased; the dQ kernel's) or, without one, of a new (B, S, 3, N, H) array
    whose C = 0 the dQ kernel fills. With `blocks.store_ds` it also stores dS (`_ds_shape`)."""
    b, s, n, h, t = _shapes(q, k, packed)
    bk = blocks.block_k_dkv
    seq_full = pl.BlockSpec((None, s, None, h), lambda j, b_, n_: (b_, 0, n_, 0))
    stat_full = pl.BlockSpec((None, None, s), lambda j, b_, n_: (b_, n_, 0))
    if packed:  # one (block_k, 3, H) block of the packed dQKV; C = 1, 2 written here
        out_specs = [pl.BlockSpec((None, bk, 3, None, h), lambda j, b_, n_: (b_, j, 0, n_, 0))]
        out_shapes = [jax.ShapeDtypeStruct(q.shape, q.dtype)]
    else:
        key_block = pl.BlockSpec((None, bk, None, h), lambda j, b_, n_: (b_, j, n_, 0))
        out_specs = [key_block, key_block]
        out_shapes = [jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)]
    n_grads = len(out_specs)
    if bias_grad:  # dK's and dV's column sums per program
        out_specs = out_specs + [pl.BlockSpec((None, None, None, 2, h), lambda j, b_, n_: (j, b_, n_, 0, 0))]
        out_shapes = out_shapes + [jax.ShapeDtypeStruct((t // bk, b, n, 2, h), jnp.float32)]
    store_ds = blocks.store_ds
    if store_ds:  # this key block's dS for every query
        out_specs = out_specs + [_ds_spec(blocks, bk, s, lambda j: j, lambda j: 0)]
        out_shapes = out_shapes + [jax.ShapeDtypeStruct(_ds_shape(blocks, b, n, s, t), q.dtype)]
    aliased = dqkv is not None
    operands = [q, k, v, *_bias_args(bias, q.dtype), code, seed, do, lse, delta]
    outs = pl.pallas_call(
        functools.partial(_dkdv_kernel, scale=h**-0.5, block_q=blocks.block_q_dkv, heads=heads, t_len=t, rate=rate,
                          key_major=blocks.key_major, bias_grad=bias_grad, aliased=aliased,
                          store_ds=store_ds),
        grid=(t // bk, b, n),
        in_specs=[_qkv_spec(packed, 0, s, h, lambda j: 0), _qkv_spec(packed, 1, bk, h, lambda j: j),
                  _qkv_spec(packed, 2, bk, h, lambda j: j), *_bias_specs(bias),
                  pl.BlockSpec((None, bk), lambda j, b_, n_: (b_, j)), _seed_spec(seed), seq_full, stat_full,
                  stat_full] + (out_specs[:1] if aliased else []),
        out_specs=out_specs, out_shape=out_shapes,
        # the aliased operand's flat index: None operands (seed, biases) are dropped
        input_output_aliases={sum(x is not None for x in operands): 0} if aliased else {},
        compiler_params=compiler_params(blocks.num_warps_bwd, blocks.num_stages_bwd),
        interpret=interpret, name="flash_attention_dkdv",
    )(*operands, *([dqkv] if aliased else []))
    grads, rest = list(outs[:n_grads]), list(outs[n_grads:])
    sums = rest.pop(0) if bias_grad else None
    return grads, sums, (rest[0] if store_ds else None)


def _backward_stored_ds(q, k, v, code, seed, o, lse, do, *, rate, blocks, interpret, heads, packed, bias=None,
                        bias_grad=False):
    """`backward` with `BlockSizes.store_ds`: delta by XLA, the dK/dV kernel (storing dS), then dQ = dS K."""
    b, s, n, h, t = _shapes(q, k, packed)
    delta = jnp.einsum("bsnh,bsnh->bns", o.astype(jnp.float32), do.astype(jnp.float32))
    dkdv, dkdv_sums, ds = _dkdv_call(q, k, v, code, seed, do, lse, delta, rate=rate, blocks=blocks,
                                     interpret=interpret, heads=heads, packed=packed, bias=bias,
                                     bias_grad=bias_grad)
    bq = blocks.block_q_dq
    dq_spec = _qkv_spec(packed, 0, bq, h, lambda i: i)
    dq, *dq_sums = pl.pallas_call(
        functools.partial(_dq_from_ds_kernel, scale=h**-0.5, block_k=blocks.block_k_dq, key_major=blocks.key_major,
                          aliased=packed),
        grid=(s // bq, b, n),
        in_specs=[_ds_spec(blocks, t, bq, lambda i: 0, lambda i: i), _qkv_spec(packed, 1, t, h, lambda i: 0)]
        + ([dq_spec] if packed else []),
        # packed: C = 0 of the dK/dV kernel's dQKV, written in place
        out_specs=[dq_spec, *_dq_sum_spec(bias_grad, h)],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), *_dq_sum_shape(bias_grad, s // bq, b, n, h)],
        input_output_aliases={2: 0} if packed else {},
        compiler_params=compiler_params(blocks.num_warps_dq or blocks.num_warps_bwd,
                                        blocks.num_stages_dq or blocks.num_stages_bwd),
        interpret=interpret, name="flash_attention_dq_from_ds",
    )(ds, k, *([dkdv[0]] if packed else []))
    grads = dq if packed else (dq, *dkdv)
    return (grads, _pair_dbias(dq_sums[0], dkdv_sums)) if bias_grad else grads


def _backward_fused(q, k, v, code, seed, o, lse, do, *, rate, blocks, interpret, heads, packed, bias=None,
                    bias_grad=False):
    """`backward` as one kernel per (b, n) (`BlockSizes.fused_bwd`): grid (1, B, N), every block spans S or T."""
    b, s, n, h, t = _shapes(q, k, packed)
    seq_full = pl.BlockSpec((None, s, None, h), lambda j, b_, n_: (b_, 0, n_, 0))
    if packed:
        out_specs = [pl.BlockSpec((None, s, 3, None, h), lambda j, b_, n_: (b_, 0, 0, n_, 0))]
        out_shapes = [jax.ShapeDtypeStruct(q.shape, q.dtype)]
    else:
        key_full = pl.BlockSpec((None, t, None, h), lambda j, b_, n_: (b_, 0, n_, 0))
        out_specs = [seq_full, key_full, key_full]
        out_shapes = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v)]
    if bias_grad:  # the column sums of dQ, dK, dV per (b, n)
        out_specs = out_specs + [pl.BlockSpec((None, None, 3, h), lambda j, b_, n_: (b_, n_, 0, 0))]
        out_shapes = out_shapes + [jax.ShapeDtypeStruct((b, n, 3, h), jnp.float32)]
    grads = pl.pallas_call(
        functools.partial(_bwd_fused_kernel, scale=h**-0.5, block_q=blocks.block_q_dkv, heads=heads, rate=rate,
                          key_major=blocks.key_major, bias_grad=bias_grad),
        grid=(1, b, n),
        in_specs=[_qkv_spec(packed, 0, s, h, lambda j: 0), _qkv_spec(packed, 1, t, h, lambda j: 0),
                  _qkv_spec(packed, 2, t, h, lambda j: 0), *_bias_specs(bias),
                  pl.BlockSpec((None, t), lambda j, b_, n_: (b_, 0)), _seed_spec(seed), seq_full,
                  pl.BlockSpec((None, None, s), lambda j, b_, n_: (b_, n_, 0)), seq_full],
        out_specs=out_specs, out_shape=out_shapes,
        compiler_params=compiler_params(blocks.num_warps_fused, blocks.num_stages_bwd),
        interpret=interpret, name="flash_attention_bwd_fused",
    )(q, k, v, *_bias_args(bias, q.dtype), code, seed, do, lse, o)
    if bias_grad:
        *grads, sums = grads
    grads = grads[0] if packed else tuple(grads)
    return (grads, jnp.sum(sums, axis=0).swapaxes(0, 1)) if bias_grad else grads
