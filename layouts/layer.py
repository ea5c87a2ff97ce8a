"""The encoder layer's operators written on layout-annotated tensors: the model calls these, the search times them.

Each function takes plain parameter arrays (in their fixed parameter layouts CDNH, NHD, DF, FD) and activations
stored as the `LayoutConfig` says, and returns its result stored as the config says. The memory-bound operators
come from `jaxformer.ops` (`f`), so `kernels="xla"` and `"pallas"` run the same code paths as the rest of the
model. With the default `LayoutConfig` every function issues exactly the operations of the original model.

Pallas kernels with a fixed layout: flash attention wants q, k, v as BSNH and writes BSNH. Under
`kernels="pallas"` the transposes from the stored `qkv` order and to the stored `ctx` order are inserted here
(none for the default CBSNH/BSNH) and the search counts them as graph edges (`layouts/search.py`). BDRLN and bias +
GELU flatten rows of the last axis, so they take any stored order with D / F last, which `LayoutConfig` enforces.
"""

from __future__ import annotations

from .config import LayoutConfig
from .einsum import Annotated, annotate, einsum, expand, relayout, rename, take

FLASH_QKV = "CBSNH"  # the stored qkv order whose C-slices are the BSNH q, k, v that flash attention takes
FLASH_CTX = "BSNH"


def qkv_projection(x: Annotated, kernel, bias, L: LayoutConfig, dt) -> Annotated:
    """x @ w_qkv + b_qkv (AIB: XLA fuses the bias into the GEMM epilogue), stored in `L.qkv`."""
    qkv = einsum(L.qkv, x, annotate(kernel.astype(dt), "CDNH"))
    return Annotated(qkv.array + expand(bias.astype(dt), "CNH", L.qkv), L.qkv)


def split_qkv(qkv: Annotated):
    """q (letters without C), k and v (S renamed T: the key/value positions)."""
    q = take(qkv, "C", 0)
    k, v = (rename(take(qkv, "C", i), S="T") for i in (1, 2))
    return q, k, v


def attention(f, pallas: bool, qkv: Annotated, mask, L: LayoutConfig, *, seed, rate: float) -> Annotated:
    """The attention core, stored in `L.ctx`: XLA's unfused reference in the configured layouts, or flash attention
    (BSNH in and out) between explicit transposes."""
    if pallas:
        q, k, v = split_qkv(relayout(qkv, FLASH_QKV))  # BSNH, BTNH, BTNH: C-slices, no copies
        ctx = f.attention(q.to("BSNH"), k.to("BTNH"), v.to("BTNH"), mask, seed=seed, rate=rate)
        return relayout(annotate(ctx, FLASH_CTX), L.ctx)
    q, k, v = split_qkv(qkv)
    ctx = f.attention(q.array, k.array, v.array, mask, seed=seed, rate=rate, qkv_layout=q.layout,
                      scores_layout=L.scores, ctx_layout=L.ctx)
    return annotate(ctx, L.ctx)


def attention_output(f, ctx: Annotated, kernel, bias, residual: Annotated, scale, ln_bias, L: LayoutConfig, dt, *,
                     seed, rate: float, eps: float) -> Annotated:
    """LN(x + dropout(ctx @ w_o + b_o)) (BDRLN), stored in `L.x` like its residual."""
    out = einsum(L.x, ctx, annotate(kernel.astype(dt), "NHD"))
    return annotate(f.bias_dropout_residual_layernorm(out.array, bias, residual.array, scale, ln_bias,
                                                      seed=seed, rate=rate, eps=eps), L.x)


def ffn_intermediate(f, x: Annotated, kernel, bias, L: LayoutConfig, dt) -> Annotated:
    """gelu(x @ w_i + b_i) (BAD), stored in `L.h`."""
    return annotate(f.bias_gelu(einsum(L.h, x, annotate(kernel.astype(dt), "DF")).array, bias), L.h)


def ffn_output(f, h: Annotated, kernel, bias, residual: Annotated, scale, ln_bias, L: LayoutConfig, dt, *,
               seed, rate: float, eps: float) -> Annotated:
    """LN(x + dropout(h @ w_o2 + b_o2)) (BDRLN), stored in `L.x`."""
    out = einsum(L.x, h, annotate(kernel.astype(dt), "FD"))
    return annotate(f.bias_dropout_residual_layernorm(out.array, bias, residual.array, scale, ln_bias,
                                                      seed=seed, rate=rate, eps=eps), L.x)
