"""Vocabulary-chunked MLM cross-entropy with a backward that recomputes each chunk's logits (pure JAX).

Forward: a `lax.scan` over vocabulary chunks keeps, per row, the running max m and sum-exp s (online logsumexp:
s <- s * exp(m - m') + sum(exp(logits - m'))), the label's logit and the running argmax. Only logz = m + log s
(float32, one number per row) is saved for the backward.

Backward: per chunk, logits are recomputed, p = exp(logits - logz), d_logits = (p - onehot(label)) * g, then
dh += d_logits @ E_chunk (float32 accumulator), dE_chunk = d_logits^T @ h, d_bias_chunk = sum over rows of d_logits.

No padding: V is not a multiple of the chunk in BERT (30522), and padding E would copy it (V x D) in the forward
and slice a padded dE in the backward. Instead the last chunk is read at start V - chunk (where
`lax.dynamic_slice` would clamp it anyway) and its columns already covered by the previous chunk are masked out:
-inf in the forward (never win, add 0 to the sum), zero in dh. dE and d_bias rows of those columns are simply
recomputed and overwritten with the same values, so every row of dE is written exactly once per chunk that owns it.
"""

import functools
import operator

import jax
import jax.numpy as jnp
from jax import lax


def check_inputs(h, embedding, output_bias, labels, chunk=None) -> int | None:
    """Validate shapes and dtypes (and the chunk, where given) before any tracing; returns the chunk as an int."""
    if chunk is not None:
        try:
            chunk = operator.index(chunk)
        except TypeError:
            raise ValueError(f"chunk must be an int, got {chunk!r}") from None
        if chunk < 1:
            raise ValueError(f"{chunk=} must be positive")
    if h.ndim < 1:
        raise ValueError(f"h must be (..., D), got shape {h.shape}")
    if embedding.ndim != 2 or embedding.shape[1] != h.shape[-1]:
        raise ValueError(f"embedding must be (V, D) with D = h.shape[-1] = {h.shape[-1]}, got shape {embedding.shape}")
    if embedding.shape[0] < 1:
        raise ValueError(f"embedding must have at least one row, got shape {embedding.shape}")
    if output_bias.shape != embedding.shape[:1]:
        raise ValueError(f"output_bias must be (V,) = {embedding.shape[:1]}, got shape {output_bias.shape}")
    if labels.shape != h.shape[:-1]:
        raise ValueError(f"labels shape {labels.shape} must equal h.shape[:-1] = {h.shape[:-1]}")
    if not jnp.issubdtype(labels.dtype, jnp.integer):
        raise ValueError(f"labels must be integers, got dtype {labels.dtype}")
    return chunk


def _chunk_columns(i, c: int, v: int):
    """Chunk i owns columns [i*c, min(i*c + c, V)); it is read at start min(i*c, V - c), so the last chunk overlaps
    the previous one. Returns the start, the (C,) global column ids and the (C,) mask of owned columns."""
    start = jnp.minimum(i * c, v - c)
    cols = start + jnp.arange(c, dtype=jnp.int32)
    return start, cols, cols >= i * c


def _num_chunks(c: int, valid: int) -> int:
    """Chunks that hold a real column: columns at and past `valid` (vocabulary padding) are never read."""
    return -(-valid // c)


def _chunk_logits(h, embedding, output_bias, start, c: int):
    """float32 (N, C) logits of the chunk at `start`: dot in h's dtype with float32 accumulation, bias in float32."""
    e = lax.dynamic_slice_in_dim(embedding, start, c).astype(h.dtype)  # CD
    b = lax.dynamic_slice_in_dim(output_bias, start, c).astype(jnp.float32)  # C
    return jnp.einsum("ND,CD->NC", h, e, preferred_element_type=jnp.float32) + b, e


def _forward(h, embedding, output_bias, labels, c: int, valid: int):
    """h (N, D), labels (N,) int32 -> nll (N,) float32, predictions (N,) int32, logz (N,) float32."""
    n, v = h.shape[0], embedding.shape[0]

    def body(carry, i):
        m, s, label_logit, pred = carry
        start, cols, owned = _chunk_columns(i, c, v)
        logits, _ = _chunk_logits(h, embedding, output_bias, start, c)
        # NC; columns of the previous chunk and padding columns never win and add 0
        logits = jnp.where(owned & (cols < valid), logits, -jnp.inf)
        chunk_max = jnp.max(logits, axis=-1)
        new_m = jnp.maximum(m, chunk_max)
        s = s * jnp.exp(m - new_m) + jnp.sum(jnp.exp(logits - new_m[:, None]), axis=-1)
        hit = (cols == labels[:, None]) & owned
        label_logit = label_logit + jnp.sum(jnp.where(hit, logits, 0.0), axis=-1)
        # Strictly greater: on ties the earlier chunk (lower index) wins, as jnp.argmax.
        pred = jnp.where(chunk_max > m, start + jnp.argmax(logits, axis=-1).astype(jnp.int32), pred)
        return (new_m, s, label_logit, pred), None

    init = (jnp.full((n,), -jnp.inf, jnp.float32), jnp.zeros((n,), jnp.float32),
            jnp.zeros((n,), jnp.float32), jnp.zeros((n,), jnp.int32))
    (m, s, label_logit, pred), _ = lax.scan(body, init, jnp.arange(_num_chunks(c, valid), dtype=jnp.int32))
    logz = m + jnp.log(s)
    return logz - label_logit, pred, logz


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _mlm_ce(h, embedding, output_bias, labels, c: int, valid: int):
    nll, pred, _ = _forward(h, embedding, output_bias, labels, c, valid)
    return nll, pred


def _mlm_ce_fwd(h, embedding, output_bias, labels, c: int, valid: int):
    nll, pred, logz = _forward(h, embedding, output_bias, labels, c, valid)
    # Residuals: the inputs themselves (already live) and one float32 number per row.
    return (nll, pred), (h, embedding, output_bias, labels, logz)


def _mlm_ce_bwd(c: int, valid: int, res, cts):
    h, embedding, output_bias, labels, logz = res
    g = cts[0].astype(jnp.float32)  # N; the predictions' cotangent is float0 and ignored
    n, d = h.shape
    v = embedding.shape[0]

    def body(carry, i):
        dh, de, db = carry
        start, cols, owned = _chunk_columns(i, c, v)
        logits, e = _chunk_logits(h, embedding, output_bias, start, c)
        p = jnp.where(cols < valid, jnp.exp(logits - logz[:, None]), 0.0)  # padding columns: probability 0
        # NC; float32. Overlapped columns keep their true values: their dE/d_bias rows are rewritten identically.
        d_logits = (p - (cols == labels[:, None]).astype(jnp.float32)) * g[:, None]
        dl = d_logits.astype(h.dtype)  # the GEMMs run in the compute dtype, accumulate in float32
        dh = dh + jnp.einsum("NC,CD->ND", jnp.where(owned, dl, 0), e, preferred_element_type=jnp.float32)
        de_c = jnp.einsum("NC,ND->CD", dl, h, preferred_element_type=jnp.float32)
        de = lax.dynamic_update_slice_in_dim(de, de_c.astype(de.dtype), start, axis=0)
        db = lax.dynamic_update_slice_in_dim(db, jnp.sum(d_logits, axis=0).astype(db.dtype), start, axis=0)
        return (dh, de, db), None

    init = (jnp.zeros((n, d), jnp.float32), jnp.zeros(embedding.shape, embedding.dtype),
            jnp.zeros(output_bias.shape, output_bias.dtype))
    (dh, de, db), _ = lax.scan(body, init, jnp.arange(_num_chunks(c, valid), dtype=jnp.int32))
    return dh.astype(h.dtype), de, db, None


_mlm_ce.defvjp(_mlm_ce_fwd, _mlm_ce_bwd)


def mlm_cross_entropy_chunked(h, embedding, output_bias, labels, *, chunk: int = 16384, vocab_size=None):
    """Same results as `reference.mlm_cross_entropy`, computed over `chunk`-wide slices of the vocabulary.

    Args:
      h: (..., D) hidden states in the compute dtype (bf16 or float32).
      embedding: (V, D) tied word embeddings, any float dtype; each chunk is cast to h's dtype for the dot (the
        float32 parameter can be passed directly: no full-size cast copy is made).
      output_bias: (V,) decoder bias, added in float32.
      labels: (...) int labels in [0, V) (out-of-range labels give nll = logz: they match no column).
      chunk: vocabulary columns per step (static); clipped to V. 16384 was the fastest of 4096/8192/16384 on an
        H200 at BERT-large's shapes (benchmarks/results/kernels-h200.md).
      vocab_size: columns at and past it are padding (the model pads V to a multiple of 128): never predicted, no
        share of the softmax, zero gradient (and never read when a whole chunk is padding). Default: V.

    Returns:
      nll: float32 (...), differentiable w.r.t. h, embedding and output_bias (gradients in their dtypes).
      predictions: int32 (...) argmax of the logits, not differentiable.
    """
    chunk = check_inputs(h, embedding, output_bias, labels, chunk)
    v = embedding.shape[0]
    valid = v if vocab_size is None else operator.index(vocab_size)
    if not 1 <= valid <= v:
        raise ValueError(f"vocab_size={vocab_size} must be in [1, V={v}]")
    lead, d = h.shape[:-1], h.shape[-1]
    c = min(chunk, v)
    nll, pred = _mlm_ce(h.reshape(-1, d), embedding, output_bias, labels.reshape(-1).astype(jnp.int32), c, valid)
    return nll.reshape(lead), pred.reshape(lead)
