"""Reference BDRLN in jax.numpy: the ground truth for the fused kernel."""

import jax.numpy as jnp

from .._math import layer_norm as layer_norm_f32
from ..dropout import dropout


def bias_dropout_residual_layernorm(x, bias, residual, scale, ln_bias, *, seed, rate: float, eps: float):
    """`LN(residual + dropout(x + bias))` over the last axis (D). x, residual: (..., D); bias, scale, ln_bias: (D,).

    Math in float32; the result has `residual`'s dtype. `seed` is a uint32[2] (see `pallas_kernels.dropout`);
    `rate=0` disables dropout.
    """
    h = x.astype(jnp.float32) + bias.astype(jnp.float32)
    h = dropout(h, seed, rate)
    h = h + residual.astype(jnp.float32)
    return layer_norm_f32(h, scale, ln_bias, eps).astype(residual.dtype)


def layer_norm(x, scale, ln_bias, *, eps: float):
    """Plain layernorm over the last axis (the MLM head's), float32 math, result in x's dtype."""
    return layer_norm_f32(x.astype(jnp.float32), scale, ln_bias, eps).astype(x.dtype)
