"""The implementations of the embedding block, first choice first (`pallas_kernels.registry`).

- `triton`: the Triton kernels (`kernel.py`), which gather the table rows themselves; not where the mesh splits the
  tables (the `tensor` axis splits V, `fsdp` splits D: jaxformer.sharding's PARAM_RULES), since they read whole
  tables: there the reference lets XLA gather from the split tables instead of all-gathering a table per call.
  It runs packed rows (position ids) too: the kernels gather the position rows by id, and XLA scatter-adds the
  position table's gradient by id as it does the word table's.
  fwd+bwd 1.99x / 1.64x faster than XLA at BERT-large B64 S128 / B16 S512 (kernels-h200.md, embedding).
- `xla`: the reference (`reference.py`).
"""

import dataclasses

from .. import registry
from ..registry import Implementation, Operator, Reference, Skip
from . import kernel, reference

TABLE_AXES = ("tensor", "fsdp")  # mesh axes that split the embedding tables


@dataclasses.dataclass(frozen=True)
class Call:
    """One shard's call: `rows` = B*S ids, tables `width` wide, the output in `dtype`, dropout `rate`, and the mesh's
    axis sizes (those above 1)."""

    rows: int
    width: int
    dtype: str
    rate: float
    mesh: tuple[tuple[str, int], ...] = ()
    positions: bool = False  # position ids given (packed rows), not positions 0..S-1 (the kernels gather by id)


class Triton(Implementation):
    name = "triton"
    summary = "Triton kernels gathering the table rows (kernel.py); not where the mesh splits the tables"

    def supports(self, call: Call, device):
        split = [f"{axis}={size}" for axis, size in call.mesh if axis in TABLE_AXES and size > 1]
        if split:
            return Skip(f"the mesh splits the tables ({', '.join(split)}): the kernels read whole tables")
        return None

    def default(self, call: Call, device):
        return kernel.default_blocks(call.rows, call.width, call.rate)

    def candidates(self, config, call: Call, device, stage: str):
        return kernel.candidate_blocks(config, stage=stage)


OPERATOR = registry.register(Operator(
    "embedding_layernorm", "dropout(LN(word[ids] + position + token_type[type_ids]))",
    (Triton(), Reference(reference.embedding_layernorm)), ("triton", "xla")))


def mesh_axes(mesh) -> tuple[tuple[str, int], ...]:
    """The axis sizes above 1 of `mesh` (a mesh, a mapping of axis sizes, or None), as a Call holds them."""
    sizes = {} if mesh is None else dict(getattr(mesh, "shape", mesh))
    return tuple(sorted((a, int(n)) for a, n in sizes.items() if n > 1))
