"""Reference GELU + dense product in jax.numpy: the feed-forward's activation and its output projection."""

import jax.numpy as jnp

from ..bias_gelu.reference import bias_gelu


def spec(layout: str, out: str) -> str:
    """The einsum of x stored `layout` (F its contracted letter) with the (F, D) kernel into `out`."""
    return f"{layout},FD->{out}"


def gelu_dense(x, bias, kernel, *, layout: str = "BSF", out: str = "BSD"):
    """gelu(x + bias) @ kernel: x (..., F) stored `layout`, bias (F,), kernel (F, D) -> stored `out`, in x's dtype.
    GELU in float32 rounded to x's dtype (bias+GELU's reference), then the product in x's dtype (XLA's einsum,
    float32 accumulation)."""
    return jnp.einsum(spec(layout, out), bias_gelu(x, bias), kernel.astype(x.dtype))
