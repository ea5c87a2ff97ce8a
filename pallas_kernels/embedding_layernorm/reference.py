"""Reference embedding gathers + sum + layernorm + dropout in jax.numpy."""

import jax.numpy as jnp

from .._math import layer_norm
from ..dropout import dropout


def embedding_layernorm(input_ids, token_type_ids, word, position, token_type, scale, ln_bias, *, seed, rate: float,
                        eps: float, dtype=jnp.float32):
    """`dropout(LN(word[input_ids] + position[s] + token_type[token_type_ids]))` of (B, S) ids: word (V, D),
    position (S, D) (the rows of positions 0..S-1), token_type (T, D); math in float32, output (B, S, D) in `dtype`.
    The gathers are `jnp.take`'s (negative ids count from the end, ids out of range give NaN rows)."""
    h = jnp.take(word, input_ids, axis=0).astype(jnp.float32) + position.astype(jnp.float32)[None]
    h = h + jnp.take(token_type, token_type_ids, axis=0).astype(jnp.float32)
    h = layer_norm(h, scale, ln_bias, eps)
    return dropout(h, seed, rate).astype(dtype)
