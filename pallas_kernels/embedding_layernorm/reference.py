"""Reference embedding sum + layernorm + dropout in jax.numpy."""

import jax.numpy as jnp

from .._math import layer_norm
from ..dropout import dropout


def embedding_layernorm(word, position, token_type, scale, ln_bias, *, seed, rate: float, eps: float,
                        dtype=jnp.float32):
    """`dropout(LN(word + position + token_type))`; inputs broadcast to (B, S, D); math in float32, out `dtype`."""
    h = word.astype(jnp.float32) + position.astype(jnp.float32) + token_type.astype(jnp.float32)
    h = layer_norm(h, scale, ln_bias, eps)
    return dropout(h, seed, rate).astype(dtype)
