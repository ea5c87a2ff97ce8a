"""The implementations of attention (q, k, v apart) and attention_qkv (one packed projection), first choice first.

- `mosaic_bwd`: the Triton forward and the Mosaic GPU one-kernel backward (`kernel_mgpu.py`): Hopper or newer,
  S = T = 128, H = 64, bfloat16, a key mask or packed rows' segment ids. Against Triton's one-kernel backward at B64
  N16 S128 it measured 94.3 -> 58.1 us at p = 0 and 103.7 -> 70.5 at p = 0.1, 59.2 in its persistent form (H200;
  faster on the H100 too: kernels-h200.md and kernels-h100.md, Attention).
- `triton`: FlashAttention-2 forward and backward (`forward.py`, `backward.py`), any shape the tiles fit.
- `xla`: the reference (`reference.py`), which materialises the BNST scores.
- `mosaic` (only when named): both passes in Mosaic GPU; its forward measured no faster in the train step.
- `mosaic_long` (only when named): both passes in Mosaic GPU for S = T a multiple of 128 above 128, H = 64,
  bfloat16 (`kernel_mgpu_long.py`): persistent wgmma kernels that skip the key blocks past a row's last real key;
  a key mask only.
"""

import dataclasses

import jax.numpy as jnp

from .. import registry
from ..registry import NEEDS_HOPPER, Implementation, Operator, Reference, Skip
from . import backward as _backward
from . import blocks as _blocks
from . import forward as _forward
from . import kernel_mgpu, kernel_mgpu_long, reference


@dataclasses.dataclass(frozen=True)
class Call:
    """One shard's call: q (batch, seq_q, heads, head_dim), k and v (batch, seq_k, heads, head_dim) in `dtype` (packed:
    one (batch, seq_q, 3, heads, head_dim) array), dropout `rate` (0 without a seed)."""

    batch: int
    seq_q: int
    seq_k: int
    heads: int
    head_dim: int
    dtype: str
    rate: float
    packed: bool = False
    segments: bool = False  # packed sequences: the mask holds segment ids (`reference.segment_mask`)


def _untiled(fn):
    """A Mosaic GPU pass in the Triton passes' signature: it takes no tile sizes; `segments` reaches it only when set
    (a key-mask-only kernel has no such argument: `Kernels(segments=False)` keeps such calls away)."""
    def run(*args, blocks, segments=False, **kw):
        return fn(*args, **kw, **({"segments": True} if segments else {}))
    return run


_mosaic_forward, _mosaic_backward = _untiled(kernel_mgpu.forward), _untiled(kernel_mgpu.backward)


class Kernels(Implementation):
    """A forward and a backward with the contract of `forward.forward` / `backward.backward`, configured by
    `blocks.Blocks` (the Mosaic GPU passes read only `fold_bias` of it)."""

    def __init__(self, name: str, forward, backward, summary: str, *, mosaic=None, tuned_stages=("fwd", "bwd"),
                 segments: bool = True):
        """`mosaic`: for Mosaic GPU kernels, the module whose `check_shape` says which calls they take; `segments`:
        whether they take packed rows' segment ids."""
        self.name, self.forward, self.backward, self.summary = name, forward, backward, summary
        self.mosaic, self.tuned_stages, self.segments = mosaic, tuned_stages, segments

    def supports(self, call: Call, device):
        if self.mosaic is None:
            return None
        if call.segments and not self.segments:
            return Skip("takes a key mask only, not packed rows' segment ids", "call")
        try:
            self.mosaic.check_shape(call.seq_q, call.seq_k, call.head_dim, call.dtype)
        except ValueError as e:
            return Skip(str(e))
        return None if device.hopper else NEEDS_HOPPER

    def default(self, call: Call, device):
        return _blocks.default_blocks(call.seq_q, call.head_dim, call.seq_k)

    def candidates(self, config, call: Call, device, stage: str):
        if stage not in self.tuned_stages:
            return []
        return _blocks.candidate_blocks(config, call.seq_q, call.head_dim, call.seq_k, stage=stage)


MOSAIC_BWD = Kernels("mosaic_bwd", _forward.forward, _mosaic_backward, "Triton forward, Mosaic GPU one-kernel backward "
                     "(kernel_mgpu.py): Hopper+, S = T = 128, H = 64, bf16", mosaic=kernel_mgpu, tuned_stages=("fwd",))
TRITON = Kernels("triton", _forward.forward, _backward.backward, "FlashAttention-2 in Triton (forward.py, backward.py)")
MOSAIC = Kernels("mosaic", _mosaic_forward, _mosaic_backward, "both passes in Mosaic GPU (kernel_mgpu.py; only when "
                 "named): Hopper+, S = T = 128, H = 64, bf16", mosaic=kernel_mgpu, tuned_stages=())
MOSAIC_LONG = Kernels("mosaic_long", _untiled(kernel_mgpu_long.forward), _untiled(kernel_mgpu_long.backward),
                      "both passes in Mosaic GPU for long rows (kernel_mgpu_long.py; only when named): Hopper+, "
                      "S = T = 256, 384, ..., H = 64, bf16", mosaic=kernel_mgpu_long, tuned_stages=(), segments=False)

ATTENTION = registry.register(Operator(
    "attention", "softmax(q k^T / sqrt(H), key mask) with dropout, times v (SM, BS)",
    (MOSAIC_BWD, TRITON, MOSAIC, MOSAIC_LONG, Reference(reference.attention)), ("mosaic_bwd", "triton", "xla")))
ATTENTION_QKV = registry.register(Operator(
    "attention_qkv", "the same on the packed (B, S, 3, N, H) projection, its bias folded in (AIB)",
    (MOSAIC_BWD, TRITON, MOSAIC, MOSAIC_LONG, Reference(reference.attention_qkv)),
    ("mosaic_bwd", "triton", "xla")))


def call_of(q_shape, k_shape, dtype, rate: float, packed: bool, segments: bool = False) -> Call:
    """The Call of q (B, S, N, H) and k (B, T, N, H) shapes (packed: both the (B, S, 3, N, H) projection's)."""
    if packed:
        b, s, _, n, h = q_shape
        return Call(b, s, s, n, h, jnp.dtype(dtype).name, float(rate), True, segments)
    b, s, n, h = q_shape
    return Call(b, s, k_shape[1], n, h, jnp.dtype(dtype).name, float(rate), False, segments)
