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


# Rational approximation of erf on [-4, 4] (float32; the form XLA and Eigen use for f32 erf): erf(x) = x P(x²)/Q(x²).
# Inside Triton-lowered kernels `lax.erf` has no lowering rule, so the kernels call this instead.
_ERF_P = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
          -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02)
_ERF_Q = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
          -1.42647390514189e-02)


def erf_f32(x):
    """erf of a float32 array from multiplies, adds and one divide (max abs error ~1e-7 in float32). The Mosaic GPU
    bias+GELU kernels use the same polynomials with 1/Q as `rcp.approx.ftz` (`bias_gelu/kernel_mgpu.py`)."""
    x = jnp.clip(x, -4.0, 4.0)
    x2 = x * x
    p = jnp.float32(_ERF_P[0])
    for a in _ERF_P[1:]:
        p = p * x2 + jnp.float32(a)
    q = jnp.float32(_ERF_Q[0])
    for b in _ERF_Q[1:]:
        q = q * x2 + jnp.float32(b)
    return x * p / q


_SQRT_HALF = 0.7071067811865476
_INV_SQRT_2PI = 0.3989422804014327


def gelu_and_grad(h):
    """Exact GELU u·Φ(u) and its derivative Φ(u) + u·φ(u), float32, from kernel-safe operations."""
    cdf = 0.5 * (1.0 + erf_f32(h * _SQRT_HALF))
    return h * cdf, cdf + h * jnp.exp(-0.5 * h * h) * _INV_SQRT_2PI
