"""Reference embedding gathers + sum + layernorm + dropout in jax.numpy."""

import jax.numpy as jnp

from .._math import layer_norm
from ..dropout import dropout


def embedding_layernorm(input_ids, token_type_ids, word, position, token_type, scale, ln_bias, *, seed, rate: float,
                        eps: float, dtype=jnp.float32, position_ids=None):
    """`dropout(LN(word[input_ids] + position[s] + token_type[token_type_ids]))` of (B, S) ids: word (V, D),
    position (S, D) (the rows of positions 0..S-1), token_type (T, D); math in float32, output (B, S, D) in `dtype`.
    With `position_ids` (B, S) (packed rows: positions restart at each sample), `position` is the whole table and
    row (b, s) adds position[position_ids[b, s]].
    The gathers are `jnp.take`'s (negative ids count from the end, ids out of range give NaN rows)."""
    if position_ids is None:
        pos = position.astype(jnp.float32)[None]
    else:
        pos = jnp.take(position, position_ids, axis=0).astype(jnp.float32)
    h = jnp.take(word, input_ids, axis=0).astype(jnp.float32) + pos
    h = h + jnp.take(token_type, token_type_ids, axis=0).astype(jnp.float32)
    h = layer_norm(h, scale, ln_bias, eps)
    return dropout(h, seed, rate).astype(dtype)
