"""The one table that says which implementation runs each fused memory-bound operator.

The model never imports a kernel directly: it asks `ops.select(config.kernels)` for the operators and calls them.
Every operator has an `"xla"` implementation (the pure jax.numpy reference in `pallas_kernels/<op>/reference.py`,
left for XLA to fuse) and, where one exists, a `"pallas"` one (fused Pallas kernels, forward and backward).

| operator (Ivanov et al.)                        | xla (reference, XLA fuses)  | pallas                               |
|-------------------------------------------------|-----------------------------|--------------------------------------|
| embedding_layernorm (gathers + sum + LN + drop) | embedding_layernorm.ref     | embedding kernel.py fwd + bwd (*****)|
| bias_dropout_residual_layernorm (BDRLN / BLNRD) | bdrln.reference             | bdrln kernel.py fwd + bwd (****)     |
| layer_norm (the MLM head's)                     | bdrln.reference.layer_norm  | bdrln kernel.py (no bias/res) (****) |
| bias_gelu (BAD / BDRB)                          | bias_gelu.reference         | kernel_mgpu.py (Hopper+) / kernel.py |
| attention (SM / BS, or fused flash attention)   | attention.reference         | attention kernel.py (flash) (***)    |
| attention_qkv (the same on packed BSCNH q/k/v)  | attention.reference (**)    | the same, packed (***)               |
| + the Q/K/V projection bias (AIB)               | XLA add after the GEMM      | inside flash at S <= 128, else XLA   |
| mlm_cross_entropy (MLM decoder + softmax CE)    | mlm_loss.reference (logits) | mlm_loss kernel.py fwd + bwd (*)     |

(*) `mlm_loss/fused.py` (session 30): Pallas GEMM tiles of the logits reduced in registers to the loss's per-row
partials in the forward, recomputed in the backward into d_logits in the compute dtype for two XLA (cuBLAS) GEMMs, so
the (rows, V) float32 logits never exist. Where the kernels do not apply (float32 compute, a width that is not a
multiple of 16) it runs `mlm_loss/chunked.py`, a `lax.scan` over 16384-column vocabulary chunks with XLA's GEMMs and
a recomputing custom VJP (the `pallas` row before session 30). With the vocabulary split over `tensor` the model keeps
the logits path (`MLMHead.cross_entropy`: a vocabulary-parallel cross-entropy).

(**) `attention_qkv` slices the packed (B, S, 3, N, H) projection for the reference; the Pallas kernels read it in
place and write one packed gradient. Under pallas the layer passes the projection's bias to `attention_qkv(bias=)`:
the kernels apply it where that measured faster (`BlockSizes.fold_bias`, with the one-kernel backward at S <= 128),
and its gradient is summed from the dQKV tiles the backward kernels store. Where XLA adds it (S > 128), the add is
written on the GEMM's 2-D output, which XLA puts into the GEMM's cuBLAS bias epilogue when the GEMMs are cuBLAS calls
(`TrainConfig.xla_gemm="cublas"`, which `"auto"` means on one device; benchmarks/results/train-h200.md, sessions
15-16).
(***) At S = T = 128, H = 64 with bfloat16 inputs on Hopper-or-newer GPUs the backward is attention/kernel_mgpu.py
(Mosaic GPU, `BlockSizes.mgpu_bwd`, persistent over the heads since session 19; measured faster on the H200 and
H100, session 18, and again on the H200, session 19); elsewhere all Triton. The forward stays Triton's: its Mosaic
GPU form (`BlockSizes.mgpu_fwd`, opt-in) showed no gain in timed chains or the train step (session 20).
(****) On Hopper-or-newer GPUs, for shards of >= 8192 rows at 768 and 1024 wide (>= 16384 at wider shapes) where its
shape checks pass, the Mosaic GPU version (`bdrln/kernel_mgpu.py`; `backend="auto"`, the default, sessions 20-22;
on an H100 at 32768 rows of 1024 with dropout Triton's, session 23). Either backward's partial sums of the parameter
gradients are added up by one `column_sums` launch (`pallas_kernels/_pallas.py`).
The encoder layer calls `attention_qkv` under pallas and `attention` (with its layout arguments) under xla
(`jaxformer/layer.py`); `attention`'s pallas entry serves callers with separate q, k, v.

(*****) The forward gathers the word and token-type rows itself; the backward writes the gathered rows' float32
gradient, which XLA scatter-adds into the word table's (as `jnp.take` transposes). fwd+bwd 1.99x / 1.64x over XLA at
BERT-large B64 S128 / B16 S512 (H200 device time, session 29). Where a mesh splits the tables (`tensor` or `fsdp`)
the pallas entry runs the reference.

Benchmarks and the reasons for each choice: benchmarks/results/kernels-<gpu>.md. Mosaic GPU (Hopper) versions of
BDRLN and bias+GELU exist (`pallas_kernels/*/kernel_mgpu.py`). bias+GELU's default backend ("auto") runs them on
Hopper-or-newer GPUs where the shape allows (measured faster than its Triton kernels at every BERT shape on an
H200) and the Triton ones elsewhere; BDRLN's and layer_norm's ("auto" too, since session 20) run them on shards of
>= 16384 rows (measured 0-17% faster there on an H200 and an H100), and from 8192 rows at 768 and 1024 wide, where
their backward carries column sums in registers (BERT-base's train step 2.0-2.8% faster, session 21; at 8192 rows of
1024, BERT-large's B64 S128 and B16 S512 on one GPU, 6% less device time than Triton's, session 22); Triton's below.
"""

from __future__ import annotations

import types

import jax

import pallas_kernels.bias_dropout_residual_layernorm as _bdrln
import pallas_kernels.bias_gelu as _bias_gelu
import pallas_kernels.attention as _attention_kernels

from . import sharding
from pallas_kernels.attention import reference as _attention
import pallas_kernels.embedding_layernorm as _embedding_layernorm
from pallas_kernels import mlm_loss as _mlm_loss


TABLE = {
    "embedding_layernorm": {"xla": _embedding_layernorm.reference.embedding_layernorm,
                            "pallas": _embedding_layernorm.embedding_layernorm},
    "bias_dropout_residual_layernorm": {"xla": _bdrln.reference.bias_dropout_residual_layernorm,
                                        "pallas": _bdrln.bias_dropout_residual_layernorm},
    "layer_norm": {"xla": _bdrln.reference.layer_norm, "pallas": _bdrln.layer_norm},
    "bias_gelu": {"xla": _bias_gelu.reference.bias_gelu, "pallas": _bias_gelu.bias_gelu},
    "attention": {"xla": _attention.attention, "pallas": _attention_kernels.sharded_flash_attention},
    "attention_qkv": {"xla": _attention.attention_qkv, "pallas": _attention_kernels.sharded_flash_attention_qkv},
    "mlm_cross_entropy": {"xla": _mlm_loss.mlm_cross_entropy, "pallas": _mlm_loss.mlm_cross_entropy_fused},
}


def resolve(kernels: str) -> str:
    """"auto" is "pallas" on a GPU (measured faster: benchmarks/results/kernels-h200.md) and "xla" elsewhere, and
    "xla" with sequence parallelism (S split over `tensor`; the kernels' shard_map splits only B and heads).
    Pipelines use the kernels since `batch_shard_map` shard_maps them on a pipeline mesh (before, XLA all-gathered
    activations every tick): pipeline=2 m=4 measured 1548 vs 1266 seq/s with remat, 1335 vs 868 without
    (benchmarks/results/distributed-2xh200.md, session 5).
    Called while tracing, so it sees the mesh the trainer sets."""
    if kernels == "auto":
        if jax.default_backend() != "gpu":
            return "xla"
        return "xla" if sharding.sequence_parallel_enabled() else "pallas"
    return kernels


def select(kernels: str) -> types.SimpleNamespace:
    """The operators for `kernels` ("xla", "pallas" or "auto"), as attributes named like the rows of `TABLE`."""
    kernels = resolve(kernels)
    chosen = {}
    for op, impls in TABLE.items():
        if kernels not in impls:
            available = sorted(k for k, impls_ in TABLE.items() if kernels in impls_)
            raise ValueError(f"kernels={kernels!r} has no implementation of {op!r} yet "
                             f"(available for {kernels!r}: {available or 'none'}); use kernels='xla'")
        chosen[op] = impls[kernels]
    return types.SimpleNamespace(**chosen)
