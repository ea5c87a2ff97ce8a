"""The encoder layer (post-LN, as in BERT), in the dimension letters of docs/design.md:

    qkv  = x[BSD] @ w_qkv[DCNH] + b_qkv[CNH]                              (AIB)
    ctx  = softmax(q k^T / sqrt(H), padding mask) -> dropout -> @ v         (SM; pallas: flash, adding b_qkv itself)
           (packed rows: the mask is the segment ids, a query attends the keys of its own sample)
    x    = LN(x + dropout(ctx[BSNH] @ w_o[NHD] + b_o))                      (BDRLN)
    z    = x @ w_i[DF]
    x    = LN(x + dropout(gelu(z[BSF] + b_i) @ w_o2[FD] + b_o2))            (BAD, then BDRLN)

Each step is a function on layout-annotated tensors (`layouts.einsum`): `layouts` (a `LayoutConfig`) says in which order
each activation is stored, and the memory-bound operators come from `ops` (`jaxformer.ops.select`), so the XLA
references and the Pallas kernels run the same code path. The GELU and the product after it are one operator
(`gelu_dense`), so that the backward can form z's gradient in that product's epilogue. The layout search
(`jaxformer.layout_search`) times these very functions. With the default `LayoutConfig` every function issues exactly
the operations written above.

Under the Pallas kernels flash attention reads the packed projection as BSCNH (one [B*S, 3*N*H] GEMM output, q, k,
v read in place) and writes the context as BSNH; another configured order costs a transpose here. BDRLN and
bias + GELU work on rows of the last axis, so they take any stored order with D / F last.
"""

from __future__ import annotations

import dataclasses

import jax
from flax import nnx

from layouts.config import LOGICAL, LayoutConfig
from layouts.einsum import Annotated, annotate, einsum, expand, relayout, rename, take
from pallas_kernels.dropout import seed_from_key

from . import ops as _ops
from .config import BertConfig
from .params import LayerNormParams, normal, zeros
from .sharding import constrain

FLASH_QKV = "BSCNH"  # the packed qkv order the flash kernels read in place
FLASH_CTX = "BSNH"


def layouts_for(layouts: LayoutConfig, pallas: bool) -> LayoutConfig:
    """The layouts the layer runs: under the Pallas kernels the default qkv order is stored as the kernels' packed
    BSCNH (slices and transposes around flash attention cost 88 us per BERT-large layer at B64 S128; see
    docs/layouts.md). Any other configured order is kept."""
    if pallas and layouts.qkv == LOGICAL["qkv"]:
        return dataclasses.replace(layouts, qkv=FLASH_QKV)
    return layouts


def qkv_projection(x: Annotated, *, kernel, bias, layouts: LayoutConfig, dtype) -> Annotated:
    """x @ w_qkv + b_qkv (AIB), stored in `layouts.qkv`; with `bias` None the product alone (flash attention then
    applies the bias)."""
    qkv = einsum(layouts.qkv, x, annotate(kernel.astype(dtype), "DCNH"))
    if bias is None:
        return qkv
    return Annotated(qkv.array + expand(bias.astype(dtype), "CNH", layouts.qkv), layouts.qkv)


def split_qkv(qkv: Annotated):
    """q (letters without C), k and v (S renamed T: the key/value positions)."""
    q = take(qkv, "C", 0)
    k, v = (rename(take(qkv, "C", i), S="T") for i in (1, 2))
    return q, k, v


def attention(qkv: Annotated, mask, *, ops, pallas: bool, layouts: LayoutConfig, seed, rate: float,
              qkv_bias=None, segments: bool = False) -> Annotated:
    """The attention core, stored in `layouts.ctx`: XLA's unfused reference in the configured layouts, or flash
    attention on the packed qkv (BSCNH in, BSNH out) between transposes where the layouts differ. `qkv_bias` (CNH,
    pallas only): the projection's bias, which the flash kernels apply. `segments`: `mask` is the int32 segment ids
    (B, S) of packed rows, not a key mask."""
    if pallas:
        ctx = ops.attention_qkv(relayout(qkv, FLASH_QKV).array, mask, bias=qkv_bias, seed=seed, rate=rate, segments=segments)
        return relayout(annotate(ctx, FLASH_CTX), layouts.ctx)
    if qkv_bias is not None:
        raise ValueError("qkv_bias is applied inside flash attention only (pallas); add it in qkv_projection")
    q, k, v = split_qkv(qkv)
    ctx = ops.attention(q.array, k.array, v.array, mask, seed=seed, rate=rate, qkv_layout=q.layout,
                        scores_layout=layouts.scores, ctx_layout=layouts.ctx, segments=segments)
    return annotate(ctx, layouts.ctx)


def attention_output(ctx: Annotated, residual: Annotated, *, ops, kernel, bias, ln_scale, ln_bias,
                     layouts: LayoutConfig, dtype, seed, rate: float, eps: float) -> Annotated:
    """LN(x + dropout(ctx @ w_o + b_o)) (BDRLN), stored in `layouts.x` like its residual."""
    out = einsum(layouts.x, ctx, annotate(kernel.astype(dtype), "NHD"))
    return annotate(ops.bias_dropout_residual_layernorm(out.array, bias, residual.array, ln_scale, ln_bias,
                                                        seed=seed, rate=rate, eps=eps), layouts.x)


def ffn_intermediate(x: Annotated, *, kernel, layouts: LayoutConfig, dtype) -> Annotated:
    """z = x @ w_i, the pre-activation, stored in `layouts.h` (its bias and GELU run in `ffn_output`)."""
    return einsum(layouts.h, x, annotate(kernel.astype(dtype), "DF"))


def ffn_output(z: Annotated, residual: Annotated, *, ops, in_bias, kernel, bias, ln_scale, ln_bias,
               layouts: LayoutConfig, dtype, seed, rate: float, eps: float) -> Annotated:
    """LN(x + dropout(gelu(z + b_i) @ w_o2 + b_o2)) (BAD + BDRLN), stored in `layouts.x`."""
    out = ops.gelu_dense(z.array, in_bias, kernel.astype(dtype), layout=z.layout, out=layouts.x)
    return annotate(ops.bias_dropout_residual_layernorm(out, bias, residual.array, ln_scale, ln_bias,
                                                        seed=seed, rate=rate, eps=eps), layouts.x)


class SelfAttention(nnx.Module):
    """Multi-head self-attention with a padding mask, its output projection and the post-LN residual block."""

    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.config = config
        d, n, h = config.hidden_size, config.num_attention_heads, config.head_dim
        self.qkv_kernel = normal(rngs, (d, 3, n, h), config, "DCNH")  # the order its GEMMs read
        self.qkv_bias = zeros((3, n, h), config, "CNH")
        self.out_kernel = normal(rngs, (n, h, d), config, "NHD")
        self.out_bias = zeros((d,), config, "D")
        self.layer_norm = LayerNormParams(config)

    def __call__(self, x, mask, *, seeds, deterministic: bool, segments: bool = False):
        """x stored in `layouts.x` order (BSD by default); the result too. `mask`: the key mask (B, S), or with
        `segments` the segment ids (B, S) of packed rows."""
        cfg, dtype = self.config, self.config.compute_dtype
        ops, pallas = _ops.select(cfg.kernels), _ops.resolve(cfg.kernels) == "pallas"
        layouts = layouts_for(cfg.layout_config, pallas)
        x = constrain(annotate(x, layouts.x), between_blocks=True)  # block boundary: B over data/fsdp
        # Under the Pallas kernels the Q/K/V bias goes to flash attention, which applies it.
        bias = self.qkv_bias[...]
        qkv = constrain(qkv_projection(x, kernel=self.qkv_kernel[...], bias=None if pallas else bias,
                                       layouts=layouts, dtype=dtype))  # N split over tensor
        ctx = attention(qkv, mask, ops=ops, pallas=pallas, layouts=layouts, seed=seeds[0],
                        rate=0.0 if deterministic else cfg.attention_probs_dropout_prob,
                        qkv_bias=bias if pallas else None, segments=segments)
        return attention_output(ctx, x, ops=ops, kernel=self.out_kernel[...], bias=self.out_bias[...],
                                ln_scale=self.layer_norm.scale[...], ln_bias=self.layer_norm.bias[...],
                                layouts=layouts, dtype=dtype, seed=seeds[1],
                                rate=0.0 if deterministic else cfg.hidden_dropout_prob,
                                eps=cfg.layer_norm_eps).array


class FeedForward(nnx.Module):
    """Dense D->F, exact GELU, dense F->D, then the post-LN residual block."""

    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.config = config
        d, ff = config.hidden_size, config.intermediate_size
        self.in_kernel = normal(rngs, (d, ff), config, "DF")
        self.in_bias = zeros((ff,), config, "F")
        self.out_kernel = normal(rngs, (ff, d), config, "FD")
        self.out_bias = zeros((d,), config, "D")
        self.layer_norm = LayerNormParams(config)

    def __call__(self, x, *, seed, deterministic: bool):
        """x stored in `layouts.x` order (BSD by default); the result too."""
        cfg, dtype, layouts = self.config, self.config.compute_dtype, self.config.layout_config
        ops = _ops.select(cfg.kernels)
        x = constrain(annotate(x, layouts.x), between_blocks=True)  # block boundary: B over data/fsdp
        z = constrain(ffn_intermediate(x, kernel=self.in_kernel[...], layouts=layouts, dtype=dtype))  # F over tensor
        return ffn_output(z, x, ops=ops, in_bias=self.in_bias[...], kernel=self.out_kernel[...],
                          bias=self.out_bias[...], ln_scale=self.layer_norm.scale[...],
                          ln_bias=self.layer_norm.bias[...], layouts=layouts, dtype=dtype, seed=seed,
                          rate=0.0 if deterministic else cfg.hidden_dropout_prob, eps=cfg.layer_norm_eps).array


class EncoderLayer(nnx.Module):
    """One post-LN transformer layer: the self-attention block, then the feed-forward block."""

    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.attention = SelfAttention(config, rngs=rngs)
        self.feed_forward = FeedForward(config, rngs=rngs)

    def __call__(self, x, mask, *, key, deterministic: bool, segments: bool = False):
        # Three dropout sites per layer, each with its own seed derived from the layer's key.
        seeds = [seed_from_key(k) for k in jax.random.split(key, 3)]
        x = self.attention(x, mask, seeds=seeds[:2], deterministic=deterministic, segments=segments)
        return self.feed_forward(x, seed=seeds[2], deterministic=deterministic)
