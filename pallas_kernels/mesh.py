"""The mesh-axis vocabulary and running a kernel per shard.

The mesh axes are `data`, `fsdp`, `tensor` and `pipeline` (outermost first in `jaxformer.sharding.make_mesh`:
pipeline, data, fsdp, tensor). A `pallas_call` has no sharding rule, so the kernels' entry points run under
`batch_shard_map`: per batch shard (`data`, `fsdp`), per head shard (`tensor`) and per pipeline stage.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor", "pipeline")  # every mesh has all four, size 1 when unused
BATCH_AXES = ("data", "fsdp")  # split the batch (B)
HEAD_AXIS = "tensor"  # splits attention heads, feed-forward width and vocabulary (Megatron)
PIPELINE_AXIS = "pipeline"  # splits the layer stack into stages


def _batch_axes(mesh) -> tuple[str, ...]:
    """The batch axes a kernel call is split over: not those a surrounding shard_map already made manual."""
    manual = set(getattr(mesh, "manual_axes", ()) or ())
    return tuple(a for a in BATCH_AXES if a in mesh.axis_names and a not in manual and mesh.shape[a] > 1)


def shard_counts(mesh, *, heads: bool = False) -> tuple[int, int]:
    """(batch shards, head shards) of `batch_shard_map` on `mesh` (a mesh, a mapping of axis sizes, or None): the
    leading dimension is split over the batch axes, and with `heads` the head dimension over `tensor`."""
    sizes = {} if mesh is None else dict(getattr(mesh, "shape", mesh))
    batch = 1
    for a in BATCH_AXES:
        batch *= sizes.get(a, 1)
    return batch, sizes.get(HEAD_AXIS, 1) if heads else 1


def current_mesh():
    """The mesh set with `jax.set_mesh` (or `with mesh:`), or None."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh is None or mesh.empty:
        return None
    return mesh


def batch_shard_map(fn, n_batched: int, *, head_dims=None, out_head_dim: int | None = None):
    """Run `fn(row_offset, *batched, *replicated)` per batch shard when a mesh with batch axes is set.

    A `pallas_call` has no sharding rule: under a sharded `jit` XLA would gather its inputs and run it replicated.
    Here the first `n_batched` arguments are split over the mesh's batch axes on their leading dimension, the rest
    are replicated, and every output comes back split on its leading dimension: activations, or per-shard partial
    sums stacked on a leading axis, which the caller reduces. `None` arguments (absent optional operands) reach
    `fn` as `None`. `row_offset` is the shard's first row (in units of the leading dimension), for dropout indices.
    On a mesh with a `pipeline` axis the call is always a `shard_map`, so that the pipeline's stage `vmap` splits
    it over the stages.

    Heads (tensor parallelism): with `head_dims` (for each argument, the dimension split over the mesh's `tensor`
    axis, e.g. attention heads or feed-forward width, or None; missing trailing entries are None), those dimensions
    are split over `tensor` too, every output is split on `out_head_dim`, and the call is
    `fn(row_offset, head_offset, *args)`: head_offset is the shard's first index on that dimension, so a kernel can
    form the element index of the unsharded tensor (its dropout mask then equals the unsharded one).
    """
    with_heads = head_dims is not None

    @functools.wraps(fn)
    def wrapped(*args):
        mesh = current_mesh()
        axes = _batch_axes(mesh) if mesh is not None else ()
        split_heads = with_heads and mesh is not None and mesh.shape.get(HEAD_AXIS, 1) > 1
        # With pipeline stages the call goes through shard_map even when nothing else is split: under the pipeline's
        # stage `vmap` (spmd_axis_name="pipeline") the shard_map then runs each stage's slice on its own devices,
        # where a bare pallas_call would make XLA all-gather every stage's activations (measured on 2 H200s:
        # benchmarks/results/distributed-2xh200.md).
        pipelined = mesh is not None and mesh.shape.get(PIPELINE_AXIS, 1) > 1
        if not axes and not split_heads and not pipelined:
            return fn(jnp.uint32(0), jnp.uint32(0), *args) if with_heads else fn(jnp.uint32(0), *args)
        shards = 1
        for a in axes:
            shards *= mesh.shape[a]
        lead = args[0].shape[0]
        tp = mesh.shape[HEAD_AXIS] if split_heads else 1
        heads = next((args[i].shape[d] for i, d in enumerate(head_dims) if d is not None), 1) if split_heads else 1
        if heads % tp:
            raise ValueError(f"the {heads} heads do not divide over the mesh axis {HEAD_AXIS!r} ({tp} shards)")
        if lead % shards:
            raise ValueError(f"the batch dimension {lead} does not divide over the mesh axes {axes} ({shards} shards)")
        n_args, present = len(args), [i for i, a in enumerate(args) if a is not None]

        def per_shard(*shard_args):
            index = jnp.uint32(0)
            for a in axes:  # row-major shard index over the batch axes, as P(axes) lays the shards out
                index = index * jnp.uint32(mesh.shape[a]) + jax.lax.axis_index(a).astype(jnp.uint32)
            full = [None] * n_args
            for i, a in zip(present, shard_args):
                full[i] = a
            if not with_heads:
                return fn(index * jnp.uint32(lead // shards), *full)
            head = jax.lax.axis_index(HEAD_AXIS).astype(jnp.uint32) * jnp.uint32(heads // tp) if split_heads \
                else jnp.uint32(0)
            return fn(index * jnp.uint32(lead // shards), head, *full)

        batch = axes or None

        def split(head_dim, lead=batch):  # the spec of an array split on B (lead) and/or its head dimension
            if not split_heads or head_dim is None:
                return P(lead)
            return P(*([lead] + [None] * (head_dim - 1))[:head_dim], HEAD_AXIS)

        def head_dim(i):
            return head_dims[i] if with_heads and i < len(head_dims) else None

        spec = split(out_head_dim)
        in_specs = tuple(split(head_dim(i), batch if i < n_batched else None) for i in present)
        shard_args = tuple(args[i] for i in present)
        if getattr(mesh, "explicit_axes", ()):  # explicit axes: the types must match the specs (no-op when they do)
            shard_args = tuple(jax.reshard(a, s) for a, s in zip(shard_args, in_specs))
        return _shard_map(per_shard, mesh, in_specs, spec)(*shard_args)

    return wrapped


def _shard_map(fn, mesh, in_specs, out_spec):
    # Every output is split on its leading axis (activations, or stacked per-shard partial sums).
    try:
        return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_spec, check_vma=False)
    except TypeError:  # older spelling
        from jax.experimental.shard_map import shard_map
        return shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_spec, check_rep=False)
