"""Reference attention in jax.numpy (unfused: materialises the BNST scores)."""

import jax.numpy as jnp

from ..softmax.reference import scaled_masked_softmax


def segment_mask(segment_ids):
    """(B, S, S) bool: query s may attend key t, for packed rows' int segment ids (B, S) (1, 2, ... per sample, 0 at
    padding): t is a key of s's sample. The padding is one more segment (id 0): a padding query attends the padding
    keys, never a sample's. So every query keeps at least its own key (no row is all masked), the kernels test one
    equality per score, and a sample's rows get exactly what they get under a key mask; the padding rows, which no
    loss reads, differ."""
    return segment_ids[:, :, None] == segment_ids[:, None, :]


def attention(q, k, v, mask, *, seed=None, rate: float = 0.0, qkv_layout: str = "BSNH", scores_layout: str = "BNST",
              ctx_layout: str = "BSNH", segments: bool = False):
    """Context (B, S, N, H) from q (B, S, N, H), k and v (B, T, N, H) and a key mask (B, T), True at real keys; with
    `segments`, `mask` holds the int segment ids (B, S) of packed rows instead (`segment_mask`; T = S).

    The `*_layout` arguments are stored orders (see layouts/): q, k and v stored in `qkv_layout` (k and v with T
    for S), the scores in `scores_layout`, the result in `ctx_layout`. The defaults are the shapes above.
    """
    kv_layout = qkv_layout.replace("S", "T")
    scores = jnp.einsum(f"{qkv_layout},{kv_layout}->{scores_layout}", q, k)
    h = q.shape[qkv_layout.index("H")]
    mask = segment_mask(mask) if segments else mask
    probs = scaled_masked_softmax(scores, mask, scale=h ** -0.5, seed=seed, rate=rate, layout=scores_layout)
    return jnp.einsum(f"{scores_layout},{kv_layout}->{ctx_layout}", probs, v)


def attention_qkv(qkv, mask, *, bias=None, seed=None, rate: float = 0.0, segments: bool = False):
    """`attention` of the packed projection qkv (B, S, 3, N, H) (C = q, k, v), plus its optional bias (3, N, H)
    (added in qkv's dtype): context (B, S, N, H)."""
    if bias is not None:
        qkv = qkv + bias.astype(qkv.dtype)
    return attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], mask, seed=seed, rate=rate, segments=segments)
