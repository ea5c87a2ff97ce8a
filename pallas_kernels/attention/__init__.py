"""Multi-head self-attention core: softmax(QK^T/sqrt(H), padding mask) with dropout, times V.

`attention` is the unfused reference (it materialises the BNST scores); `flash_attention` is the fused
FlashAttention-2 forward and backward kernels (Pallas, Triton-lowered) with the same mask and dropout semantics.
"""

import functools

import jax
import jax.numpy as jnp

from .. import autotune
from .._pallas import resolve_interpret, seed_words
from ..mesh import batch_shard_map
from ..softmax import scaled_masked_softmax
from . import kernel
from .kernel import BlockSizes, default_block_sizes
from .reference import attention

__all__ = ["BlockSizes", "attention", "default_block_sizes", "flash_attention", "flash_attention_qkv",
           "sharded_flash_attention", "sharded_flash_attention_qkv", "unfused_attention"]


def unfused_attention(q, k, v, mask, *, seed=None, rate: float = 0.0):
    """The reference's two einsums around the fused Pallas softmax + dropout kernel (SM forward, BS backward).

    Not on the default path: measured slower than flash attention and than XLA's own softmax fusion
    (benchmarks/results/kernels-h200.md)."""
    scores = jnp.einsum("BSNH,BTNH->BNST", q, k)
    probs = scaled_masked_softmax(scores, mask, scale=q.shape[-1] ** -0.5, seed=seed, rate=rate)
    return jnp.einsum("BNST,BTNH->BSNH", probs, v)


def sharded_flash_attention(q, k, v, mask, *, seed=None, rate: float = 0.0, interpret: bool | None = None,
                            block_sizes: BlockSizes | None = None):
    """`flash_attention` run per batch shard when a mesh with batch axes is set (`jax.set_mesh`), else directly;
    with a `tensor` axis the heads (N of BSNH) are split over it too, instead of gathered.

    Each shard passes its first example's index as `batch_offset` and its first head's as `head_offset` (with the
    total head count), so the dropout masks are the unsharded ones.
    """
    heads = q.shape[2]

    def run(offset, head_offset, q, k, v, mask, seed):
        return flash_attention(q, k, v, mask, seed=seed, rate=rate, interpret=interpret, block_sizes=block_sizes,
                               batch_offset=offset, head_offset=head_offset, total_heads=heads)

    return batch_shard_map(run, n_batched=4, head_dims=(2, 2, 2, None), out_head_dim=2)(q, k, v, mask, seed)


def sharded_flash_attention_qkv(qkv, mask, *, bias=None, seed=None, rate: float = 0.0,
                                interpret: bool | None = None, block_sizes: BlockSizes | None = None):
    """`flash_attention_qkv` per batch shard (and head shard over `tensor`), as `sharded_flash_attention`; the bias
    (3, N, H) is replicated over the batch shards (its gradient summed over them) and split with the heads."""
    heads = qkv.shape[3]

    def run(offset, head_offset, qkv, mask, bias, seed):
        return flash_attention_qkv(qkv, mask, bias=bias, seed=seed, rate=rate, interpret=interpret,
                                   block_sizes=block_sizes, batch_offset=offset, head_offset=head_offset,
                                   total_heads=heads)

    return batch_shard_map(run, n_batched=2, head_dims=(3, None, 1, None), out_head_dim=2)(qkv, mask, bias, seed)


def flash_attention_qkv(qkv, mask, *, bias=None, seed=None, rate: float = 0.0, interpret: bool | None = None,
                        block_sizes: BlockSizes | None = None, batch_offset=0, head_offset=0,
                        total_heads: int | None = None):
    """`flash_attention` of the packed projection qkv (B, S, 3, N, H) (C = q, k, v): context (B, S, N, H).

    The kernels read q, k and v in place and the backward writes one packed dQKV (B, S, 3, N, H), so the fused QKV
    projection's [B*S, 3*N*H] GEMM output and its gradient need no slices, concatenation or transposes around the
    kernels (they cost 88 us per BERT-large layer at B64 S128 with separate q, k, v: kernels-h200.md, session 6).
    `bias` (3, N, H), optional: the projection's bias; the result is `attention_qkv(qkv + bias)`. With
    `block_sizes.fold_bias` (the default where the backward is one kernel) the kernels apply it themselves, so the
    projection's output is never rewritten with it (AIB fused): the forward rounds at most q + bq to qkv's dtype (k's
    and v's biases enter by exact identities: kernel.py's shared tile math), the one-kernel backwards also v + bv
    (and the Mosaic GPU one q + bq, where Triton's uses an identity); else XLA adds it before them, the sum rounded in
    qkv's dtype (`_add_bias`).
    Differentiable: its gradient is dQKV summed over B and S (in fp32, by the backward kernels as they store dQKV).
    Same mask, dropout and other arguments as `flash_attention`.
    """
    if qkv.ndim != 5 or qkv.shape[2] != 3:
        raise ValueError(f"qkv must be (B, S, 3, N, H); got {qkv.shape=}")
    b, s, _, n, h = qkv.shape
    if bias is not None and tuple(bias.shape) != (3, n, h):
        raise ValueError(f"bias must be (3, N, H) = {(3, n, h)} for {qkv.shape=}; got {bias.shape=}")
    q = jax.ShapeDtypeStruct((b, s, n, h), qkv.dtype)  # only shapes are checked
    blocks, seed, rate, interpret = _prepare(q, q, q, mask, seed, rate, interpret, block_sizes, batch_offset,
                                             head_offset, packed=True)
    heads = n if total_heads is None else int(total_heads)
    if bias is None:
        return _flash_qkv(qkv, kernel.mask_code(mask), seed, rate, interpret, blocks, heads)
    return _flash_qkv_bias(qkv, bias, kernel.mask_code(mask), seed, rate, interpret, blocks, heads)


def _add_bias(qkv, bias):
    """qkv + bias (3, N, H), the bias rounded to qkv's dtype and the sum rounded once, as the folding kernels apply
    q's (XLA's add where the kernels do not fold the bias: `BlockSizes.fold_bias`).

    Written as the add of a (3*N*H,) row to the projection GEMM's 2-D [B*S, 3*N*H] output, in qkv's dtype (XLA adds
    16-bit floats in float32 and rounds once; checked on the H200 in session 17, where the earlier float32 form,
    `(qkv.astype(f32) + bias.astype(qkv.dtype).astype(f32)).astype(qkv.dtype)`, added the bias unrounded: XLA's
    excess precision drops the convert pair): in that form XLA puts it into the GEMM's cuBLAS(Lt)
    bias epilogue when the GEMM is a cuBLAS call (`TrainConfig.xla_gemm="cublas"`), so the projection's output is not
    rewritten (the epilogue adds the bias to the float32 accumulator before the one rounding: not bit-equal to this
    form, a rounding closer to exact); on the 5-D shape, or in float32 around the rounded GEMM output, it stayed one
    XLA pass (31 us per BERT-large layer at B16 S512; benchmarks/results/train-h200.md, session 15)."""
    b, s, c, n, h = qkv.shape
    return (qkv.reshape(b * s, c * n * h) + bias.astype(qkv.dtype).reshape(c * n * h)).reshape(qkv.shape)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _flash_qkv(qkv, code, seed, rate, interpret, blocks, heads):
    return _flash_qkv_fwd(qkv, code, seed, rate, interpret, blocks, heads)[0]


def _flash_qkv_fwd(qkv, code, seed, rate, interpret, blocks, heads, bias=None):
    out, lse = kernel.forward(qkv, qkv, qkv, code, seed, rate=rate, blocks=blocks, interpret=interpret, heads=heads,
                              packed=True, bias=bias)
    return out, (qkv, code, seed, out, lse)


def _flash_qkv_bwd(rate, interpret, blocks, heads, res, do):
    qkv, code, seed, out, lse = res
    dqkv = kernel.backward(qkv, qkv, qkv, code, seed, out, lse, do, rate=rate, blocks=blocks, interpret=interpret,
                           heads=heads, packed=True)
    return dqkv, None, None


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _flash_qkv_bias(qkv, bias, code, seed, rate, interpret, blocks, heads):
    return _flash_qkv_bias_fwd(qkv, bias, code, seed, rate, interpret, blocks, heads)[0]


def _flash_qkv_bias_fwd(qkv, bias, code, seed, rate, interpret, blocks, heads):
    """The kernels apply the bias (`blocks.fold_bias`), or XLA adds it first (the residual is then the biased qkv)."""
    if blocks.fold_bias:
        out, res = _flash_qkv_fwd(qkv, code, seed, rate, interpret, blocks, heads, bias)
    else:
        out, res = _flash_qkv_fwd(_add_bias(qkv, bias), code, seed, rate, interpret, blocks, heads)
    return out, (res, bias)


def _flash_qkv_bias_bwd(rate, interpret, blocks, heads, res, do):
    """dQKV, and the bias gradient (dQKV summed over B and S in fp32) from the kernels' per-program column sums."""
    (qkv, code, seed, out, lse), bias = res
    dqkv, dbias = kernel.backward(qkv, qkv, qkv, code, seed, out, lse, do, rate=rate, blocks=blocks,
                                  interpret=interpret, heads=heads, packed=True,
                                  bias=bias if blocks.fold_bias else None, bias_grad=True)
    return dqkv, dbias.astype(bias.dtype), None, None


_flash_qkv.defvjp(_flash_qkv_fwd, _flash_qkv_bwd)
_flash_qkv_bias.defvjp(_flash_qkv_bias_fwd, _flash_qkv_bias_bwd)


def _prepare(q, k, v, mask, seed, rate, interpret, block_sizes, batch_offset, head_offset, packed=False):
    """Checked (blocks, seed words or None, rate, interpret) for the kernels, before anything compiles.

    Without `block_sizes`: the autotuner's cached (or, with JAXFORMER_AUTOTUNE=tune, newly tuned) choice for these
    shapes on this GPU, else `default_block_sizes` (`pallas_kernels.autotune`)."""
    rate = float(rate)
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"{rate=} must be in [0, 1)")
    interpret = resolve_interpret(interpret)
    if seed is not None and rate > 0.0 and jnp.shape(seed) != (2,):
        raise ValueError(f"seed must be uint32[2]; got shape {jnp.shape(seed)}")
    if seed is None or rate == 0.0:  # static: the kernels are built without any dropout code
        seed, rate = None, 0.0
    if block_sizes is None:
        block_sizes = default_block_sizes(q.shape[1], q.shape[-1], k.shape[1], q.dtype)
        kernel.check_inputs(q, k, v, mask, block_sizes)  # bad shapes fail here, before any tuning
        block_sizes = _tuned(block_sizes, q, k, rate, packed, interpret)
    kernel.check_inputs(q, k, v, mask, block_sizes)
    if seed is None:
        return block_sizes, None, 0.0, bool(interpret)
    return block_sizes, seed_words(seed, batch_offset, head_offset), rate, bool(interpret)


def _tuned(default, q, k, rate, packed, interpret):
    """`autotune.choose` for one flash attention call: forward tiles, then the backward's form and tiles, timed
    forward+backward on random inputs of q's and k's shapes with random key lengths in [T/2, T]."""
    b, s, n, h = q.shape
    t, dtype = k.shape[1], jnp.dtype(q.dtype)

    def make_bench():
        lengths = jax.random.randint(jax.random.key(1), (b, 1), t // 2, t + 1)
        mask_ = jnp.arange(t)[None, :] < lengths
        seed = jnp.array([1, 2], jnp.uint32) if rate else None
        if packed:
            like = [jax.ShapeDtypeStruct((b, s, 3, n, h), dtype)]
            fn = lambda blocks: lambda qkv: flash_attention_qkv(  # noqa: E731
                qkv, mask_, seed=seed, rate=rate, block_sizes=blocks)
        else:
            like = [jax.ShapeDtypeStruct(shape, dtype) for shape in [(b, s, n, h), (b, t, n, h), (b, t, n, h)]]
            fn = lambda blocks: lambda q, k, v: flash_attention(  # noqa: E731
                q, k, v, mask_, seed=seed, rate=rate, block_sizes=blocks)
        return autotune.fwd_bwd_bench(fn, autotune.random_inputs(like))

    fields = dict(b=b, s=s, t=t, n=n, h=h, dtype=dtype.name, dropout=bool(rate), packed=packed)
    stages = [lambda best: kernel.candidate_block_sizes(best, s, h, t, stage="fwd"),
              lambda best: kernel.candidate_block_sizes(best, s, h, t, stage="bwd")]
    return autotune.choose("flash_attention", fields, default, stages, make_bench, interpret=interpret)


def flash_attention(q, k, v, mask, *, seed=None, rate: float = 0.0, interpret: bool | None = None,
                    block_sizes: BlockSizes | None = None, batch_offset=0, head_offset=0,
                    total_heads: int | None = None):
    """Context (B, S, N, H) in q's dtype from q (B, S, N, H), k and v (B, T, N, H) and a key mask (B, T).

    Same result as `attention(q, k, v, mask, seed=seed, rate=rate)` (the same dropout mask, bit for bit) without
    materialising the scores. `mask` is True (or nonzero) at real keys; `seed` is uint32[2] (see
    `pallas_kernels.dropout.seed_from_key`); dropout runs only when `seed` is given and `rate > 0`.
    `interpret=None` interprets the kernels on a CPU backend and compiles them (Triton) elsewhere.
    H must be a power of two >= 16 and S, T multiples of the block sizes (`default_block_sizes(S, H, T)`).
    `batch_offset` (uint32, may be traced) is the index of q's first example in the whole batch: under a batch
    `shard_map` it makes each shard draw the reference's mask of the unsharded tensor. Likewise `head_offset` is the
    index of q's first head among `total_heads` (static; default q's N) when the heads are split (tensor parallel).
    Differentiable in q, k, v; mask and seed get no gradient.
    """
    blocks, seed, rate, interpret = _prepare(q, k, v, mask, seed, rate, interpret, block_sizes, batch_offset,
                                             head_offset)
    heads = q.shape[2] if total_heads is None else int(total_heads)
    return _flash(q, k, v, kernel.mask_code(mask), seed, rate, interpret, blocks, heads)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8))
def _flash(q, k, v, code, seed, rate, interpret, blocks, heads):
    out, _ = kernel.forward(q, k, v, code, seed, rate=rate, blocks=blocks, interpret=interpret, heads=heads)
    return out


def _flash_fwd(q, k, v, code, seed, rate, interpret, blocks, heads):
    out, lse = kernel.forward(q, k, v, code, seed, rate=rate, blocks=blocks, interpret=interpret, heads=heads)
    # Residuals: the inputs (views, no copies), the output and the fp32 logsumexp; the dropout mask is regenerated.
    return out, (q, k, v, code, seed, out, lse)


def _flash_bwd(rate, interpret, blocks, heads, res, do):
    q, k, v, code, seed, out, lse = res
    dq, dk, dv = kernel.backward(q, k, v, code, seed, out, lse, do, rate=rate, blocks=blocks, interpret=interpret,
                                 heads=heads)
    return dq, dk, dv, None, None  # the int mask code and the uint32 seed words have no cotangent


_flash.defvjp(_flash_fwd, _flash_bwd)
