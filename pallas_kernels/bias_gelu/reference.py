"""Reference bias + GELU + dropout in jax.numpy."""

import jax.numpy as jnp

from .._math import gelu
from ..dropout import dropout


def bias_gelu(x, bias, *, seed=None, rate: float = 0.0):
    """`dropout(gelu(x + bias))` over (..., F) with bias (F,); math in float32, result in x's dtype.

    BERT's feed-forward has no dropout here (rate 0); the argument exists for models that do.
    """
    h = gelu(x.astype(jnp.float32) + bias.astype(jnp.float32))
    if rate:
        h = dropout(h, seed, rate)
    return h.astype(x.dtype)
