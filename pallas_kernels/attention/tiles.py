"""Tile math shared by the Triton flash-attention kernels (`forward.py`, `backward.py`), and their BlockSpecs.

Numerics: scores and softmax in fp32 in base 2 (s2 = q.k * H**-0.5 * log2(e), so exp2 replaces exp); the only
residual besides the inputs and the output is the fp32 base-2 logsumexp `lse` (B, N, S) of each query row.

Key mask: the (B, T) mask becomes an int32 code per key (`mask_code`): 1 real, 0 padded, -1 a key of an example with
no real key at all (packed rows' segment ids are their own code: `allowed`). Padded keys get the reference's score
finfo.min, so their probability is exactly 0. The reference gives an all-padded example the uniform distribution
(softmax of T equal scores); a constant score 0 does the same while keeping its logsumexp finite (log2 T) for the
backward, where finfo.min + log2 T would round back to finfo.min and make every recomputed probability 1 instead of
1/T.

Dropout: probability element (b, n, s, t) is kept iff `pallas_kernels.dropout.keep_mask` keeps index
((b*N + n)*S + s)*T + t of the reference's BNST tensor (one hash per two neighbouring keys, `keep_mask_tile`), so the
masks agree bit for bit. The backward regenerates the mask from the seed; it is never stored.

The Q/K/V projection's bias (AIB) is folded into the kernels instead of a pass over the projection's output. Adding
it to a tile loaded inside a loop, between the load and its `dot`, slowed every kernel, so only tiles loaded once per
program get it added (`biased`); the rest follows from exact identities:
- k's bias adds q.bk to every score of a query row: softmax is invariant to that, so it is left out everywhere
  (its gradient, a sum of dK, is zero up to rounding: the rows of dS sum to zero);
- v's bias adds rowsum(P * D) bv to the output (the forward accumulates that row sum, `ld`), and dO.bv to every
  dP of a query row (`grad_tile(cq=)`);
- q's bias adds bq.k_t to every score of key t (`grad_tile(kb=)`), and colsum(dS) bq to dK.
"""

import math

import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from ..dropout import keep_mask_tile

LOG2E = math.log2(math.e)
PADDED = float(jnp.finfo(jnp.float32).min)  # the score of a padded key, as in the reference softmax


def shapes(q, k, packed: bool):
    """(B, S, N, H, T) of unpacked q (B, S, N, H), k (B, T, N, H), or of packed qkv (B, S, 3, N, H)."""
    if packed:
        b, s, _, n, h = q.shape
        return b, s, n, h, s
    b, s, n, h = q.shape
    return b, s, n, h, k.shape[1]


def mask_code(mask, segments: bool = False):
    """int32 (B, T): 1 at real keys, 0 at padded keys, -1 at every key of an example without real keys. With
    `segments`, `mask` holds packed rows' segment ids (B, S), which are the code as they are (0 at padding, itself a
    segment): the kernels then read the code of the query rows too (`allowed`)."""
    if segments:
        return mask.astype(jnp.int32)
    real = mask.astype(bool)
    return jnp.where(real, 1, jnp.where(jnp.any(real, axis=1, keepdims=True), 0, -1)).astype(jnp.int32)


def allowed(code, qcode):
    """(allowed, fill) of a tile, broadcast against its scores: which scores are kept and what the others become.

    Key mask (`qcode` None): real keys are kept; padded ones get PADDED, every key of an all-padded example 0 (the
    uniform distribution). Segments (`qcode`: the segment ids of the tile's query rows): a key is kept for the
    queries of its own segment, the padding (id 0) being one (`reference.segment_mask`), the others get PADDED: one
    compare per score, and every query row keeps its own key, so a masked probability is exactly 0. `code` and
    `qcode` come shaped for the tile ((1, keys) and (queries, 1), or transposed for key-major tiles)."""
    if qcode is None:
        return code > 0, jnp.where(code == 0, PADDED, 0.0)
    return qcode == code, PADDED


def segment_blocks(code, rows: int, cols: int):
    """Which tiles of packed rows hold any score the softmax keeps (segments): for `code` (B, S) from
    `mask_code(segments=True)` and tiles of `rows` queries x `cols` keys, int32 (B, S/rows, 2) [first, end) key blocks
    of each query block and (B, S/cols, 2) [first, end) query blocks of each key block (the padding, id 0, is a
    segment too: its blocks attend each other). The tiles outside hold only masked scores (probability exactly 0, no
    gradient), so the kernels skip them and their results are unchanged: attention then costs about sum(length^2) /
    S^2 of a full row. Per row of any layout of segments (conservative: the span from the first tile to the last)."""
    b, s = code.shape
    pairs = code[:, :, None] == code[:, None, :]  # kept as `allowed` keeps them
    tiles = jnp.any(pairs.reshape(b, s // rows, rows, s // cols, cols), axis=(2, 4))

    def span(t, axis):
        n = t.shape[axis]
        first = jnp.argmax(t, axis=axis)
        end = n - jnp.argmax(jnp.flip(t, axis=axis), axis=axis)
        some = jnp.any(t, axis=axis)
        return jnp.stack([jnp.where(some, first, 0), jnp.where(some, end, 0)], axis=-1).astype(jnp.int32)

    return span(tiles, 2), span(tiles, 1)


def block_span(ranges_ref, n: int):
    """(first, end) block indices from a `segment_blocks` span ref; (0, n) without segments."""
    if ranges_ref is None:
        return 0, n
    return ranges_ref[0], ranges_ref[1]


def span_spec(segments: bool, block_index):
    """BlockSpec of one block's span in a `segment_blocks` array, grid (i, b, n) and `block_index(i)`; None without
    segments."""
    return pl.BlockSpec((None, None, 2), lambda i, b_, n_: (b_, block_index(i), 0)) if segments else None


def masked_ds(p, dp, delta, kept, segments: bool):
    """dS = P (dP - delta) of a tile, none at masked scores (`kept`, from `allowed`). The reference's `where` passes
    no gradient to masked keys; only all-padded examples (code -1) have p != 0 there, so with segments, where no row is
    all masked and every masked p is exactly 0, its dS is 0 without the select."""
    ds = p * (dp - delta)
    return ds if segments else jnp.where(kept, ds, 0.0)


def biased(x, bias_ref):
    """A tile loaded once per program plus its head's bias (H,): added in fp32 and rounded to the tile's dtype, as
    XLA's bf16 add of the bias to the projection rounds it."""
    if bias_ref is None:
        return x
    return (x.astype(jnp.float32) + bias_ref[...].astype(jnp.float32)[None, :]).astype(x.dtype)


def bias_dot(x, bias_ref):
    """x (rows, H) . bias (H,) in fp32, per row; None without a bias."""
    if bias_ref is None:
        return None
    return jnp.sum(x.astype(jnp.float32) * bias_ref[...].astype(jnp.float32)[None, :], axis=1)


def scores(q, k, code, qk_scale, qcode=None):
    """Masked base-2 scores (block_q, block_k) in fp32; `qcode` (block_q,) the query rows' codes with segments."""
    s = pltriton.dot(q, k, trans_b=True) * qk_scale
    keep, fill = allowed(code[None, :], None if qcode is None else qcode[:, None])
    return jnp.where(keep, s, fill)


def dropout_base(seed_ref, *, heads, s_len):
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


def keep(drop, q_start, k_start, block_q, block_k, *, t_len, rate, key_major=False):
    """Keep mask (block_q, block_k) of the tile at rows q_start.., keys k_start.. ((block_k, block_q) if key_major);
    None when dropout is off.

    Index ((b*N + n)*S + s)*T + t in uint32 (wrapping as the reference's uint32 arange would). Drawn row-major (one
    hash per two neighbouring keys) and transposed for key-major tiles: measured faster than one hash per score in
    the key-major orientation (kernels-h200.md, Attention).
    """
    if drop is None:
        return None
    seed0, seed1, head_row = drop
    rows = head_row + (q_start + jnp.arange(block_q, dtype=jnp.int32)).astype(jnp.uint32)
    keep = keep_mask_tile(seed0, seed1, rows, k_start, block_k, t_len, rate)
    return keep.T if key_major else keep


def grad_tile(q, k, v, do, code, lse, delta, keep, *, qk_scale, rate, key_major=False, kb=None, cq=None,
              qcode=None):
    """(dropped probabilities for dV, dS w.r.t. the natural-log scores) of one tile; FlashAttention-2 Alg. 2.

    With D = keep / (1 - rate): O = (P*D) V, so dP = D * (dO V^T) and dS = P * (dP - rowsum(P * dP)), where
    rowsum(P * dP) = rowsum(dO * O) = delta still holds with dropout. Tiles are (block_q, block_k), or with
    `key_major` their transposes (Pd^T, dS^T) from k @ q^T and v @ dO^T (`keep` from `keep(..., key_major=True)`).
    `kb` (per key) is added to the raw scores and `cq` (per query) to dO V^T: the q and v biases (module docstring).
    `qcode` (per query): the query rows' codes with segments (`allowed`).
    """
    if key_major:  # per-key values run down the rows, per-query values along them
        s, dp = pltriton.dot(k, q, trans_b=True), pltriton.dot(v, do, trans_b=True)
        code, lse, delta = code[:, None], lse[None, :], delta[None, :]
        kb, cq = (None if kb is None else kb[:, None]), (None if cq is None else cq[None, :])
        qcode = None if qcode is None else qcode[None, :]
    else:
        s, dp = pltriton.dot(q, k, trans_b=True), pltriton.dot(do, v, trans_b=True)
        code, lse, delta = code[None, :], lse[:, None], delta[:, None]
        kb, cq = (None if kb is None else kb[None, :]), (None if cq is None else cq[:, None])
        qcode = None if qcode is None else qcode[:, None]
    if kb is not None:
        s = s + kb
    if cq is not None:
        dp = dp + cq
    real, fill = allowed(code, qcode)
    p = jnp.exp2(jnp.where(real, s * qk_scale, fill) - lse)  # as `scores`
    pd = p
    if keep is not None:
        inv_keep = 1.0 / (1.0 - rate)
        pd = jnp.where(keep, p * inv_keep, 0.0)
        dp = jnp.where(keep, dp * inv_keep, 0.0)
    return pd, masked_ds(p, dp, delta, real, qcode is not None)


def dk_with_bias(dk, ds_sum, qb_ref):
    """dK = sum_s dS_st (q_s + bq) = (dS^T Q)_t + colsum(dS)_t bq (before the score scale)."""
    if qb_ref is None:
        return dk
    return dk + ds_sum[:, None] * qb_ref[...].astype(jnp.float32)[None, :]


def accumulate_dkdv(dk, dv, pd, ds, q, do, *, key_major):
    """dV += Pd^T dO and dK += dS^T Q for one tile from `grad_tile` (key-major tiles are the transposes already)."""
    return (dk + pltriton.dot(ds.astype(q.dtype), q, trans_a=not key_major),
            dv + pltriton.dot(pd.astype(do.dtype), do, trans_a=not key_major))


def store_dkdv(refs, dk, dv):
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


def colsum(x):
    """Column sums (over the rows) of a stored gradient tile, in fp32: this block's share of the Q/K/V bias gradient
    (`backward(bias_grad=True)`), summed from the values as written, so no pass re-reads dQKV for it.

    16-bit tiles go through the matrix unit, ones (16, rows) @ x: every product is exact and accumulates in fp32, each
    of the 16 result rows is the column sum, and `max` picks one within a warp. A plain sum over the rows reduces
    across warps through shared memory, 7.6 us slower in the S=512 dK/dV kernel (kernels-h200.md, Attention)."""
    if x.dtype == jnp.float32 or x.shape[0] < 16:
        return jnp.sum(x.astype(jnp.float32), axis=0)
    return jnp.max(pltriton.dot(jnp.ones((16, x.shape[0]), x.dtype), x), axis=0)

# ---------------------------------------------------------------------------------------------- BlockSpecs

def qcode_spec(segments: bool, rows: int, row_block):
    """BlockSpec of the query rows' codes (with segments: the same (B, S) code array, read by query rows), grid
    (i, b, n); None without segments (Pallas drops None operands)."""
    return pl.BlockSpec((None, rows), lambda i, b_, n_: (b_, row_block(i))) if segments else None


def seed_spec(seed):
    return None if seed is None else pl.BlockSpec((4,), lambda *_: (0,))  # [seed0, seed1, b offset, n offset]


def qkv_spec(packed: bool, c: int, rows: int, h: int, row_block):
    """BlockSpec of q (c=0), k (1) or v (2): (rows, H) tiles of a (B, S, N, H) array, or of the C = c slice of a
    packed (B, S, 3, N, H) one; grid (i, b, n) and the row block index `row_block(i)`."""
    if packed:
        return pl.BlockSpec((None, rows, None, None, h), lambda i, b_, n_: (b_, row_block(i), c, n_, 0))
    return pl.BlockSpec((None, rows, None, h), lambda i, b_, n_: (b_, row_block(i), n_, 0))

def bias_specs(bias):
    """BlockSpecs of the q and v biases: the (H,) rows C = 0 and 2 of bias (3, N, H) at the program's head n (k's
    bias is never read: see the module docstring); two Nones without a bias (Pallas drops None operands)."""
    if bias is None:
        return [None, None]
    h = bias.shape[-1]
    return [pl.BlockSpec((None, None, h), lambda i, b_, n_, c=c: (c, n_, 0)) for c in (0, 2)]


def bias_args(bias, dtype):
    """The q and v bias operands: the bias rounded to the activations' dtype first, as the layer's XLA add rounds it."""
    return (None, None) if bias is None else (bias.astype(dtype),) * 2
