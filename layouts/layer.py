"""The encoder layer's operators written on layout-annotated tensors: the model calls these, the search times them.

Each function takes plain parameter arrays (in their fixed parameter layouts CDNH, NHD, DF, FD) and activations
stored as the `LayoutConfig` says, and returns its result stored as the config says. The memory-bound operators
come from `jaxformer.ops` (`f`), so `kernels="xla"` and `"pallas"` run the same code paths as the rest of the
model. With the default `LayoutConfig` every function issues exactly the operations of the original model.

Pallas kernels with a fixed layout: flash attention reads the packed projection qkv as BSCNH (one [B*S, 3*N*H] GEMM
output, q, k, v read in place) and writes the context BSNH. Under `kernels="pallas"` the default qkv order is that
packed one (`for_kernels`); another configured order gets a transpose to it here, and the context one from BSNH,
which the search counts as graph edges (`layouts/search.py`). BDRLN and bias + GELU flatten rows of the last axis,
so they take any stored order with D / F last, which `LayoutConfig` enforces.
"""

from __future__ import annotations

import dataclasses

from .config import LOGICAL, LayoutConfig
from .einsum import Annotated, annotate, einsum, expand, relayout, rename, take

FLASH_QKV = "BSCNH"  # the packed qkv order the flash kernels read in place (flash_attention_qkv)
FLASH_CTX = "BSNH"


def for_kernels(L: LayoutConfig, pallas: bool) -> LayoutConfig:
    """The layouts the layer runs: under the Pallas kernels qkv=CBSNH (the default) is stored as the kernels' packed
    BSCNH (the slices, concatenation and transposes around flash attention cost 88 us per BERT-large layer at B64
    S128: benchmarks/results/kernels-h200.md, session 6). Storing CBSNH there could only add a transpose to BSCNH
    (same GEMM), so the search never needs it (it does not offer CBSNH under pallas). Any other order is kept."""
    if pallas and L.qkv == LOGICAL["qkv"]:
        return dataclasses.replace(L, qkv=FLASH_QKV)
    return L


def qkv_projection(x: Annotated, kernel, bias, L: LayoutConfig, dt) -> Annotated:
    """x @ w_qkv + b_qkv (AIB), stored in `L.qkv`; with `bias` None the product alone (under the Pallas kernels flash
    attention applies the bias: `attention(..., qkv_bias=)`)."""
    qkv = einsum(L.qkv, x, annotate(kernel.astype(dt), "CDNH"))
    if bias is None:
        return qkv
    return Annotated(qkv.array + expand(bias.astype(dt), "CNH", L.qkv), L.qkv)


def split_qkv(qkv: Annotated):
    """q (letters without C), k and v (S renamed T: the key/value positions)."""
    q = take(qkv, "C", 0)
    k, v = (rename(take(qkv, "C", i), S="T") for i in (1, 2))
    return q, k, v


def attention(f, pallas: bool, qkv: Annotated, mask, L: LayoutConfig, *, seed, rate: float,
              qkv_bias=None) -> Annotated:
    """The attention core, stored in `L.ctx`: XLA's unfused reference in the configured layouts, or flash attention
    on the packed qkv (BSCNH in, BSNH out) between explicit transposes where the layouts differ. `qkv_bias` (CNH,
    pallas only): the projection's bias, which `flash_attention_qkv` applies, inside the kernels where that measured
    faster (S <= 128: one pass over the projection's output fewer, 31 us per BERT-large layer on an H200)."""
    if pallas:
        ctx = f.attention_qkv(relayout(qkv, FLASH_QKV).array, mask, bias=qkv_bias, seed=seed, rate=rate)
        return relayout(annotate(ctx, FLASH_CTX), L.ctx)
    if qkv_bias is not None:
        raise ValueError("qkv_bias is folded into flash attention only (pallas); add it in qkv_projection")
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
