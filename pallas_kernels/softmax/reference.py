"""Reference scaled, masked softmax + dropout in jax.numpy."""

import jax
import jax.numpy as jnp

from ..dropout import dropout


def scaled_masked_softmax(scores, mask, *, scale: float, seed=None, rate: float = 0.0, layout: str = "BNST"):
    """`dropout(softmax(scale * scores, masked))` over T for scores (B, N, S, T) and a key mask (B, T).

    `layout` is the stored order of `scores` (any permutation of BNST, see layouts/): the softmax runs over the
    axis of T and the mask broadcasts over N and S wherever they are stored. The dropout mask is drawn over the
    stored (row-major) element order, so another layout draws another, identically distributed, mask.

    `mask` is True (or 1) at real key positions. Softmax in float32; the result has `scores`' dtype.
    Masked keys get probability exactly 0; a row whose keys are all masked becomes uniform (never NaN).
    A (B, S, T) `mask` masks per query row instead (packed sequences: `pallas_kernels.attention.segment_mask`).
    """
    s = scores.astype(jnp.float32) * scale
    if sorted(layout) != sorted("BNST"):
        raise ValueError(f"{layout=} must be a permutation of 'BNST'")
    letters = "BT" if mask.ndim == 2 else "BST"
    # the mask's letters in their stored order, then size-1 axes where the others are stored
    stored = [c for c in layout if c in letters]
    key_mask = jnp.transpose(mask.astype(bool), [letters.index(c) for c in stored])
    key_mask = key_mask.reshape([scores.shape[i] if c in letters else 1 for i, c in enumerate(layout)])
    s = jnp.where(key_mask, s, jnp.finfo(jnp.float32).min)
    p = jax.nn.softmax(s, axis=layout.index("T"))
    if rate:
        p = dropout(p, seed, rate)
    return p.astype(scores.dtype)
