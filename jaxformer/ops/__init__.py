"""Which implementation runs each fused memory-bound operator.

The model asks `select(config.kernels)` for its operators. `kernels="xla"` gives each operator's jax.numpy reference
(XLA fuses it); `"pallas"` gives entry points that run, per call, the first implementation in the operator's order
below that supports the call's per-shard shapes, dtype, dropout, mesh and device (`pallas_kernels/registry.py`; a
skipped one is logged with its reason, as a warning where a call leaves the Pallas kernels); `"auto"` is "pallas" on a
GPU without sequence parallelism, else "xla". Why each order: docs/kernels.md.

embedding_layernorm: dropout(LN(word[ids] + position + token_type[type_ids]))
  1. triton      Triton kernels gathering the table rows (kernel.py); not where the mesh splits the tables
  2. xla         the jax.numpy reference (XLA fuses it)
bias_dropout_residual_layernorm: LN(residual + dropout(x + bias)) (BDRLN / BLNRD)
  1. mosaic      Mosaic GPU (kernel_mgpu.py): Hopper+, width a multiple of 256, >= 8192 rows (16384 wider than 1024)
  2. triton      Triton kernels (kernel.py)
  3. xla         the jax.numpy reference (XLA fuses it)
layer_norm: LN(x), the MLM head's
  1. mosaic      Mosaic GPU (kernel_mgpu.py): Hopper+, width a multiple of 256, >= 8192 rows (16384 wider than 1024)
  2. triton      Triton kernels (kernel.py)
  3. xla         the jax.numpy reference (XLA fuses it)
bias_gelu: dropout(gelu(x + bias)) (BAD / BDRB)
  1. mosaic      Mosaic GPU kernels (kernel_mgpu.py): Hopper+, width a multiple of 512 (16-bit) or 256 (32-bit)
  2. triton      Triton kernels (kernel.py)
  3. xla         the jax.numpy reference (XLA fuses it)
gelu_dense: gelu(x + bias) @ kernel, the feed-forward's activation and output product (BAD + its GEMM)
  1. split       bias+GELU's own kernels (pallas_kernels.bias_gelu), then XLA's GEMM
  2. xla         the jax.numpy reference (XLA fuses it)
     mosaic      bias+GELU's Mosaic GPU forward writing GELU' too, XLA's GEMM; the backward's input gradient a Mosaic GPU GEMM times GELU' in its epilogue (kernel_mgpu.py): Hopper+, 16-bit, rows % 128, F % 512, D % 64
attention: softmax(q k^T / sqrt(H), key mask) with dropout, times v (SM, BS)
  1. mosaic_bwd  Triton forward, Mosaic GPU one-kernel backward (kernel_mgpu.py): Hopper+, S = T = 128, H = 64, bf16
  2. triton      FlashAttention-2 in Triton (forward.py, backward.py)
  3. xla         the jax.numpy reference (XLA fuses it)
     mosaic      both passes in Mosaic GPU (kernel_mgpu.py; only when named): Hopper+, S = T = 128, H = 64, bf16
     mosaic_long both passes in Mosaic GPU for long rows (kernel_mgpu_long.py; only when named): Hopper+, S = T = 256, 384, ..., H = 64, bf16
attention_qkv: the same on the packed (B, S, 3, N, H) projection, its bias folded in (AIB)
  1. mosaic_bwd  Triton forward, Mosaic GPU one-kernel backward (kernel_mgpu.py): Hopper+, S = T = 128, H = 64, bf16
  2. triton      FlashAttention-2 in Triton (forward.py, backward.py)
  3. xla         the jax.numpy reference (XLA fuses it)
     mosaic      both passes in Mosaic GPU (kernel_mgpu.py; only when named): Hopper+, S = T = 128, H = 64, bf16
     mosaic_long both passes in Mosaic GPU for long rows (kernel_mgpu_long.py; only when named): Hopper+, S = T = 256, 384, ..., H = 64, bf16
mlm_cross_entropy: the tied MLM decoder + softmax cross-entropy and argmax
  1. triton      fused Pallas GEMM + cross-entropy kernels (fused.py, kernel.py): 16-bit h, width a multiple of 16
  2. chunked     vocabulary chunks in a lax.scan (chunked.py)
  3. xla         the jax.numpy reference (XLA fuses it)

    python -m jaxformer.ops --table                                  # the table above, from the registry
    python -m jaxformer.ops --config large --seq-len 128 --gpu h100  # what each call of that model runs, and why
                                                                     # (jaxformer/ops/__main__.py)
"""

from __future__ import annotations

import types

import pallas_kernels.attention as _attention
import pallas_kernels.bias_dropout_residual_layernorm as _bdrln
import pallas_kernels.bias_gelu as _bias_gelu
import pallas_kernels.embedding_layernorm as _embedding
import pallas_kernels.gelu_dense as _gelu_dense
import pallas_kernels.mlm_loss as _mlm_loss
from pallas_kernels import registry

from .. import sharding

KERNELS = ("xla", "pallas", "auto")
# The model's operators and their kernels="pallas" entry points (each asks the registry per call).
PALLAS = {
    "embedding_layernorm": _embedding.embedding_layernorm,
    "bias_dropout_residual_layernorm": _bdrln.bias_dropout_residual_layernorm,
    "layer_norm": _bdrln.layer_norm,
    "bias_gelu": _bias_gelu.bias_gelu,
    "gelu_dense": _gelu_dense.gelu_dense,
    "attention": _attention.sharded_flash_attention,
    "attention_qkv": _attention.sharded_flash_attention_qkv,
    "mlm_cross_entropy": _mlm_loss.mlm_cross_entropy,
}


def resolve(kernels: str, device: registry.Device | None = None) -> str:
    """"auto" is "pallas" on a GPU (measured faster: benchmarks/results/kernels-h200.md) and "xla" elsewhere, and
    "xla" with sequence parallelism (S split over `tensor`; the kernels' shard_map splits only B and heads). Called
    while tracing, so it sees the mesh the trainer sets."""
    if kernels not in KERNELS:
        raise ValueError(f"kernels={kernels!r} must be one of {KERNELS}")
    if kernels != "auto":
        return kernels
    device = registry.Device.current() if device is None else device
    return "pallas" if device.platform == "gpu" and not sharding.sequence_parallel_enabled() else "xla"


def select(kernels: str) -> types.SimpleNamespace:
    """The operators for `kernels` ("xla", "pallas" or "auto"), as attributes named like the keys of `PALLAS`."""
    if resolve(kernels) == "pallas":
        return types.SimpleNamespace(**PALLAS)
    return types.SimpleNamespace(**{op: registry.operator(op).implementation("xla").fn for op in PALLAS})


def table() -> str:
    """Each operator of `PALLAS` and its implementations, in the order kernels="pallas" tries them."""
    lines = []
    for name in PALLAS:
        op = registry.operator(name)
        lines.append(f"{name}: {op.summary}")
        lines += [f"  {i}. {impl:<11} {op.implementation(impl).summary}" for i, impl in enumerate(op.order, 1)]
        lines += [f"     {impl.name:<11} {impl.summary}" for impl in op.implementations if impl.name not in op.order]
    return "\n".join(lines)
