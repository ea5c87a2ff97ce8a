"""The Triton flash-attention backward (FlashAttention-2, Dao 2023, Alg. 2): dQ, dK, dV (or the packed dQKV) and,
with `bias_grad`, the Q/K/V bias gradient, in one of three forms (`Blocks`):

- the pair: a dQ kernel (one program per query block, looping over key blocks; it also forms delta = rowsum(dO * O)
  of its rows), then a dK/dV kernel (one per key block, looping over query blocks);
- the pair with `store_ds` (the default for the key-major pair, T > 128): the dK/dV kernel first (delta from XLA),
  storing dS, then a dQ = dS K kernel;
- `fused_bwd` (the default at T <= 128): one kernel per (b, n) holding all T keys, which forms each query block's
  probabilities once for dV, dK and dQ together.

With `key_major` the tiles are (keys, queries), so dK and dV accumulate with the key block as the product's rows. The
dropout mask is regenerated from the seed. Tile math: `tiles.py`.
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


def _dkdv_kernel(q_ref, k_ref, v_ref, qb_ref, vb_ref, code_ref, qcode_ref, span_ref, seed_ref, do_ref, lse_ref,
                 delta_ref, *out_refs, scale, block_q, heads, t_len, rate, key_major=False, bias_grad=False,
                 aliased=False, store_ds=False):
    # q_ref, do_ref (S, H); lse_ref, delta_ref (S,); k_ref, v_ref (block_k, H); code_ref (block_k,); with segments
    # qcode_ref (S,) the query rows' codes and span_ref (2,) the query blocks to visit, else None; biases as forward;
    # out_refs: dk_ref, dv_ref (block_k, H), or one (block_k, 3, H) block of the packed dQKV, whose C = 1, 2 rows are
    # written here (`aliased`: the dQ kernel's dQKV, passed first as an unread input); then with bias_grad a (3, H)
    # block for this key block's shares of the Q/K/V bias gradient (`_pair_dbias`); last with store_ds this key block's dS, (block_k, S) key-major or
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
    drop = tiles.dropout_base(seed_ref, heads=heads, s_len=s_len)
    k, v, code = k_ref[...], tiles.biased(v_ref[...], vb_ref), code_ref[...]
    kb = tiles.bias_dot(k, qb_ref)  # q's bias: bq.k_t added to every score of key t

    def body(i, carry):  # dV = sum_i Pd_i^T dO_i, dK = sum_i dS_i^T Q_i over query blocks
        dk, dv, ds_sum = carry
        q_start = pl.multiple_of(i * block_q, block_q)
        rows = pl.ds(q_start, block_q)
        q, do = q_ref[rows, :], do_ref[rows, :]
        keep = tiles.keep(drop, q_start, k_start, block_q, block_k, t_len=t_len, rate=rate, key_major=key_major)
        pd, ds = tiles.grad_tile(q, k, v, do, code, lse_ref[rows], delta_ref[rows], keep,
                                 qk_scale=scale * tiles.LOG2E, rate=rate, key_major=key_major, kb=kb,
                                 qcode=None if qcode_ref is None else qcode_ref[rows])
        if kb is not None or bias_grad:
            ds_sum = ds_sum + jnp.sum(ds, axis=1 if key_major else 0)
        if ds_ref is not None:  # rounded as the dK product (and the dQ kernel's) takes it
            if key_major:
                ds_ref[:, rows] = ds.astype(ds_ref.dtype)
            else:
                ds_ref[rows, :] = ds.astype(ds_ref.dtype)
        return *tiles.accumulate_dkdv(dk, dv, pd, ds, q, do, key_major=key_major), ds_sum

    zeros = jnp.zeros((block_k, h), jnp.float32)
    n_blocks = s_len // block_q
    first, end = tiles.block_span(span_ref, n_blocks)  # the other query blocks have no kept score with these keys
    dk, dv, ds_sum = lax.fori_loop(first, end, body, (zeros, zeros, jnp.zeros((block_k,), jnp.float32)))
    if ds_ref is not None and span_ref is not None:  # the skipped tiles' dS is 0 for the dQ = dS K kernel
        def zero(i, carry):
            rows = pl.ds(pl.multiple_of(i * block_q, block_q), block_q)
            if key_major:
                ds_ref[:, rows] = jnp.zeros((block_k, block_q), ds_ref.dtype)
            else:
                ds_ref[rows, :] = jnp.zeros((block_q, block_k), ds_ref.dtype)
            return carry

        lax.fori_loop(0, first, zero, 0)
        lax.fori_loop(end, n_blocks, zero, 0)
    dk, dv = tiles.store_dkdv(out_refs, tiles.dk_with_bias(dk, ds_sum, qb_ref) * scale, dv)  # d(q.k * scale)/dk = scale * q
    if sum_ref is not None:
        # q's share: sum_s dQ_s = scale * sum_t colsum_t(dS) k_t, from the fp32 dS of this kernel. Summing the dQ
        # kernel's output instead carries the rounding of the dS it reads (bf16 with `store_ds`) into a quantity with
        # heavy cancellation (the rows of dS sum to 0): 2.4% off at S=512 against 0.8% for a bf16 reference.
        sum_ref[0, :] = scale * jnp.sum(ds_sum[:, None] * k.astype(jnp.float32), axis=0)
        sum_ref[1, :] = tiles.colsum(dk)
        sum_ref[2, :] = tiles.colsum(dv)


def _dq_kernel(q_ref, k_ref, v_ref, qb_ref, vb_ref, code_ref, qcode_ref, span_ref, seed_ref, do_ref, lse_ref, o_ref,
               dq_ref, delta_ref, *, scale, block_k, heads, s_len, rate):
    # q_ref, do_ref, o_ref, dq_ref (block_q, H) (dq_ref: the C = 0 block of the packed dQKV when packed); lse_ref,
    # delta_ref (block_q,); k_ref, v_ref (T, H); code_ref (T,); qcode_ref (block_q,) and span_ref (2,) (the key
    # blocks to visit) with segments, else None.
    # Runs before the dK/dV kernel: it forms delta = rowsum(dO * O) of its rows (read once here, not by a separate
    # XLA pass) and writes it for that kernel.
    block_q, h = q_ref.shape
    t_len = k_ref.shape[0]
    q_start = pl.program_id(0) * block_q
    drop = tiles.dropout_base(seed_ref, heads=heads, s_len=s_len)
    q, do, lse = tiles.biased(q_ref[...], qb_ref), do_ref[...], lse_ref[...]
    qcode = None if qcode_ref is None else qcode_ref[...]
    delta = jnp.sum(o_ref[...].astype(jnp.float32) * do.astype(jnp.float32), axis=1)
    delta_ref[...] = delta
    cq = tiles.bias_dot(do, vb_ref)  # v's bias: dO_s.bv added to every dP of query s

    def body(j, dq):  # dQ = sum_j dS_j K_j over key blocks
        k_start = pl.multiple_of(j * block_k, block_k)
        kv = pl.ds(k_start, block_k)
        k = k_ref[kv, :]
        keep = tiles.keep(drop, q_start, k_start, block_q, block_k, t_len=t_len, rate=rate)
        _, ds = tiles.grad_tile(q, k, v_ref[kv, :], do, code_ref[kv], lse, delta, keep,
                                qk_scale=scale * tiles.LOG2E, rate=rate, cq=cq, qcode=qcode)
        return dq + pltriton.dot(ds.astype(k.dtype), k)

    first, end = tiles.block_span(span_ref, t_len // block_k)
    dq_ref[...] = (lax.fori_loop(first, end, body, jnp.zeros((block_q, h), jnp.float32)) * scale).astype(dq_ref.dtype)


def _dq_from_ds_kernel(ds_ref, k_ref, *refs, scale, block_k, key_major, aliased):
    # ds_ref: this query block's dS as the dK/dV kernel stored it, (T, block_q) key-major or (block_q, T); k_ref (T, H);
    # refs: (the packed dQKV as an aliased input, unread, if `aliased`), dq_ref (block_q, H). dQ = dS K: no scores,
    # mask or probabilities here (`Blocks.store_ds`).
    dq_ref = refs[-1]
    t_len, h = k_ref.shape

    def body(j, dq):
        kv = pl.ds(pl.multiple_of(j * block_k, block_k), block_k)
        ds = ds_ref[kv, :] if key_major else ds_ref[:, kv]
        return dq + pltriton.dot(ds, k_ref[kv, :], trans_a=key_major)

    zeros = jnp.zeros((dq_ref.shape[0], h), jnp.float32)
    dq_ref[...] = (lax.fori_loop(0, t_len // block_k, body, zeros) * scale).astype(dq_ref.dtype)


def _bwd_fused_kernel(q_ref, k_ref, v_ref, qb_ref, vb_ref, code_ref, qcode_ref, span_ref, seed_ref, do_ref, lse_ref,
                      o_ref,
                      *out_refs, scale, block_q, heads, rate, key_major=False, bias_grad=False):
    # One program per (b, n) with all T keys: q_ref, do_ref, o_ref (S, H); lse_ref (S,); k_ref, v_ref (T, H);
    # code_ref (T,); qcode_ref (S,) with segments, else None; out_refs: dq_ref (S, H), dk_ref, dv_ref (T, H), or one (S, 3, H) block of the packed dQKV; with
    # bias_grad last a (3, H) block for the column sums of dQ, dK, dV.
    # Each query block's probabilities (and dropout mask) are computed once, for dV, dK and dQ together; delta =
    # rowsum(dO * O) is formed here too. dQ rows are final after their step (all keys seen) and stored at once.
    t_len, h = k_ref.shape
    s_len = q_ref.shape[0]
    sum_ref = None
    if bias_grad:
        *out_refs, sum_ref = out_refs
    packed = len(out_refs) == 1
    drop = tiles.dropout_base(seed_ref, heads=heads, s_len=s_len)
    k, v, code = k_ref[...], tiles.biased(v_ref[...], vb_ref), code_ref[...]
    kb = tiles.bias_dot(k, qb_ref)  # q's bias, as in the dK/dV kernel

    def body(i, carry):
        dk, dv, ds_sum, dq_sum = carry
        q_start = pl.multiple_of(i * block_q, block_q)
        rows = pl.ds(q_start, block_q)
        q, do = q_ref[rows, :], do_ref[rows, :]
        delta = jnp.sum(o_ref[rows, :].astype(jnp.float32) * do.astype(jnp.float32), axis=1)
        keep = tiles.keep(drop, q_start, 0, block_q, t_len, t_len=t_len, rate=rate, key_major=key_major)
        pd, ds = tiles.grad_tile(q, k, v, do, code, lse_ref[rows], delta, keep, qk_scale=scale * tiles.LOG2E,
                                 rate=rate, key_major=key_major, kb=kb,
                                 qcode=None if qcode_ref is None else qcode_ref[rows])
        if kb is not None:
            ds_sum = ds_sum + jnp.sum(ds, axis=1 if key_major else 0)
        ds = ds.astype(k.dtype)
        # The order below (dQ product, dV, dK, then the dQ store) is the one verified on the GPU. Issuing the dQ store
        # before the dK/dV products and dK before dV (same math; interpret mode passes) gave a wrong dV, differently
        # from one run to the next, compiled by Triton 3.6 on an H200 with key-major tiles: keep it.
        dq = pltriton.dot(ds, k, trans_a=key_major)
        dv = dv + pltriton.dot(pd.astype(do.dtype), do, trans_a=not key_major)
        dk = dk + pltriton.dot(ds, q, trans_a=not key_major)
        dq = (dq * scale).astype(out_refs[0].dtype)
        if packed:
            out_refs[0][rows, 0, :] = dq
        else:
            out_refs[0][rows, :] = dq
        if sum_ref is not None:
            dq_sum = dq_sum + tiles.colsum(dq)
        return dk, dv, ds_sum, dq_sum

    zeros = jnp.zeros((t_len, h), jnp.float32)
    init = (zeros, zeros, jnp.zeros((t_len,), jnp.float32), jnp.zeros((h,), jnp.float32))
    dk, dv, ds_sum, dq_sum = lax.fori_loop(0, s_len // block_q, body, init)
    dk, dv = tiles.store_dkdv(out_refs if packed else out_refs[1:], tiles.dk_with_bias(dk, ds_sum, qb_ref) * scale, dv)
    if sum_ref is not None:
        sum_ref[0, :] = dq_sum
        sum_ref[1, :] = tiles.colsum(dk)
        sum_ref[2, :] = tiles.colsum(dv)



def _ds_shape(blocks: Blocks, b: int, n: int, s: int, t: int):
    """The stored dS (`Blocks.store_ds`) in q's dtype: (B, N, T, S) with key-major tiles (as the dK/dV kernel
    forms them), else (B, N, S, T)."""
    return (b, n, t, s) if blocks.key_major else (b, n, s, t)


def _ds_spec(blocks: Blocks, keys: int, queries: int, key_block, query_block):
    """BlockSpec of a (keys x queries) block of the stored dS (laid out as `_ds_shape`); grid (i, b, n), with the
    key and query block indices `key_block(i)`, `query_block(i)`."""
    if blocks.key_major:
        return pl.BlockSpec((None, None, keys, queries), lambda i, b_, n_: (b_, n_, key_block(i), query_block(i)))
    return pl.BlockSpec((None, None, queries, keys), lambda i, b_, n_: (b_, n_, query_block(i), key_block(i)))


def backward(q, k, v, code, seed, o, lse, do, *, rate: float, blocks: Blocks, interpret: bool,
             heads: int | None = None, packed: bool = False, bias=None, bias_grad: bool = False,
             segments: bool = False):
    """(dq, dk, dv) in the dtypes of (q, k, v); `heads` and `bias` as in `forward`. `packed` (q, k, v one
    (B, S, 3, N, H) array): the packed dQKV (B, S, 3, N, H), written in place by both kernels (no concatenation).
    `bias_grad`: ((those), dbias) with dbias (3, N, H) in fp32, the sums of dQ, dK, dV over B and S (the gradient of
    a Q/K/V bias added before attention, folded or not): each program sums the columns of the tiles it stores (the
    pair: dK and dV, and q's part from its fp32 dS), and XLA adds those per-program sums, so dQKV is not read again. `segments`: as in `forward`."""
    b, s, n, h, t = tiles.shapes(q, k, packed)
    heads = n if heads is None else heads
    if blocks.fused_bwd:
        return _backward_fused(q, k, v, code, seed, o, lse, do, rate=rate, blocks=blocks, interpret=interpret,
                               heads=heads, packed=packed, bias=bias, bias_grad=bias_grad, segments=segments)
    if blocks.store_ds:
        return _backward_stored_ds(q, k, v, code, seed, o, lse, do, rate=rate, blocks=blocks, interpret=interpret,
                                   heads=heads, packed=packed, bias=bias, bias_grad=bias_grad, segments=segments)
    # dQ first: it also forms delta = rowsum(dO * O) (B, N, S) in fp32, which the dK/dV kernel reads in full.
    bq = blocks.block_q_dq
    spans = tiles.segment_blocks(code, bq, blocks.block_k_dq)[0] if segments else None
    row_block = pl.BlockSpec((None, bq, None, h), lambda i, b_, n_: (b_, i, n_, 0))
    stat_block = pl.BlockSpec((None, None, bq), lambda i, b_, n_: (b_, n_, i))
    dq, delta = pl.pallas_call(
        functools.partial(_dq_kernel, scale=h**-0.5, block_k=blocks.block_k_dq, heads=heads, s_len=s, rate=rate),
        grid=(s // bq, b, n),
        in_specs=[tiles.qkv_spec(packed, 0, bq, h, lambda i: i), tiles.qkv_spec(packed, 1, t, h, lambda i: 0),
                  tiles.qkv_spec(packed, 2, t, h, lambda i: 0), *tiles.bias_specs(bias),
                  pl.BlockSpec((None, t), lambda i, b_, n_: (b_, 0)), tiles.qcode_spec(segments, bq, lambda i: i),
                  tiles.span_spec(segments, lambda i: i), tiles.seed_spec(seed), row_block, stat_block, row_block],
        # packed: the C = 0 blocks of a new (B, S, 3, N, H) dQKV, whose C = 1, 2 rows the dK/dV kernel writes
        out_specs=[tiles.qkv_spec(packed, 0, bq, h, lambda i: i), stat_block],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((b, n, s), jnp.float32)],
        compiler_params=compiler_params(blocks.num_warps_dq or blocks.num_warps_bwd,
                                        blocks.num_stages_dq or blocks.num_stages_bwd),
        interpret=interpret, name="flash_attention_dq",
    )(q, k, v, *tiles.bias_args(bias, q.dtype), code, code if segments else None, spans, seed, do, lse, o)
    dkdv, dkdv_sums, _ = _dkdv_call(q, k, v, code, seed, do, lse, delta, rate=rate, blocks=blocks,
                                    interpret=interpret, heads=heads, packed=packed, bias=bias, bias_grad=bias_grad,
                                    dqkv=dq if packed else None, segments=segments)
    grads = dkdv[0] if packed else (dq, *dkdv)
    return (grads, _pair_dbias(dkdv_sums)) if bias_grad else grads


def _pair_dbias(dkdv_sums):
    """(3, N, H) bias gradient from the dK/dV kernel's per-program shares (T/bk, B, N, 3, H): q's from the fp32 dS,
    the column sums of dK and dV as stored."""
    return jnp.sum(dkdv_sums, axis=(0, 1)).swapaxes(0, 1)


def _dkdv_call(q, k, v, code, seed, do, lse, delta, *, rate, blocks, interpret, heads, packed, bias, bias_grad,
               dqkv=None, segments=False):
    """The dK/dV kernel: ((dk, dv) or (packed dQKV,), per-program column sums or None, dS or None). Packed, it
    writes C = 1, 2 of `dqkv` in place (aliased; the dQ kernel's) or, without one, of a new (B, S, 3, N, H) array
    whose C = 0 the dQ kernel fills. With `blocks.store_ds` it also stores dS (`_ds_shape`)."""
    b, s, n, h, t = tiles.shapes(q, k, packed)
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
    if bias_grad:  # each program's shares of the Q/K/V bias gradient
        out_specs = out_specs + [pl.BlockSpec((None, None, None, 3, h), lambda j, b_, n_: (j, b_, n_, 0, 0))]
        out_shapes = out_shapes + [jax.ShapeDtypeStruct((t // bk, b, n, 3, h), jnp.float32)]
    store_ds = blocks.store_ds
    if store_ds:  # this key block's dS for every query
        out_specs = out_specs + [_ds_spec(blocks, bk, s, lambda j: j, lambda j: 0)]
        out_shapes = out_shapes + [jax.ShapeDtypeStruct(_ds_shape(blocks, b, n, s, t), q.dtype)]
    aliased = dqkv is not None
    spans = tiles.segment_blocks(code, blocks.block_q_dkv, bk)[1] if segments else None
    operands = [q, k, v, *tiles.bias_args(bias, q.dtype), code, code if segments else None, spans, seed, do, lse,
                delta]
    outs = pl.pallas_call(
        functools.partial(_dkdv_kernel, scale=h**-0.5, block_q=blocks.block_q_dkv, heads=heads, t_len=t, rate=rate,
                          key_major=blocks.key_major, bias_grad=bias_grad, aliased=aliased,
                          store_ds=store_ds),
        grid=(t // bk, b, n),
        in_specs=[tiles.qkv_spec(packed, 0, s, h, lambda j: 0), tiles.qkv_spec(packed, 1, bk, h, lambda j: j),
                  tiles.qkv_spec(packed, 2, bk, h, lambda j: j), *tiles.bias_specs(bias),
                  pl.BlockSpec((None, bk), lambda j, b_, n_: (b_, j)), tiles.qcode_spec(segments, s, lambda j: 0),
                  tiles.span_spec(segments, lambda j: j), tiles.seed_spec(seed), seq_full, stat_full, stat_full]
        + (out_specs[:1] if aliased else []),
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
                        bias_grad=False, segments=False):
    """`backward` with `Blocks.store_ds`: delta by XLA, the dK/dV kernel (storing dS), then dQ = dS K."""
    b, s, n, h, t = tiles.shapes(q, k, packed)
    delta = jnp.einsum("bsnh,bsnh->bns", o.astype(jnp.float32), do.astype(jnp.float32))
    dkdv, dkdv_sums, ds = _dkdv_call(q, k, v, code, seed, do, lse, delta, rate=rate, blocks=blocks,
                                     interpret=interpret, heads=heads, packed=packed, bias=bias,
                                     bias_grad=bias_grad, segments=segments)
    bq = blocks.block_q_dq
    dq_spec = tiles.qkv_spec(packed, 0, bq, h, lambda i: i)
    dq, = pl.pallas_call(
        functools.partial(_dq_from_ds_kernel, scale=h**-0.5, block_k=blocks.block_k_dq, key_major=blocks.key_major,
                          aliased=packed),
        grid=(s // bq, b, n),
        in_specs=[_ds_spec(blocks, t, bq, lambda i: 0, lambda i: i), tiles.qkv_spec(packed, 1, t, h, lambda i: 0)]
        + ([dq_spec] if packed else []),
        # packed: C = 0 of the dK/dV kernel's dQKV, written in place
        out_specs=[dq_spec],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype)],
        input_output_aliases={2: 0} if packed else {},
        compiler_params=compiler_params(blocks.num_warps_dq or blocks.num_warps_bwd,
                                        blocks.num_stages_dq or blocks.num_stages_bwd),
        interpret=interpret, name="flash_attention_dq_from_ds",
    )(ds, k, *([dkdv[0]] if packed else []))
    grads = dq if packed else (dq, *dkdv)
    return (grads, _pair_dbias(dkdv_sums)) if bias_grad else grads


def _backward_fused(q, k, v, code, seed, o, lse, do, *, rate, blocks, interpret, heads, packed, bias=None,
                    bias_grad=False, segments=False):
    """`backward` as one kernel per (b, n) (`Blocks.fused_bwd`): grid (1, B, N), every block spans S or T."""
    b, s, n, h, t = tiles.shapes(q, k, packed)
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
        in_specs=[tiles.qkv_spec(packed, 0, s, h, lambda j: 0), tiles.qkv_spec(packed, 1, t, h, lambda j: 0),
                  tiles.qkv_spec(packed, 2, t, h, lambda j: 0), *tiles.bias_specs(bias),
                  pl.BlockSpec((None, t), lambda j, b_, n_: (b_, 0)), tiles.qcode_spec(segments, s, lambda j: 0),
                  None, tiles.seed_spec(seed), seq_full, pl.BlockSpec((None, None, s), lambda j, b_, n_: (b_, n_, 0)),
                  seq_full],
        out_specs=out_specs, out_shape=out_shapes,
        compiler_params=compiler_params(blocks.num_warps_fused, blocks.num_stages_bwd),
        interpret=interpret, name="flash_attention_bwd_fused",
    )(q, k, v, *tiles.bias_args(bias, q.dtype), code, code if segments else None, None, seed, do, lse, o)
    if bias_grad:
        *grads, sums = grads
    grads = grads[0] if packed else tuple(grads)
    return (grads, jnp.sum(sums, axis=0).swapaxes(0, 1)) if bias_grad else grads
