"""Fused MLM decoder + cross-entropy: Pallas GEMM tiles with the loss's reductions in registers (`kernel.py`).

Forward: one kernel computes every (rows x vocabulary) tile of logits = h E^T + b and reduces it in registers to four
numbers per row and tile (max, sum of exp, label logit, argmax); a few small XLA ops combine them into the float32
logsumexp, nll and predictions. Residuals: the inputs, the table cast to h's dtype (the cast both passes need, done
once) and logz (N,).

Backward, two forms (`probs_dtype`):
- recompute (the default): one kernel recomputes each tile's logits and writes d_logits = (softmax - onehot) * g in
  h's dtype plus float32 column sums for the bias gradient. Nothing of size (N, V) is kept between the passes, and
  the bias gradient is float32-accurate.
- stored probabilities (`probs_dtype` a dtype): the forward kernel also writes P' = exp(logit - m_tile) in that dtype,
  m_tile being the tile's own row max (so every value is in (0, 1] and the dtype's relative rounding applies
  uniformly; 0 on padding columns), and keeps it with the (N, V / BV) tile maxes as residuals: N * V * itemsize
  bytes (bfloat16: 78 MB at 1280 rows of the model's 30592-row table). The backward is then XLA only:
  d_logits = (P' exp(m_tile - logz) - onehot) * g in float32, cast to h's dtype, and its float32 column sums; no
  GEMM over the table is recomputed. P''s rounding reaches d_logits and the bias gradient: in bfloat16 up to 2^-8
  of each probability, which puts the bias gradient at 1.5-3e-4 of its largest element from float64 where the
  recompute path is at 1-2e-7 (tests/ops/test_mlm_loss.py); in float32 it is the recompute path's to rounding.

Both forms then run dh = d_logits E and dE = d_logits^T h as two XLA (cuBLAS) GEMMs, as in the reference and the
chunked loss; d_logits (N, V) in the compute dtype is the backward's transient of that size (the reference keeps the
float32 logits and writes a float32 d_logits besides).

The kernels take 16-bit h (a Triton `dot` on float32 would round through TF32 on the GPU) and a width that is a
multiple of 16 (`unsupported`); the registry runs the chunked loss elsewhere (`impls.py`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from .._pallas import resolve_interpret
from ..mesh import batch_shard_map
from . import kernel
from .chunked import check_inputs


def unsupported(h_dtype, v: int, d: int, blocks: kernel.Blocks) -> str | None:
    """Why the fused kernels do not take this call, or None: they need a 16-bit compute dtype and a width with a
    tile of >= 16 columns."""
    if jnp.dtype(h_dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return (f"h.dtype={jnp.dtype(h_dtype).name} must be bfloat16 or float16 (a Triton dot on float32 rounds "
                "through TF32)")
    if kernel.tile_sizes(16, v, d, blocks) is None:
        return f"width D={d} must be a multiple of 16 (a Triton dot's smallest tile)"
    return None


def _combine(m, s, ll, am):
    """(N, T) per-tile partials -> float32 nll, logz and int32 argmax (N,): logsumexp across tiles; on ties the
    first tile reaching the row's max, whose own argmax is its first column reaching it (jnp.argmax's rule)."""
    mx = jnp.max(m, axis=1)
    logz = mx + jnp.log(jnp.sum(s * jnp.exp(m - mx[:, None]), axis=1))
    pred = jnp.min(jnp.where(m == mx[:, None], am, jnp.iinfo(jnp.int32).max), axis=1)
    return logz - jnp.sum(ll, axis=1), logz, pred


def _forward(h, e, bias, labels, valid, blocks, interpret, probs_dtype):
    ec, b32 = e.astype(h.dtype), bias.astype(jnp.float32)
    parts = batch_shard_map(
        lambda _, h, labels, ec, b32: kernel.forward_partials(h, ec, b32, labels, valid=valid, blocks=blocks,
                                                              interpret=interpret, probs_dtype=probs_dtype),
        2)(h, labels, ec, b32)
    nll, logz, pred = _combine(*parts[:4])
    return nll, pred, (ec, b32, logz, parts[0], parts[4] if probs_dtype is not None else None)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _fused(h, e, bias, labels, valid, blocks, interpret, probs_dtype):
    nll, pred, _ = _forward(h, e, bias, labels, valid, blocks, interpret, probs_dtype)
    return nll, pred


def _fused_fwd(h, e, bias, labels, valid, blocks, interpret, probs_dtype):
    nll, pred, (ec, b32, logz, m, probs) = _forward(h, e, bias, labels, valid, blocks, interpret, probs_dtype)
    if probs_dtype is not None:  # the stored probabilities replace the bias and the backward's logits GEMM
        return (nll, pred), (h, e, bias, ec, None, labels, logz, m, probs)
    return (nll, pred), (h, e, bias, ec, b32, labels, logz, None, None)


def _stored_d_logits(probs, m, logz, labels, g, bv: int):
    """float32 d_logits (N, V) = (P' exp(m_tile - logz) - onehot(label)) * g from the forward's stored
    P' = exp(logit - m_tile): each tile's (N,) max scales its BV columns (the last tile may be partial). A tile of
    padding only has m = -inf and P' = 0, so its columns get 0; padding columns have P' = 0 in every tile."""
    n, v = probs.shape
    t = m.shape[1]
    scale = jnp.exp(m - logz[:, None])  # (N, T), <= 1
    scale = jnp.broadcast_to(scale[:, :, None], (n, t, bv)).reshape(n, t * bv)[:, :v]  # one number per column
    onehot = (jnp.arange(v, dtype=jnp.int32)[None, :] == labels[:, None]).astype(jnp.float32)
    return (probs.astype(jnp.float32) * scale - onehot) * g[:, None]


def _fused_bwd(valid, blocks, interpret, probs_dtype, res, cts):
    h, e, bias, ec, b32, labels, logz, m, probs = res
    g = cts[0].astype(jnp.float32)  # the predictions' cotangent is float0 and ignored
    if probs_dtype is None:
        d_logits, db = batch_shard_map(
            lambda _, h, labels, logz, g, ec, b32: kernel.backward_tiles(h, ec, b32, labels, logz, g, valid=valid,
                                                                         blocks=blocks, interpret=interpret),
            4)(h, labels, logz, g, ec, b32)
        db = jnp.sum(db, axis=0)
    else:  # XLA elementwise pass, its column sums (the bias gradient) in float32 beside it
        d32 = _stored_d_logits(probs, m, logz, labels, g, kernel.tile_sizes(1, *ec.shape, blocks)[1])
        d_logits, db = d32.astype(h.dtype), jnp.sum(d32, axis=0)
    dh = jnp.einsum("NV,VD->ND", d_logits, ec, preferred_element_type=jnp.float32)
    de = jnp.einsum("NV,ND->VD", d_logits, h, preferred_element_type=jnp.float32)
    return dh.astype(h.dtype), de.astype(e.dtype), db.astype(bias.dtype), None


_fused.defvjp(_fused_fwd, _fused_bwd)


PROBS_DTYPES = ("bfloat16", "float16", "float32")  # what the stored-probabilities backward may store P' in


def mlm_cross_entropy_fused(h, embedding, output_bias, labels, *, vocab_size=None, blocks: kernel.Blocks | None = None,
                            interpret: bool | None = None, probs_dtype=None):
    """Same contract as `reference.mlm_cross_entropy` and `chunked.mlm_cross_entropy_chunked`.

    Args:
      h: (..., D) hidden states in bfloat16 or float16, D a multiple of 16 (`unsupported` says why not).
      embedding: (V, D) tied word embeddings, any float dtype; cast to h's dtype once per call.
      output_bias: (V,) decoder bias, added in float32.
      labels: (...) int labels in [0, V) (out-of-range labels give nll = logz: they match no column).
      vocab_size: columns at and past it are padding: never predicted, no share of the softmax, zero gradient.
      blocks: tile sizes (`kernel.Blocks`); interpret: None compiles on a GPU and interprets on a CPU.
      probs_dtype: None (default): the backward kernel recomputes the logits. One of `PROBS_DTYPES`: the forward
        also stores P' = exp(logit - tile max) in it, a residual of N * V * itemsize bytes (78 MB in bfloat16 at
        1280 rows of a 30592-row table), and the backward is an XLA elementwise pass over it; its rounding of P'
        reaches d_logits and the bias gradient (bfloat16: 2^-8 of each probability, float32: none to speak of).

    Returns:
      nll: float32 (...), differentiable w.r.t. h, embedding and output_bias (gradients in their dtypes).
      predictions: int32 (...) argmax of the logits, not differentiable.
    """
    check_inputs(h, embedding, output_bias, labels)
    v, d = embedding.shape
    valid = v if vocab_size is None else int(vocab_size)
    if not 1 <= valid <= v:
        raise ValueError(f"vocab_size={vocab_size} must be in [1, V={v}]")
    blocks = blocks or kernel.Blocks()
    why = unsupported(h.dtype, v, d, blocks)
    if why is not None:
        raise ValueError(why)
    if probs_dtype is not None:
        if jnp.dtype(probs_dtype).name not in PROBS_DTYPES:
            raise ValueError(f"probs_dtype={jnp.dtype(probs_dtype).name} must be None or one of {PROBS_DTYPES}")
        probs_dtype = jnp.dtype(probs_dtype)
    lead = h.shape[:-1]
    nll, pred = _fused(h.reshape(-1, d), embedding, output_bias, labels.reshape(-1).astype(jnp.int32), valid, blocks,
                       resolve_interpret(interpret), probs_dtype)
    return nll.reshape(lead), pred.reshape(lead)
