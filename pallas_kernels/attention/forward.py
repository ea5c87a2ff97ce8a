"""The Triton flash-attention forward (FlashAttention-2, Dao 2023, Alg. 1) with the key mask, dropout and the folded
Q/K/V bias: the context and the fp32 base-2 logsumexp, one program per (query block, b, n).

Layout BSNH end to end: q and o blocks are (block_q, H) slices of (B, S, N, H) arrays and k, v blocks (T, H) slices of
(B, T, N, H), with B and N squeezed by the BlockSpecs, so the wrapper never transposes. The probabilities are cast to
v's dtype for the P@V product, as flash attention usually does. Tile math: `tiles.py`.
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from .._pallas import compiler_params
from . import tiles
from .blocks import Blocks


def _fwd_kernel(q_ref, k_ref, v_ref, qb_ref, vb_ref, code_ref, qcode_ref, span_ref, seed_ref, o_ref, lse_ref, *,
                scale, block_k, heads, s_len, rate):
    # q_ref (block_q, H); k_ref, v_ref (T, H); qb_ref, vb_ref (H,) q and v biases or None; code_ref (T,); with
    # segments qcode_ref (block_q,) the query rows' codes and span_ref (2,) the key blocks to visit, else None;
    # o_ref (block_q, H); lse_ref (block_q,)
    block_q, h = q_ref.shape
    t_len = k_ref.shape[0]
    q_start = pl.program_id(0) * block_q
    drop = tiles.dropout_base(seed_ref, heads=heads, s_len=s_len)
    qk_scale = scale * tiles.LOG2E
    q = tiles.biased(q_ref[...], qb_ref)
    qcode = None if qcode_ref is None else qcode_ref[...]
    kept_sum = vb_ref is not None and seed_ref is not None  # v's bias needs rowsum(P * keep): l only without dropout

    def body(j, carry):  # online softmax over key blocks (FlashAttention-2 Alg. 1), unnormalised accumulator
        acc, m, l, ld = carry
        k_start = pl.multiple_of(j * block_k, block_k)
        kv = pl.ds(k_start, block_k)
        s = tiles.scores(q, k_ref[kv, :], code_ref[kv], qk_scale, qcode)
        m_new = jnp.maximum(m, jnp.max(s, axis=1))
        alpha = jnp.exp2(m - m_new)  # rescales the old sums; 0 on the first step (m = -inf)
        p = jnp.exp2(s - m_new[:, None])
        l = alpha * l + jnp.sum(p, axis=1)  # the normaliser sums the probabilities before dropout
        keep = tiles.keep(drop, q_start, k_start, block_q, block_k, t_len=t_len, rate=rate)
        if keep is not None:  # dropout is linear, so it may drop unnormalised terms; 1/(1-rate) comes at the end
            p = jnp.where(keep, p, 0.0)
        if kept_sum:
            ld = alpha * ld + jnp.sum(p, axis=1)
        v = v_ref[kv, :]
        return alpha[:, None] * acc + pltriton.dot(p.astype(v.dtype), v), m_new, l, ld

    zeros = jnp.zeros((block_q,), jnp.float32)
    init = (jnp.zeros((block_q, h), jnp.float32), jnp.full((block_q,), -jnp.inf, jnp.float32), zeros, zeros)
    first, end = tiles.block_span(span_ref, t_len // block_k)  # the other key blocks are masked for these rows
    acc, m, l, ld = lax.fori_loop(first, end, body, init)
    if vb_ref is not None:  # sum_t p_t keep_t (v_t + bv) = acc + (kept row sum) bv
        acc = acc + (ld if kept_sum else l)[:, None] * vb_ref[...].astype(jnp.float32)[None, :]
    inv = (1.0 / (1.0 - rate)) / l if seed_ref is not None else 1.0 / l
    o_ref[...] = (acc * inv[:, None]).astype(o_ref.dtype)
    lse_ref[...] = m + jnp.log2(l)


def forward(q, k, v, code, seed, *, rate: float, blocks: Blocks, interpret: bool, heads: int | None = None,
            packed: bool = False, bias=None, segments: bool = False):
    """Context (B, S, N, H) in q's dtype and the fp32 base-2 logsumexp (B, N, S).

    `code` from `mask_code`; `seed` from `seed_words`, or None for no dropout (the kernel then has no dropout code).
    `heads`: the total head count of the dropout index when q holds a tensor-parallel shard of them (default N).
    `packed`: q, k and v are the same (B, S, 3, N, H) array (C = q, k, v), read in place (no slices).
    `bias`: None, or the (3, N, H) Q/K/V projection bias, applied inside the kernels (AIB fused; `tiles.py` says
    how: only tiles loaded once per program get it added).
    `segments`: `code` is `mask_code(segment_ids, segments=True)` of packed rows (S = T), read for the query rows too;
    each query block visits only the key blocks its samples span (`tiles.segment_blocks`).
    """
    b, s, n, h, t = tiles.shapes(q, k, packed)
    heads = n if heads is None else heads
    bq = blocks.block_q
    spans = tiles.segment_blocks(code, bq, blocks.block_k)[0] if segments else None
    out_block = pl.BlockSpec((None, bq, None, h), lambda i, b_, n_: (b_, i, n_, 0))
    return pl.pallas_call(
        functools.partial(_fwd_kernel, scale=h**-0.5, block_k=blocks.block_k, heads=heads, s_len=s, rate=rate),
        grid=(s // bq, b, n),
        in_specs=[tiles.qkv_spec(packed, 0, bq, h, lambda i: i), tiles.qkv_spec(packed, 1, t, h, lambda i: 0),
                  tiles.qkv_spec(packed, 2, t, h, lambda i: 0), *tiles.bias_specs(bias),
                  pl.BlockSpec((None, t), lambda i, b_, n_: (b_, 0)), tiles.qcode_spec(segments, bq, lambda i: i),
                  tiles.span_spec(segments, lambda i: i), tiles.seed_spec(seed)],
        out_specs=[out_block, pl.BlockSpec((None, None, bq), lambda i, b_, n_: (b_, n_, i))],
        out_shape=[jax.ShapeDtypeStruct((b, s, n, h), q.dtype), jax.ShapeDtypeStruct((b, n, s), jnp.float32)],
        compiler_params=compiler_params(blocks.num_warps, blocks.num_stages),
        interpret=interpret, name="flash_attention_fwd",
    )(q, k, v, *tiles.bias_args(bias, q.dtype), code, code if segments else None, spans, seed)
