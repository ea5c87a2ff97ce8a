"""The implementations of bias + GELU, first choice first (`pallas_kernels.registry`).

- `mosaic`: the Mosaic GPU kernels (`kernel_mgpu.py`), on Hopper or newer wherever they take the shard's shape
  (a width that is a multiple of 512 in 16-bit, 256 in 32-bit floats). Measured faster than Triton at every BERT shape
  on an H200: fwd+bwd 102 against 117 us at 8192x3072, 128 against 138 at 8192x4096, 404 against 506 at 32768x4096
  (kernels-h200.md, bias+GELU).
- `triton`: the Triton kernels (`kernel.py`), any shape.
- `xla`: the reference (`reference.py`).
"""

import dataclasses

from .. import registry
from ..registry import NEEDS_HOPPER, Implementation, Operator, Reference, Skip
from . import kernel, kernel_mgpu, reference


@dataclasses.dataclass(frozen=True)
class Call:
    """One shard's call: x (rows, width) in `dtype`, dropout `rate`."""

    rows: int
    width: int
    dtype: str
    rate: float


class Mosaic(Implementation):
    name, module = "mosaic", kernel_mgpu
    summary = "Mosaic GPU kernels (kernel_mgpu.py): Hopper+, width a multiple of 512 (16-bit) or 256 (32-bit)"

    def supports(self, call: Call, device):
        try:
            kernel_mgpu.check_shape(call.rows, call.width, call.dtype, self.default(call, device))
        except ValueError as e:
            return Skip(str(e))
        return None if device.hopper else NEEDS_HOPPER

    def default(self, call: Call, device):
        return kernel_mgpu.default_blocks(call.rows, call.width, call.rate, kind=device.kind)

    def candidates(self, config, call: Call, device, stage: str):
        return kernel_mgpu.candidate_blocks(config, stage=stage)


class Triton(Implementation):
    name, module = "triton", kernel
    summary = "Triton kernels (kernel.py)"

    def default(self, call: Call, device):
        return kernel.default_blocks(call.rows, call.width, call.rate)

    def candidates(self, config, call: Call, device, stage: str):
        return kernel.candidate_blocks(config, stage=stage)


OPERATOR = registry.register(Operator(
    "bias_gelu", "dropout(gelu(x + bias)) (BAD / BDRB)", (Mosaic(), Triton(), Reference(reference.bias_gelu)),
    ("mosaic", "triton", "xla")))
