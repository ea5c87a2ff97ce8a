"""The implementations of the feed-forward's activation and output product, gelu(x + bias) @ kernel, first choice
first (`pallas_kernels.registry`).

- `split` (the default): bias+GELU's own kernels (`pallas_kernels.bias_gelu`), then XLA's GEMM; any shape and order.
- `xla`: the reference (`reference.py`).
- `mosaic` (only when named): bias+GELU's Mosaic GPU forward also writes GELU'(x + bias), then XLA's GEMM; the
  backward's input gradient is one Mosaic GPU wgmma GEMM that multiplies by that derivative and sums the bias gradient's
  columns in its epilogue (`kernel_mgpu.py`), instead of cuBLAS's product written to HBM and bias+GELU's backward
  reading it back. Hopper+, 16-bit, x stored with F last and the result in the same order, rows a multiple of 128, F of
  512, D of 64. On an H200 at BERT-large's feed-forward its backward kernel takes 120-124 us against 141 for cuBLAS +
  bias+GELU's backward, but the forward's extra write of GELU' costs 18 us (40 -> 58 us): equal in all, and the train
  step measured equal (kernels-h200.md, GELU in the GEMM's epilogue). What would make it pay: the epilogue under the
  next tile's products (two consumer warpgroups on alternating tiles), which this GEMM's pipeline does not do.
"""

import dataclasses

from .. import registry
from ..registry import NEEDS_HOPPER, Implementation, Operator, Reference, Skip
from ..bias_gelu import kernel_mgpu as bias_gelu_mgpu
from . import kernel_mgpu, reference


@dataclasses.dataclass(frozen=True)
class Call:
    """One shard's call: x (rows, width) in `dtype` stored `layout`, the result `depth` wide stored `out`."""

    rows: int
    width: int
    depth: int
    dtype: str
    layout: str = "BSF"
    out: str = "BSD"


def same_order(call: Call) -> bool:
    """The result keeps x's order with F (last) replaced by D: the kernel's (rows, F) -> (rows, D) view."""
    return call.layout.endswith("F") and call.out == call.layout[:-1] + "D"


class Mosaic(Implementation):
    name = "mosaic"
    summary = ("bias+GELU's Mosaic GPU forward writing GELU' too, XLA's GEMM; the backward's input gradient a Mosaic "
               "GPU GEMM times GELU' in its epilogue (kernel_mgpu.py): Hopper+, 16-bit, rows % 128, F % 512, D % 64")

    def supports(self, call: Call, device):
        if not same_order(call):
            return Skip(f"x stored {call.layout} into {call.out}: the kernel needs F last and the same order out")
        try:
            kernel_mgpu.check_shape(call.rows, call.depth, call.width, call.dtype, self.default(call, device))
            bias_gelu_mgpu.check_shape(call.rows, call.width, call.dtype,
                                       bias_gelu_mgpu.default_blocks(call.rows, call.width, 0.0, kind=device.kind))
        except ValueError as e:
            return Skip(str(e))
        return None if device.hopper else NEEDS_HOPPER

    def default(self, call: Call, device):
        return kernel_mgpu.Blocks()


class Split(Implementation):
    name = "split"
    summary = "bias+GELU's own kernels (pallas_kernels.bias_gelu), then XLA's GEMM"


OPERATOR = registry.register(Operator(
    "gelu_dense", "gelu(x + bias) @ kernel, the feed-forward's activation and output product (BAD + its GEMM)",
    (Split(), Reference(reference.gelu_dense), Mosaic()), ("split", "xla")))
