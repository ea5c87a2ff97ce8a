"""The implementations of the scaled, masked softmax + dropout on attention scores (`pallas_kernels.registry`).

- `triton`: the Triton kernels (`kernel.py`). Not on the model's path: flash attention and XLA's own softmax fusion
  measured faster (kernels-h200.md, Softmax); `attention.unfused_attention` and the benchmarks call it.
- `xla`: the reference (`reference.py`).
"""

import dataclasses

from .. import registry
from .._pallas import row_block_candidates
from ..registry import Implementation, Operator, Reference
from . import kernel, reference


@dataclasses.dataclass(frozen=True)
class Call:
    """One call: scores of `rows_per_sequence` = N*S rows per example, `width` = T keys, in `dtype`, dropout `rate`."""

    rows_per_sequence: int
    width: int
    dtype: str
    rate: float


class Triton(Implementation):
    name = "triton"
    summary = "Triton kernels (kernel.py)"

    def default(self, call: Call, device):
        return kernel.default_blocks(call.rows_per_sequence, call.width)

    def candidates(self, config, call: Call, device, stage: str):
        """The row-wise kernels' forward list; the backward's rows per chunk and warps."""
        if stage == "fwd":
            return row_block_candidates(config, stage="fwd")
        return [dataclasses.replace(config, bwd_block_rows=br, bwd_num_warps=w)
                for br, w in ((4, 4), (8, 4), (16, 8), (32, 8))]


OPERATOR = registry.register(Operator(
    "softmax", "dropout(softmax(scale * scores, key mask)) (SM / BS)",
    (Triton(), Reference(reference.scaled_masked_softmax)), ("triton", "xla")))
