"""Shared float32 math of the references and of the kernels."""

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


# Rational approximation of erf on [-4, 4] (float32; the form XLA and Eigen use for f32 erf): erf(x) = x P(x²)/Q(x²)
# (max abs error ~1e-7). Inside Triton-lowered kernels `lax.erf` has no lowering rule, so the kernels use this.
_ERF_P = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
          -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02)
_ERF_Q = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
          -1.42647390514189e-02)


_SQRT_HALF = 0.7071067811865476
_LOG2E = 1.4426950408889634
_INV_SQRT_PI = 0.5641895835477563


def _erf_terms(x, bc, k, recip):
    """z = (x + b)/√2 and k·(1 + erf(z)), float32, with `bc` = b/√2 (broadcast over x's rows) and k a constant.

    GELU is written in z rather than h = x + b: h·Φ(h) = z·(1 + erf(z))/√2 and Φ(h) + h·φ(h) = (1 + erf(z))/2 +
    z·exp(-z²)/√π, so z is one multiply-add from x, h never appears, and each pass's constant factor (1/√2 or 1/2,
    times the dropout scale) goes into the erf polynomial's coefficients: erf(z) = zc·P(zc²)/Q(zc²) with zc = z
    clipped to [-4, 4] (`_ERF_P`, `_ERF_Q`; `lax.erf` has no Triton lowering rule), and k·(1 + erf) is one
    multiply-add from zc·P_k and 1/Q = `recip(q)` (a division, or the Mosaic GPU kernels' rcp.approx.ftz). On the
    Mosaic GPU forward with dropout that took the SASS from 38 to 29 instructions per element (h's add and multiply,
    the dropout scale's multiply and rsqrt's denormal handling gone; kernels-h200.md, bias+GELU)."""
    z = x * _SQRT_HALF + bc
    zc = jnp.clip(z, -4.0, 4.0)
    t = zc * zc
    p = jnp.float32(k * _ERF_P[0])
    for a in _ERF_P[1:]:
        p = p * t + jnp.float32(k * a)
    q = jnp.float32(_ERF_Q[0])
    for b in _ERF_Q[1:]:
        q = q * t + jnp.float32(b)
    return z, (zc * p) * recip(q) + jnp.float32(k)


def gelu_terms(x, bc, scale: float, recip):
    """(z, scale·(1 + erf(z))/√2) for x + b = √2·z: GELU(x + b)·scale is their product (dropout zeroes the second)."""
    return _erf_terms(x, bc, scale * _SQRT_HALF, recip)


def gelu_grad(x, bc, scale: float, recip):
    """scale·GELU'(x + b) = scale·((1 + erf(z))/2 + z·exp(-z²)/√π), exp as exp2."""
    return gelu_grad_from_terms(*_erf_terms(x, bc, 0.5 * scale, recip), scale)


def gelu_grad_from_terms(z, a, scale: float):
    """scale·GELU'(x + b) from z = (x + b)/√2 and a = scale·(1 + erf(z))/2 (`gelu_terms`' second term over √2)."""
    return (z * jnp.exp2(z * z * jnp.float32(-_LOG2E))) * jnp.float32(scale * _INV_SQRT_PI) + a


def divide(q):
    """`recip` for `gelu_terms` / `gelu_grad` as a plain division."""
    return 1.0 / q
