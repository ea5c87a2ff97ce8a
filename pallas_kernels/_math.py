"""Shared float32 math of the references (and, later, of the kernels)."""

import jax
import jax.numpy as jnp


def layer_norm(h, scale, bias, eps: float):
    """Layernorm over the last axis of a float32 `h`, statistics in float32 (biased variance, as BERT)."""
    mean = jnp.mean(h, axis=-1, keepdims=True)
    centered = h - mean
    var = jnp.mean(centered * centered, axis=-1, keepdims=True)
    return centered * jax.lax.rsqrt(var + eps) * scale.astype(jnp.float32) + bias.astype(jnp.float32)


def gelu(h):
    """Exact (erf) GELU, as BERT and Hugging Face's `"gelu"` use."""
    return jax.nn.gelu(h, approximate=False)
