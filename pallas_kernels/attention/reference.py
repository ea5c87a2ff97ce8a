"""Reference attention in jax.numpy (unfused: materialises the BNST scores)."""

import jax.numpy as jnp

from ..softmax.reference import scaled_masked_softmax


def attention(q, k, v, mask, *, seed=None, rate: float = 0.0):
    """Context (B, S, N, H) from q (B, S, N, H), k and v (B, T, N, H) and a key mask (B, T), True at real keys."""
    scores = jnp.einsum("BSNH,BTNH->BNST", q, k)
    probs = scaled_masked_softmax(scores, mask, scale=q.shape[-1] ** -0.5, seed=seed, rate=rate)
    return jnp.einsum("BNST,BTNH->BSNH", probs, v)
