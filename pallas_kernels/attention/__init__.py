"""Multi-head self-attention core: softmax(QK^T/sqrt(H), padding mask) with dropout, times V.

`flash_attention` (q, k, v apart) and `flash_attention_qkv` (the packed projection) run one of the implementations
in `impls.py`: the registry's choice for the call, or the one named by `impl=`; the `sharded_*` forms run them per
batch and head shard under a mesh. `attention` is the reference (it materialises the BNST scores);
`unfused_attention` the reference's einsums around the fused softmax kernel.
"""

import functools

import jax
import jax.numpy as jnp

from .. import autotune, registry
from .._pallas import resolve_interpret, seed_words
from ..mesh import batch_shard_map, current_mesh, shard_counts
from ..softmax import scaled_masked_softmax
from . import impls
from .blocks import Blocks, check_inputs, default_blocks
from .reference import attention, segment_mask
from .tiles import mask_code

__all__ = ["Blocks", "attention", "default_blocks", "flash_attention", "flash_attention_qkv", "segment_mask",
           "sharded_flash_attention", "sharded_flash_attention_qkv", "unfused_attention"]


def unfused_attention(q, k, v, mask, *, seed=None, rate: float = 0.0):
    """The reference's two einsums around the fused Pallas softmax + dropout kernel (SM forward, BS backward); a key
    mask only.

    Not on the default path: measured slower than flash attention and than XLA's own softmax fusion
    (benchmarks/results/kernels-h200.md, Softmax)."""
    scores = jnp.einsum("BSNH,BTNH->BNST", q, k)
    probs = scaled_masked_softmax(scores, mask, scale=q.shape[-1] ** -0.5, seed=seed, rate=rate)
    return jnp.einsum("BNST,BTNH->BSNH", probs, v)


def sharded_flash_attention(q, k, v, mask, *, seed=None, rate: float = 0.0, interpret: bool | None = None,
                            blocks: Blocks | None = None, impl: str | None = None, segments: bool = False):
    """`flash_attention` run per batch shard when a mesh with batch axes is set (`jax.set_mesh`), else directly;
    with a `tensor` axis the heads (N of BSNH) are split over it too, instead of gathered.

    The implementation is chosen once for the per-shard call. Each shard passes its first example's index as
    `batch_offset` and its first head's as `head_offset` (with the total head count), so the dropout masks are the
    unsharded ones."""
    heads = q.shape[2]
    check_inputs(q, k, v, mask, segments=segments)
    choice = _choose(q.shape, k.shape, q.dtype, seed, rate, interpret, blocks, impl, packed=False, sharded=True,
                     segments=segments)
    if not choice.impl.kernel:
        return choice.impl.fn(q, k, v, mask, seed=seed, rate=rate, segments=segments)

    def run(offset, head_offset, q, k, v, mask, seed):
        return flash_attention(q, k, v, mask, seed=seed, rate=rate, interpret=interpret, blocks=choice.config,
                               impl=choice.impl.name, batch_offset=offset, head_offset=head_offset, total_heads=heads,
                               segments=segments)

    return batch_shard_map(run, n_batched=4, head_dims=(2, 2, 2, None), out_head_dim=2)(q, k, v, mask, seed)


def sharded_flash_attention_qkv(qkv, mask, *, bias=None, seed=None, rate: float = 0.0,
                                interpret: bool | None = None, blocks: Blocks | None = None, impl: str | None = None,
                                segments: bool = False):
    """`flash_attention_qkv` per batch shard (and head shard over `tensor`), as `sharded_flash_attention`; the bias
    (3, N, H) is replicated over the batch shards (its gradient summed over them) and split with the heads."""
    _check_packed(qkv, bias, mask, segments)
    heads = qkv.shape[3]
    choice = _choose(qkv.shape, qkv.shape, qkv.dtype, seed, rate, interpret, blocks, impl, packed=True,
                     sharded=True, segments=segments)
    if not choice.impl.kernel:
        return choice.impl.fn(qkv, mask, bias=bias, seed=seed, rate=rate, segments=segments)

    def run(offset, head_offset, qkv, mask, bias, seed):
        return flash_attention_qkv(qkv, mask, bias=bias, seed=seed, rate=rate, interpret=interpret,
                                   blocks=choice.config, impl=choice.impl.name, batch_offset=offset,
                                   head_offset=head_offset, total_heads=heads, segments=segments)

    return batch_shard_map(run, n_batched=2, head_dims=(3, None, 1, None), out_head_dim=2)(qkv, mask, bias, seed)


def _check_packed(qkv, bias, mask, segments=False):
    if qkv.ndim != 5 or qkv.shape[2] != 3:
        raise ValueError(f"qkv must be (B, S, 3, N, H); got {qkv.shape=}")
    b, s, _, n, h = qkv.shape
    if bias is not None and tuple(bias.shape) != (3, n, h):
        raise ValueError(f"bias must be (3, N, H) = {(3, n, h)} for {qkv.shape=}; got {bias.shape=}")
    q = jax.ShapeDtypeStruct((b, s, n, h), qkv.dtype)  # only shapes are checked
    check_inputs(q, q, q, mask, segments=segments)


def flash_attention_qkv(qkv, mask, *, bias=None, seed=None, rate: float = 0.0, interpret: bool | None = None,
                        blocks: Blocks | None = None, impl: str | None = None, batch_offset=0, head_offset=0,
                        total_heads: int | None = None, segments: bool = False):
    """`flash_attention` of the packed projection qkv (B, S, 3, N, H) (C = q, k, v): context (B, S, N, H).

    The kernels read q, k and v in place and the backward writes one packed dQKV (B, S, 3, N, H), so the fused QKV
    projection's [B*S, 3*N*H] GEMM output and its gradient need no slices, concatenation or transposes around the
    kernels (88 us per BERT-large layer at B64 S128 with separate q, k, v: kernels-h200.md, Attention).
    `bias` (3, N, H), optional: the projection's bias; the result is `attention_qkv(qkv + bias)`. With
    `blocks.fold_bias` (the default where the backward is one kernel) the kernels apply it themselves, so the
    projection's output is never rewritten with it (AIB fused): the forward rounds at most q + bq to qkv's dtype (k's
    and v's biases enter by exact identities: `tiles.py`), the one-kernel backwards also v + bv (and the Mosaic GPU one
    q + bq, where Triton's uses an identity); else XLA adds it before them, the sum rounded in qkv's dtype
    (`_add_bias`).
    Differentiable: its gradient is dQKV summed over B and S (in fp32, by the backward kernels as they store dQKV).
    Same mask, dropout and other arguments as `flash_attention`.
    """
    _check_packed(qkv, bias, mask, segments)
    n = qkv.shape[3]
    choice = _choose(qkv.shape, qkv.shape, qkv.dtype, seed, rate, interpret, blocks, impl, packed=True,
                     segments=segments)
    rate, interpret = _rate(seed, rate), resolve_interpret(interpret)
    if not choice.impl.kernel:
        return choice.impl.fn(qkv, mask, bias=bias, seed=seed if rate else None, rate=rate, segments=segments)
    seed = seed_words(seed, batch_offset, head_offset) if rate else None
    heads = n if total_heads is None else int(total_heads)
    code = mask_code(mask, segments)
    if bias is None:
        return _flash_qkv(qkv, code, seed, rate, interpret, choice.impl, choice.config, heads, segments)
    return _flash_qkv_bias(qkv, bias, code, seed, rate, interpret, choice.impl, choice.config, heads, segments)


def flash_attention(q, k, v, mask, *, seed=None, rate: float = 0.0, interpret: bool | None = None,
                    blocks: Blocks | None = None, impl: str | None = None, batch_offset=0, head_offset=0,
                    total_heads: int | None = None, segments: bool = False):
    """Context (B, S, N, H) in q's dtype from q (B, S, N, H), k and v (B, T, N, H) and a key mask (B, T); with
    `segments`, packed rows: `mask` holds int segment ids (B, S) (1, 2, ... per sample, 0 at padding; T = S) and a
    query attends only the keys of its own sample (`segment_mask`; the padding is a segment of its own).

    Same result as `attention(q, k, v, mask, seed=seed, rate=rate)` (the same dropout mask, bit for bit) without
    materialising the scores. `mask` is True (or nonzero) at real keys; `seed` is uint32[2] (see
    `pallas_kernels.dropout.seed_from_key`); dropout runs only when `seed` is given and `rate > 0`.
    `impl` names an implementation (`impls.py`; default: the registry's choice); `blocks` its tile sizes (default:
    the autotuner's cached choice, else `default_blocks(S, H, T)`: H must be a power of two >= 16 and S, T multiples
    of the blocks). `interpret=None` interprets the kernels on a CPU backend and compiles them elsewhere.
    `batch_offset` (uint32, may be traced) is the index of q's first example in the whole batch: under a batch
    `shard_map` it makes each shard draw the reference's mask of the unsharded tensor. Likewise `head_offset` is the
    index of q's first head among `total_heads` (static; default q's N) when the heads are split (tensor parallel).
    Differentiable in q, k, v; mask and seed get no gradient.
    """
    check_inputs(q, k, v, mask, segments=segments)
    choice = _choose(q.shape, k.shape, q.dtype, seed, rate, interpret, blocks, impl, packed=False, segments=segments)
    rate, interpret = _rate(seed, rate), resolve_interpret(interpret)
    if not choice.impl.kernel:
        return choice.impl.fn(q, k, v, mask, seed=seed if rate else None, rate=rate, segments=segments)
    seed = seed_words(seed, batch_offset, head_offset) if rate else None
    heads = q.shape[2] if total_heads is None else int(total_heads)
    return _flash(q, k, v, mask_code(mask, segments), seed, rate, interpret, choice.impl, choice.config, heads,
                  segments)


def _rate(seed, rate) -> float:
    """The dropout rate the kernels run: 0 without a seed (static: the kernels are built without any dropout code)."""
    rate = float(rate)
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"{rate=} must be in [0, 1)")
    if seed is not None and rate > 0.0 and jnp.shape(seed) != (2,):
        raise ValueError(f"seed must be uint32[2]; got shape {jnp.shape(seed)}")
    return 0.0 if seed is None else rate


def _choose(q_shape, k_shape, dtype, seed, rate, interpret, blocks, impl, *, packed: bool,
            sharded: bool = False, segments: bool = False) -> registry.Choice:
    """The implementation and blocks for the call (per shard when `sharded`): the registry's choice, or the one
    named; without `blocks`, the autotuner's cached (or, with JAXFORMER_AUTOTUNE=tune, newly tuned) blocks."""
    rate, interpret = _rate(seed, rate), resolve_interpret(interpret)
    batch, tp = shard_counts(current_mesh() if sharded else None, heads=True)
    q_shape, k_shape = list(q_shape), list(k_shape)
    head_dim = 3 if packed else 2
    for shape in (q_shape, k_shape):
        shape[0], shape[head_dim] = shape[0] // batch, shape[head_dim] // tp
    call = impls.call_of(q_shape, k_shape, dtype, rate, packed, segments)
    op = "attention_qkv" if packed else "attention"
    device = registry.Device.current()
    choice = registry.choose(op, call, device, impl=impl, blocks=blocks, interpret=interpret)
    if not choice.impl.kernel:
        return choice
    _check_blocks(call, choice.config)  # bad shapes fail here, before any tuning
    if blocks is None:
        choice = autotune.tuned(op, call, device, choice, functools.partial(_bench_fn, call), _operands(call),
                                interpret=interpret, named=impl is not None)
        _check_blocks(call, choice.config)
    return choice


def _check_blocks(call, blocks):
    q = jax.ShapeDtypeStruct((call.batch, call.seq_q, call.heads, call.head_dim), call.dtype)
    k = jax.ShapeDtypeStruct((call.batch, call.seq_k, call.heads, call.head_dim), call.dtype)
    check_inputs(q, k, k, jax.ShapeDtypeStruct((call.batch, call.seq_k), bool), blocks)


def _operands(call):
    b, s, t, n, h = call.batch, call.seq_q, call.seq_k, call.heads, call.head_dim
    if call.packed:
        return [jax.ShapeDtypeStruct((b, s, 3, n, h), call.dtype)]
    return [jax.ShapeDtypeStruct(shape, call.dtype) for shape in [(b, s, n, h), (b, t, n, h), (b, t, n, h)]]


def _bench_fn(call, choice):
    """The operator with `choice` on the autotuner's random inputs, with random key lengths in [T/2, T] (with
    segments: that many real positions cut into samples at random)."""
    k1, k2 = jax.random.split(jax.random.key(1))
    lengths = jax.random.randint(k1, (call.batch, 1), call.seq_k // 2, call.seq_k + 1)
    mask = jnp.arange(call.seq_k)[None, :] < lengths
    if call.segments:
        starts = jax.random.bernoulli(k2, 4 / call.seq_k, (call.batch, call.seq_k)).at[:, 0].set(True)
        mask = jnp.where(mask, jnp.cumsum(starts, axis=1), 0).astype(jnp.int32)
    seed = jnp.array([1, 2], jnp.uint32) if call.rate else None
    kw = dict(seed=seed, rate=call.rate, blocks=choice.config, impl=choice.impl.name, segments=call.segments)
    if call.packed:
        return lambda qkv: flash_attention_qkv(qkv, mask, **kw)
    return lambda q, k, v: flash_attention(q, k, v, mask, **kw)


def _add_bias(qkv, bias):
    """qkv + bias (3, N, H), the bias rounded to qkv's dtype and the sum rounded once, as the folding kernels apply
    q's (XLA's add where the kernels do not fold the bias: `Blocks.fold_bias`).

    Written as the add of a (3*N*H,) row to the projection GEMM's 2-D [B*S, 3*N*H] output, in qkv's dtype (XLA adds
    16-bit floats in float32 and rounds once; a float32 form, `(qkv.astype(f32) + bias.astype(qkv.dtype).astype(f32))
    .astype(qkv.dtype)`, added the bias unrounded on the GPU, where XLA's excess precision drops the convert pair): in
    that form XLA puts it into the GEMM's cuBLAS(Lt) bias epilogue when the GEMM is a cuBLAS call
    (`TrainConfig.xla_gemm="cublas"`), so the projection's output is not rewritten (the epilogue adds the bias to the
    float32 accumulator before the one rounding: not bit-equal to this form, a rounding closer to exact); on the 5-D
    shape, or in float32 around the rounded GEMM output, it stayed one XLA pass (31 us per BERT-large layer at B16
    S512; benchmarks/results/train-h200.md)."""
    b, s, c, n, h = qkv.shape
    return (qkv.reshape(b * s, c * n * h) + bias.astype(qkv.dtype).reshape(c * n * h)).reshape(qkv.shape)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6, 7, 8))
def _flash_qkv(qkv, code, seed, rate, interpret, impl, blocks, heads, segments):
    return _flash_qkv_fwd(qkv, code, seed, rate, interpret, impl, blocks, heads, segments)[0]


def _flash_qkv_fwd(qkv, code, seed, rate, interpret, impl, blocks, heads, segments, bias=None):
    out, lse = impl.forward(qkv, qkv, qkv, code, seed, rate=rate, blocks=blocks, interpret=interpret, heads=heads,
                            packed=True, bias=bias, segments=segments)
    return out, (qkv, code, seed, out, lse)


def _flash_qkv_bwd(rate, interpret, impl, blocks, heads, segments, res, do):
    qkv, code, seed, out, lse = res
    dqkv = impl.backward(qkv, qkv, qkv, code, seed, out, lse, do, rate=rate, blocks=blocks, interpret=interpret,
                         heads=heads, packed=True, segments=segments)
    return dqkv, None, None


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7, 8, 9))
def _flash_qkv_bias(qkv, bias, code, seed, rate, interpret, impl, blocks, heads, segments):
    return _flash_qkv_bias_fwd(qkv, bias, code, seed, rate, interpret, impl, blocks, heads, segments)[0]


def _flash_qkv_bias_fwd(qkv, bias, code, seed, rate, interpret, impl, blocks, heads, segments):
    """The kernels apply the bias (`blocks.fold_bias`), or XLA adds it first (the residual is then the biased qkv)."""
    if blocks.fold_bias:
        out, res = _flash_qkv_fwd(qkv, code, seed, rate, interpret, impl, blocks, heads, segments, bias)
    else:
        out, res = _flash_qkv_fwd(_add_bias(qkv, bias), code, seed, rate, interpret, impl, blocks, heads, segments)
    return out, (res, bias)


def _flash_qkv_bias_bwd(rate, interpret, impl, blocks, heads, segments, res, do):
    """dQKV, and the bias gradient (dQKV summed over B and S in fp32) from the kernels' per-program column sums."""
    (qkv, code, seed, out, lse), bias = res
    dqkv, dbias = impl.backward(qkv, qkv, qkv, code, seed, out, lse, do, rate=rate, blocks=blocks,
                                interpret=interpret, heads=heads, packed=True,
                                bias=bias if blocks.fold_bias else None, bias_grad=True, segments=segments)
    return dqkv, dbias.astype(bias.dtype), None, None


_flash_qkv.defvjp(_flash_qkv_fwd, _flash_qkv_bwd)
_flash_qkv_bias.defvjp(_flash_qkv_bias_fwd, _flash_qkv_bias_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8, 9, 10))
def _flash(q, k, v, code, seed, rate, interpret, impl, blocks, heads, segments):
    out, _ = impl.forward(q, k, v, code, seed, rate=rate, blocks=blocks, interpret=interpret, heads=heads,
                          segments=segments)
    return out


def _flash_fwd(q, k, v, code, seed, rate, interpret, impl, blocks, heads, segments):
    out, lse = impl.forward(q, k, v, code, seed, rate=rate, blocks=blocks, interpret=interpret, heads=heads,
                            segments=segments)
    # Residuals: the inputs (views, no copies), the output and the fp32 logsumexp; the dropout mask is regenerated.
    return out, (q, k, v, code, seed, out, lse)


def _flash_bwd(rate, interpret, impl, blocks, heads, segments, res, do):
    q, k, v, code, seed, out, lse = res
    dq, dk, dv = impl.backward(q, k, v, code, seed, out, lse, do, rate=rate, blocks=blocks, interpret=interpret,
                               heads=heads, segments=segments)
    return dq, dk, dv, None, None  # the int mask code and the uint32 seed words have no cotangent


_flash.defvjp(_flash_fwd, _flash_bwd)
