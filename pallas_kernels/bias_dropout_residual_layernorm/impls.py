"""The implementations of BDRLN and of the plain layernorm, first choice first (`pallas_kernels.registry`).

- `mosaic`: the Mosaic GPU kernels (`kernel_mgpu.py`), on Hopper or newer where they take the shard's shape, for
  shards of at least `MIN_ROWS` rows, or `MIN_ROWS_REGISTER_SUMS` where the backward carries its column sums in
  registers (768 and 1024 wide); except with dropout where `TRITON_FROM_ROWS` names the GPU and width. Below those,
  Triton measured faster; from them Mosaic GPU took 0.83-1.00 (H200) and 0.87-1.00 (H100) of Triton's time, BERT-base's
  train step ran 2.0-2.8% faster, and at 8192 rows of 1024 it took 47.1 against Triton's 50.3 us of device time
  (kernels-h200.md and kernels-h100.md, BDRLN).
- `triton`: the Triton kernels (`kernel.py`), any shape.
- `xla`: the reference (`reference.py`).
"""

import dataclasses

import jax.numpy as jnp

from .. import registry
from ..registry import NEEDS_HOPPER, Implementation, Operator, Reference, Skip
from . import kernel, kernel_mgpu, reference

MIN_ROWS = 16384  # Mosaic GPU from this many rows where its backward sums columns in SMEM only ...
MIN_ROWS_REGISTER_SUMS = 8192  # ... and from this many where it carries some in registers (768 and 1024 wide)
# {(device-kind substring, width): rows from which Triton runs when rate > 0}: the H100 at 32768 x 1024 with dropout
# took 203.3-206.6 us of device time on Triton, 215.2-219.8 on Mosaic GPU; equal at 16384 rows, and without dropout
# Mosaic GPU was faster (kernels-h100.md, BDRLN).
TRITON_FROM_ROWS = {("H100", 1024): 32768}


@dataclasses.dataclass(frozen=True)
class Call:
    """One shard's call: x (rows, width) in `dtype`, the output (and the residual) in `out_dtype`, dropout `rate`;
    whether there is a bias and a residual (the plain layernorm has neither)."""

    rows: int
    width: int
    dtype: str
    out_dtype: str
    rate: float
    bias: bool = True
    residual: bool = True


class Mosaic(Implementation):
    name, module = "mosaic", kernel_mgpu
    summary = "Mosaic GPU (kernel_mgpu.py): Hopper+, width a multiple of 256, >= 8192 rows (16384 wider than 1024)"

    def supports(self, call: Call, device):
        blocks = self.default(call, device)
        try:
            kernel_mgpu.check_shape(call.rows, call.width, call.dtype, call.out_dtype, blocks)
        except ValueError as e:
            return Skip(str(e))
        if not device.hopper:
            return NEEDS_HOPPER
        least = MIN_ROWS_REGISTER_SUMS if blocks.bwd_register_sums else MIN_ROWS
        if call.rows < least:
            return Skip(f"rows={call.rows} < {least}: Triton measured faster there", "slower")
        for (kind, width), rows in TRITON_FROM_ROWS.items():
            if call.rate and call.width == width and kind in device.kind and call.rows >= rows:
                return Skip(f"{kind} at rows={call.rows} >= {rows} of width {width} with dropout: Triton measured "
                            "faster there", "slower")
        return None

    def default(self, call: Call, device):
        return kernel_mgpu.default_blocks(call.rows, call.width, call.rate)

    def candidates(self, config, call: Call, device, stage: str):
        return kernel_mgpu.candidate_blocks(config, stage=stage)


class Triton(Implementation):
    name, module = "triton", kernel
    summary = "Triton kernels (kernel.py)"

    def default(self, call: Call, device):
        return kernel.default_blocks(call.rows, call.width, call.rate)

    def candidates(self, config, call: Call, device, stage: str):
        return kernel.candidate_blocks(config, stage=stage)


MOSAIC, TRITON = Mosaic(), Triton()
BDRLN = registry.register(Operator(
    "bias_dropout_residual_layernorm", "LN(residual + dropout(x + bias)) (BDRLN / BLNRD)",
    (MOSAIC, TRITON, Reference(reference.bias_dropout_residual_layernorm)), ("mosaic", "triton", "xla")))
LAYER_NORM = registry.register(Operator(
    "layer_norm", "LN(x), the MLM head's", (MOSAIC, TRITON, Reference(reference.layer_norm)),
    ("mosaic", "triton", "xla")))


def call_of(x, residual, bias, rate: float, rows: int) -> Call:
    return Call(rows, x.shape[-1], jnp.dtype(x.dtype).name, jnp.dtype((x if residual is None else residual).dtype).name,
                float(rate), bias is not None, residual is not None)
