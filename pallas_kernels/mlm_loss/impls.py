"""The implementations of the MLM cross-entropy (the tied decoder's logits, their softmax cross-entropy and argmax),
first choice first (`pallas_kernels.registry`).

- `triton`: the fused Pallas kernels (`fused.py`, `kernel.py`): GEMM tiles reduced to the loss in registers, so the
  (rows, V) float32 logits never exist; 16-bit h and a width that is a multiple of 16. 2.16x faster than the
  reference at BERT-large's 1280 masked rows (kernels-h200.md, MLM loss).
- `chunked`: pure JAX (`chunked.py`): a `lax.scan` over 16384-column vocabulary chunks with XLA's GEMMs and a
  recomputing backward; any dtype and width.
- `xla`: the reference (`reference.py`), which materialises the logits.
"""

import dataclasses

from .. import registry
from ..registry import Implementation, Operator, Reference, Skip
from . import fused, kernel, reference
from .chunked import mlm_cross_entropy_chunked


@dataclasses.dataclass(frozen=True)
class Call:
    """One shard's call: h (rows, width) in `dtype` against a (vocab, width) table."""

    rows: int
    vocab: int
    width: int
    dtype: str


class Triton(Implementation):
    name = "triton"
    summary = "fused Pallas GEMM + cross-entropy kernels (fused.py, kernel.py): 16-bit h, width a multiple of 16"

    def supports(self, call: Call, device):
        why = fused.unsupported(call.dtype, call.vocab, call.width, self.default(call, device))
        return None if why is None else Skip(why)

    def default(self, call: Call, device):
        return kernel.Blocks()


OPERATOR = registry.register(Operator(
    "mlm_cross_entropy", "the tied MLM decoder + softmax cross-entropy and argmax",
    (Triton(), Reference(mlm_cross_entropy_chunked, "chunked", "vocabulary chunks in a lax.scan (chunked.py)"),
     Reference(reference.mlm_cross_entropy)), ("triton", "chunked", "xla")))
