"""Reference scaled, masked softmax + dropout in jax.numpy."""

import jax
import jax.numpy as jnp

from ..dropout import dropout


def scaled_masked_softmax(scores, mask, *, scale: float, seed=None, rate: float = 0.0):
    """`dropout(softmax(scale * scores, masked))` over T for scores (B, N, S, T) and a key mask (B, T).

    `mask` is True (or 1) at real key positions. Softmax in float32; the result has `scores`' dtype.
    Masked keys get probability exactly 0; a row whose keys are all masked becomes uniform (never NaN).
    """
    s = scores.astype(jnp.float32) * scale
    s = jnp.where(mask.astype(bool)[:, None, None, :], s, jnp.finfo(jnp.float32).min)
    p = jax.nn.softmax(s, axis=-1)
    if rate:
        p = dropout(p, seed, rate)
    return p.astype(scores.dtype)
