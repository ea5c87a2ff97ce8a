"""Meshes, the one logical-axis rules table, and the checks a mesh must pass before anything compiles.

GSPMD does the communication: parameters carry their logical axis names (the DESIGN.md letters) as Flax metadata
(`out_sharding`, set in `model.py`), activations are constrained at layer boundaries with `constrain(x, "BSD")`,
and the rules below turn letters into mesh axes, in the manner of MaxText's logical axis rules. XLA then inserts
the collectives: gradient all-reduces (data), per-layer parameter all-gathers and gradient reduce-scatters (fsdp,
ZeRO-3), activation all-reduces after the row-parallel projections (tensor, Megatron).

Mesh axes, outermost first: pipeline, data, fsdp, tensor (tensor innermost: it talks every layer, so it gets the
neighbouring devices). Every axis is always present, size 1 when unused, so specs never depend on the mesh.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from pallas_kernels.mesh import BATCH_AXES, HEAD_AXIS, MESH_AXES, current_mesh

from .config import BertConfig, MeshConfig, TrainConfig
from .pipeline import Pipeline

MESH_ORDER = ("pipeline", "data", "fsdp", "tensor")

# Parameters. Megatron: the QKV projection (DCNH) and FFN-in (DF) are column-parallel (their N / F output axis is
# split), the attention-out (NHD) and FFN-out (FD) projections row-parallel (their N / F input axis is split), so
# each block needs one all-reduce forward; the tied embedding / MLM decoder (VD) and the output bias split V.
# FSDP shards every weight over `fsdp` on D, the axis tensor parallelism leaves alone. The stacked layer axis L is
# split into pipeline stages. Letters not listed (C, H, and E: the second width of a DxD matrix) stay whole.
PARAM_RULES: dict[str, Any] = {"L": "pipeline", "V": "tensor", "N": "tensor", "F": "tensor", "D": "fsdp"}

# Activations. The batch is split over data and fsdp; heads (inside attention), feed-forward width (inside the
# FFN) and vocabulary (MLM logits) follow their tensor-split weights. With pipeline > 1 the embeddings and heads
# outside the layer stack run replicated over the `pipeline` axis (as jaxformer/pipeline.py expects: it broadcasts
# the stack's output to every stage); they are a small part of a step, and keeping `pipeline` off B keeps it free for
# the stage axis that the pipeline's `vmap(spmd_axis_name="pipeline")` puts on activations inside the stack.
ACTIVATION_RULES: dict[str, Any] = {"B": BATCH_AXES, "N": HEAD_AXIS, "F": HEAD_AXIS, "V": HEAD_AXIS}

# Megatron's sequence parallelism (an option, `--sequence-parallel`): between blocks, where the residual stream
# goes through dropout, the residual add and layernorm, its S axis is split over `tensor` as well. GSPMD then turns
# each row-parallel projection's all-reduce into a reduce-scatter (onto the S split) and the next column-parallel
# projection gathers S back (an all-gather): the same bytes on the wire, but the layernorm/dropout work and the
# activations between blocks are divided by `tensor`. Only layer-boundary constraints (`between_blocks=True`) use it.
SEQUENCE_RULES: dict[str, Any] = {**ACTIVATION_RULES, "S": "tensor"}
_SEQUENCE_PARALLEL = contextvars.ContextVar("jaxformer_sequence_parallel", default=False)


@contextlib.contextmanager
def sequence_parallel(enabled: bool = True):
    """Trace under this to split the residual stream's S over `tensor` between blocks (the trainer sets it)."""
    token = _SEQUENCE_PARALLEL.set(bool(enabled))
    try:
        yield
    finally:
        _SEQUENCE_PARALLEL.reset(token)


def sequence_parallel_enabled() -> bool:
    return _SEQUENCE_PARALLEL.get()


# ----------------------------------------------------------------------------------------------- meshes
def make_mesh(mesh: MeshConfig | str, devices=None) -> jax.sharding.Mesh:
    """A `jax.sharding.Mesh` over `devices` (default: all) with the axes of `mesh` (sizes resolved)."""
    devices = list(jax.devices() if devices is None else devices)
    cfg = (MeshConfig.parse(mesh) if isinstance(mesh, str) else mesh).resolve(len(devices))
    shape = tuple(getattr(cfg, a) for a in MESH_ORDER)
    # Several processes: `jax.devices()` lists them process by process (CPU, and GPU where ids are sorted), so a
    # row-major reshape gives each process neighbouring indices on the outer axes and whole inner blocks: a batch
    # split over `data` (and `fsdp`) leaves each process one contiguous block of rows, the block it reads
    # (`distributed.batch_block` checks it when the steps are built).
    try:  # a topology-aware device order on GPUs/TPUs; plain order on CPU
        from jax.experimental import mesh_utils
        grid = mesh_utils.create_device_mesh(shape, devices)
    except Exception:  # noqa: BLE001 (any failure of the heuristic: fall back to the given order)
        grid = np.array(devices).reshape(shape)
    return jax.sharding.Mesh(grid, MESH_ORDER)


def describe(mesh: jax.sharding.Mesh) -> str:
    """`data=2,fsdp=1,tensor=4,pipeline=1` of a mesh made by `make_mesh`, for logs."""
    return ",".join(f"{a}={mesh.shape[a]}" for a in MESH_AXES)


def validate(mesh: MeshConfig | str, model: BertConfig, tc: TrainConfig, n_devices: int | None = None) -> MeshConfig:
    """Every check a mesh must pass, before anything is compiled; returns the resolved MeshConfig.

    Raises ValueError naming the field and the value: mesh size vs device count, unknown axes, heads, feed-forward
    width and padded vocabulary vs `tensor`, hidden size vs `fsdp`, layers vs pipeline stages, batch vs
    data * fsdp * microbatches, gradient compression vs a data axis of one device.
    """
    n_devices = jax.device_count() if n_devices is None else n_devices
    m = (MeshConfig.parse(mesh) if isinstance(mesh, str) else mesh).resolve(n_devices)
    where = f"(mesh {m.spec()})"
    for field in ("num_attention_heads", "intermediate_size"):
        value = getattr(model, field)
        if value % m.tensor:
            raise ValueError(f"{field}={value} is not divisible by tensor={m.tensor} {where}")
    if model.padded_vocab_size % m.tensor:
        raise ValueError(f"tensor={m.tensor} does not divide the padded vocabulary (vocab_size={model.vocab_size} "
                         f"padded to {model.padded_vocab_size}) {where}")
    if model.hidden_size % m.fsdp:
        raise ValueError(f"hidden_size={model.hidden_size} is not divisible by fsdp={m.fsdp} {where}")
    stages = m.pipeline * tc.pipeline_repeats
    if model.num_hidden_layers % stages:
        raise ValueError(f"num_hidden_layers={model.num_hidden_layers} is not divisible by pipeline * "
                         f"pipeline_repeats = {m.pipeline} * {tc.pipeline_repeats} = {stages} {where}")
    split = m.data * m.fsdp * tc.microbatches
    if tc.batch_size % split:
        raise ValueError(f"batch_size={tc.batch_size} is not divisible by data * fsdp * microbatches = "
                         f"{m.data} * {m.fsdp} * {tc.microbatches} = {split} {where}")
    if tc.sequence_parallel:
        if tc.seq_len % m.tensor:
            raise ValueError(f"seq_len={tc.seq_len} is not divisible by tensor={m.tensor}, which --sequence-parallel "
                             f"splits it over {where}")
        if tc.kernels == "pallas":
            raise ValueError("kernels='pallas' with sequence_parallel=True: the Pallas kernels split only the batch "
                             "(and heads); use kernels='auto' or 'xla' (auto runs xla there)")
    # The schedule's own rules (e.g. the circular schedule needs microbatches >= stages).
    Pipeline(stages=m.pipeline, microbatches=tc.microbatches, repeats=tc.pipeline_repeats)
    compression = tc.compression_config()
    if compression is not None:  # it replaces the data axis's all-reduce: that axis needs two or more devices
        try:
            compression.check_mesh(m)
        except ValueError as e:
            raise ValueError(f"grad_compression={tc.grad_compression!r}: {e}") from None
    return m


# ----------------------------------------------------------------------------------------------- the rules
def logical_to_spec(names, rules: dict[str, Any], mesh=None, shape=None) -> P:
    """PartitionSpec of an array whose axes have logical `names` (letters or None) under `rules`.

    With `mesh`, mesh axes of size 1 and manual axes (inside a `shard_map`) are left out, and with `shape` too, so
    is any axis that does not divide its dimension (that dimension then stays whole). A mesh axis is used once.
    """
    sizes = dict(mesh.shape) if mesh is not None else None
    manual = set(getattr(mesh, "manual_axes", ()) or ()) if mesh is not None else set()
    used: set[str] = set()
    out = []
    for i, name in enumerate(names):
        target = rules.get(name) if name is not None else None
        axes = (target,) if isinstance(target, str) else tuple(target or ())
        keep = []
        for a in axes:
            if a in used or a in manual or (sizes is not None and sizes.get(a, 1) == 1):
                continue
            if shape is not None and shape[i] % (math.prod(sizes[b] for b in keep) * sizes[a]):
                continue
            keep.append(a)
        used.update(keep)
        out.append(None if not keep else keep[0] if len(keep) == 1 else tuple(keep))
    return P(*out)


def constrain(x, letters: str | None = None, *, between_blocks: bool = False):
    """`x` constrained to the sharding of its stored layout `letters` (e.g. "BSD", "CBSNH") under the current mesh
    (`jax.set_mesh`); a no-op without a mesh, or inside a `shard_map` over every axis.

    `x` may also be a layout-annotated tensor (`layouts.einsum.Annotated`: `.array` stored in `.layout`), which
    carries its letters; it comes back annotated. `between_blocks` marks the residual stream at a block boundary,
    which sequence parallelism (`sequence_parallel`) also splits on S."""
    if letters is None and hasattr(x, "layout") and hasattr(x, "array"):
        return type(x)(constrain(x.array, x.layout, between_blocks=between_blocks), x.layout)
    if letters is None or len(letters) != x.ndim:
        raise ValueError(f"layout {letters!r} does not name the {x.ndim} axes of an array of shape {x.shape}")
    mesh = current_mesh()
    if mesh is None or set(getattr(mesh, "manual_axes", ()) or ()) == set(mesh.axis_names):
        return x
    rules = SEQUENCE_RULES if between_blocks and _SEQUENCE_PARALLEL.get() else ACTIVATION_RULES
    return jax.lax.with_sharding_constraint(x, logical_to_spec(letters, rules, mesh, x.shape))


def _variables(model_or_state):
    state = model_or_state if isinstance(model_or_state, nnx.State) else nnx.state(model_or_state, nnx.Param)
    return jax.tree_util.tree_flatten_with_path(state, is_leaf=lambda v: isinstance(v, nnx.Variable))[0]


def param_specs(model_or_state, mesh=None) -> dict:
    """PartitionSpecs of the parameters (a nested dict shaped like `nnx.to_pure_dict(nnx.state(model, nnx.Param))`)
    from each Param's logical names (`out_sharding` metadata) and PARAM_RULES."""
    specs: dict = {}
    for path, var in _variables(model_or_state):
        names = var.get_metadata().get("out_sharding") or (None,) * len(var.shape)
        node = specs
        keys = [getattr(k, "key", getattr(k, "name", k)) for k in path]
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = logical_to_spec(names, PARAM_RULES, mesh, var.shape)
    return specs


def param_shardings(model_or_state, mesh: jax.sharding.Mesh) -> dict:
    """NamedShardings of the parameters on `mesh` (see `param_specs`)."""
    return jax.tree.map(lambda s: NamedSharding(mesh, s), param_specs(model_or_state, mesh),
                        is_leaf=lambda s: isinstance(s, P))


def batch_sharding(mesh: jax.sharding.Mesh) -> NamedSharding:
    """Every batch array is split on its leading (B) axis over the batch axes."""
    return NamedSharding(mesh, logical_to_spec("B", ACTIVATION_RULES, mesh))
