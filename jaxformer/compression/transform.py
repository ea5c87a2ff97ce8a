"""`sparse_allreduce`: the optax transform that replaces the dense gradient all-reduce over the data axis.

It runs inside a `shard_map` that is manual over the compressed axis (`CompressedSteps` builds one), where each rank
holds its own local gradient: the gradient of its shard of the batch, normalised so that the ranks' gradients sum to
the global one. It returns the summed sparse update, the same on every rank, and chains with any optimizer:
`optax.chain(sparse_allreduce(...), optimizer)`. Other mesh axes (tensor, pipeline, fsdp) stay with GSPMD: the
transform enters a second `shard_map` over them (a vmap over the shards of those before it in mesh order), so each
device selects from and exchanges only its own shards.

Per rank and per parameter it keeps the residual (error feedback: what it did not send, added to the next step's
gradient; Lin et al. 2018, DGC) and, with `momentum`, DGC's momentum (section 3.2, momentum correction and factor
masking). These live in the state as global arrays with a leading axis of one entry per rank, split over the
compressed axis, so they checkpoint with the optimizer and a resumed run continues exactly.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from . import exchange as ex
from .config import CompressionConfig
from .selection import select


class SparseAllReduceState(NamedTuple):
    """`count`: steps taken; `residual` (and `momentum`, or () without): like the parameters with a leading axis of
    one entry per rank; the rest per device, shaped (ranks, *sizes of the other mesh axes, n): `thresholds` the
    per-row thresholds of "reused", `gather_threshold` the balanced exchange's own, `boundaries` its regions,
    `stats` last step's entries selected, overflowed, reduced in this device's region and sent back."""

    count: jax.Array
    residual: Any
    momentum: Any
    thresholds: jax.Array
    gather_threshold: jax.Array
    boundaries: jax.Array
    stats: jax.Array


def _sizes(mesh) -> dict[str, int]:
    return dict(mesh.shape)


def _other_axes(mesh, axis: str) -> list[str]:
    return [a for a in mesh.axis_names if a != axis]


def _local_shape(shape, spec, sizes) -> tuple[int, ...]:
    spec = tuple(spec) + (None,) * (len(shape) - len(tuple(spec)))
    out = []
    for d, s in zip(shape, spec):
        axes = (s,) if isinstance(s, str) else tuple(s or ())
        out.append(d // math.prod(sizes[a] for a in axes))
    return tuple(out)


def _flat(tree, like_treedef, default):
    return like_treedef.flatten_up_to(tree) if tree is not None else [default] * like_treedef.num_leaves


def local_layout(shapes, specs, stacked, mesh, density: float, min_size: int) -> ex.Layout:
    """The layout of one device's shards of leaves of global `shapes` split by `specs` on `mesh`."""
    sizes = _sizes(mesh)
    return ex.Layout.build([_local_shape(s, sp, sizes) for s, sp in zip(shapes, specs)], stacked, density, min_size)


def exchange_is_cheaper(layout: ex.Layout, config: CompressionConfig, ranks: int, density: float) -> bool:
    """Whether the sparse exchange at `density` moves fewer bytes than a dense all-reduce (warm-up levels that do
    not run the dense all-reduce instead; the target density always runs sparse)."""
    sparse = ex.wire_bytes(layout, ranks, config.exchange, config.value_dtype, config.send_slack,
                           config.gather_factor)
    return density == config.density or sparse < ex.wire_bytes(layout, ranks, "dense", "float32")


def sparse_allreduce(config: CompressionConfig, mesh, specs=None, stacked=None, *,
                     density: float | None = None) -> optax.GradientTransformation:
    """The transform over `config.axis` of `mesh` at `density` (default `config.density`; the warm-up builds one per
    level, all with the same state). `specs`: the parameters' PartitionSpecs over the other mesh axes (None:
    replicated); `stacked`: a tree of bools, True where the leading axis is the layer axis (selected per layer)."""
    config.check_mesh(mesh)
    density = config.density if density is None else density
    axis, sizes = config.axis, _sizes(mesh)
    ranks, others = sizes[axis], _other_axes(mesh, axis)
    grid = tuple(sizes[a] for a in others)
    dtype = jnp.dtype(config.value_dtype)

    def leaves_of(params):
        leaves, treedef = jax.tree.flatten(params)
        return leaves, treedef, _flat(specs, treedef, P()), _flat(stacked, treedef, False)

    def init(params):
        leaves, treedef, spec_leaves, stacked_leaves = leaves_of(params)
        layout = local_layout([x.shape for x in leaves], spec_leaves, stacked_leaves, mesh, config.density,
                              config.min_size)
        per_rank = lambda x: jnp.zeros((ranks, *x.shape), jnp.float32)  # noqa: E731
        per_device = lambda n, fill, dt: jnp.full((ranks, *grid, n), fill, dt)  # noqa: E731
        residual = jax.tree.map(per_rank, params)
        return SparseAllReduceState(
            count=jnp.zeros((), jnp.int32), residual=residual,
            momentum=jax.tree.map(per_rank, params) if config.momentum else (),
            thresholds=per_device(layout.rows_total, -1.0, jnp.float32),  # < 0: compute afresh
            gather_threshold=per_device(1, -1.0, jnp.float32),
            boundaries=jnp.broadcast_to(ex.even_boundaries(layout.n_sparse, ranks), (ranks, *grid, ranks + 1)),
            stats=per_device(4, 0, jnp.int32))

    def update(grads, state: SparseAllReduceState, params=None):
        del params
        leaves, treedef, spec_leaves, stacked_leaves = leaves_of(grads)
        layout = local_layout([g.shape for g in leaves], spec_leaves, stacked_leaves, mesh, density,
                              config.min_size)
        scale = jnp.float32(1.0)
        if config.clip_norm is not None:  # DGC's local clipping: the ranks' sum then stays near clip_norm
            scale = jnp.minimum(1.0, config.clip_norm / math.sqrt(ranks) / (optax.tree.norm(grads) + 1e-12))
        res = treedef.flatten_up_to(state.residual)  # this rank's entries: (1, *shape)
        mom = treedef.flatten_up_to(state.momentum) if config.momentum else []
        if not exchange_is_cheaper(layout, config, ranks, density):
            return _dense(leaves, res, mom, treedef, state, scale, config)
        dev = (state.thresholds, state.gather_threshold, state.boundaries)
        body = lambda *a: _local(*a, config=config, stacked=stacked_leaves, density=density, dtype=dtype,  # noqa
                                 ranks=ranks)
        # Each device works on its own shards of the other axes. XLA's Shardy export wants nested manual axes in mesh
        # order, so the axes before `axis` (pipeline) are mapped over with vmap; those after it are made manual.
        order = list(mesh.axis_names)
        manual = [a for a in others if sizes[a] > 1]
        staged = [a for a in manual if order.index(a) < order.index(axis)]
        inner = [a for a in manual if a not in staged]
        for a in staged:
            body = _over_stages(body, [_dim_of(sp, a) for sp in spec_leaves], sizes[a], 1 + others.index(a),
                                len(mom))
        if inner:
            keep = lambda spec: P(*[None if d in staged else d for d in spec])  # noqa: E731
            dev_spec = P(None, *[a if a in inner else None for a in others])
            leaf_specs = [keep(sp) for sp in spec_leaves]
            rank_specs = [P(None, *sp) for sp in leaf_specs]
            body = jax.shard_map(body, in_specs=(leaf_specs, rank_specs, rank_specs[:len(mom)], (dev_spec,) * 3,
                                                 P(), P()),
                                 out_specs=(leaf_specs, rank_specs, rank_specs[:len(mom)], (dev_spec,) * 4),
                                 axis_names=set(inner), check_vma=False)
        updates, res, mom, (thr, thr2, bounds, stats) = body(leaves, res, mom, dev, state.count, scale)
        return treedef.unflatten(updates), SparseAllReduceState(
            state.count + 1, treedef.unflatten(res), treedef.unflatten(mom) if config.momentum else (),
            thr, thr2, bounds, stats)

    return optax.GradientTransformation(init, update)


def _dim_of(spec, axis: str) -> int | None:
    """The dimension that `spec` splits over `axis` (None: not split over it)."""
    for d, entry in enumerate(spec):
        if entry == axis:
            return d
        if isinstance(entry, tuple) and axis in entry:
            raise ValueError(f"a parameter split over {entry!r} in one dimension: compression maps over {axis!r} "
                             f"only where it splits a dimension alone")
    return None


def _over_stages(body, dims, n: int, dev_dim: int, n_mom: int):
    """`body` run for each of the `n` shards of an axis that splits leaf dimension `dims[i]` (None: a leaf replicated
    over it) and the per-device arrays' dimension `dev_dim`: one vmap over those shards."""
    rank_dims = [None if d is None else d + 1 for d in dims]
    split = lambda x, d: x if d is None else x.reshape(*x.shape[:d], n, x.shape[d] // n, *x.shape[d + 1:])  # noqa
    merge = lambda x, d: x.reshape(*x.shape[:d], -1, *x.shape[d + 2:])  # noqa: E731
    # A replicated leaf comes out once per shard (all alike but for the exchange's overflow): shard 0's is kept.
    out_dims = [0 if d is None else d for d in dims]
    out_rank = [0 if d is None else d for d in rank_dims]

    def run(grads, res, mom, dev, count, scale):
        args = ([split(g, d) for g, d in zip(grads, dims)], [split(r, d) for r, d in zip(res, rank_dims)],
                [split(u, d) for u, d in zip(mom, rank_dims)], dev, count, scale)
        u, r, m, dv = jax.vmap(body, in_axes=(dims, rank_dims, rank_dims[:n_mom], (dev_dim,) * 3, None, None),
                               out_axes=(out_dims, out_rank, out_rank[:n_mom], (dev_dim,) * 4))(*args)
        back = lambda xs, ds: [x[0] if d is None else merge(x, d) for x, d in zip(xs, ds)]  # noqa: E731
        return back(u, dims), back(r, rank_dims), back(m, rank_dims[:n_mom]), dv

    return run


def _accumulate(g, r, u, scale, momentum: float):
    """acc = residual + gradient (DGC's v += g), or with momentum correction u = m u + g, acc = residual + u."""
    g = g.astype(jnp.float32) * scale
    if u is None:
        return r + g, None
    u = momentum * u + g
    return r + u, u


def _dense(leaves, res, mom, treedef, state, scale, config):
    """A warm-up level that sends everything: the dense all-reduce of gradient plus residual."""
    accs = [_accumulate(g, r[0], mom[i][0] if mom else None, scale, config.momentum) for i, (g, r) in
            enumerate(zip(leaves, res))]
    updates = [jax.lax.psum(a, config.axis).astype(g.dtype) for (a, _), g in zip(accs, leaves)]
    zeros = jax.tree.map(jnp.zeros_like, state.residual)
    momentum = treedef.unflatten([u[None] for _, u in accs]) if mom else ()
    return treedef.unflatten(updates), state._replace(count=state.count + 1, residual=zeros, momentum=momentum)


def _local(grads, res, mom, dev, count, scale, *, config: CompressionConfig, stacked, density, dtype, ranks):
    """One device: accumulate, select per row, exchange, and keep what was not sent."""
    thresholds, gather_threshold, boundaries = (a.reshape(-1) for a in dev)
    lead = dev[0].shape[:-1]  # (1, 1, ...): this device's entry of the per-device arrays
    res, mom = [r[0] for r in res], [u[0] for u in mom]
    layout = ex.Layout.build([g.shape for g in grads], stacked, density, config.min_size)
    ns = layout.n_sparse
    me = jax.lax.axis_index(config.axis)
    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(config.seed), count), me)
    key, gather_key = jax.random.split(key)
    accs = [_accumulate(g, r, mom[i] if mom else None, scale, config.momentum) for i, (g, r) in
            enumerate(zip(grads, res))]
    sparse = [i for i, leaf in enumerate(layout.leaves) if leaf.sparse]
    dense = [i for i, leaf in enumerate(layout.leaves) if not leaf.sparse]
    mags = [jnp.abs(accs[i][0]).reshape(layout.leaves[i].rows, layout.leaves[i].cols) for i in sparse]
    thr_in = jnp.split(thresholds, list(itertools.accumulate(layout.leaves[i].rows for i in sparse))[:-1]) \
        if sparse else []
    index, n, thr_out = select(mags, [layout.leaves[i].k for i in sparse], config.selection, thr_in, step=count,
                               key=key, sample_fraction=config.sample_fraction, refresh_every=config.refresh_every)
    # The chosen entries' values, gathered from each sparse leaf (no concatenation of the leaves: a copy of them all).
    value = jnp.zeros(index.shape, jnp.float32)
    for i in sparse:
        local = _local_index(index, layout.leaves[i])
        value = jnp.where(local < layout.leaves[i].size, _gather(accs[i][0], local), value)
    flat_d = jnp.concatenate([accs[i][0].reshape(-1) for i in dense]) if dense else jnp.zeros(0, jnp.float32)
    if config.exchange == "allgather":
        out = ex.allgather(index, value, n, flat_d, layout=layout, axis=config.axis, dtype=dtype)
    else:
        caps = ex.Capacities.of(layout, ranks, config.send_slack, config.gather_factor)
        out = ex.balanced(index, value, n, flat_d, boundaries, gather_threshold, layout=layout, axis=config.axis,
                          dtype=dtype, caps=caps, selection=config.selection, step=count,
                          key=gather_key, rebalance=(count + 1) % config.rebalance_every == 0,
                          sample_fraction=config.sample_fraction, refresh_every=config.refresh_every)
    taken = jnp.where(out.consumed, index, ns)
    kept_d = flat_d - out.dense_sent + out.dense_keep
    # Each sparse leaf keeps its accumulation less what it sent, plus its owner remainders, scattered in place.
    residual = _split(None, kept_d, layout)
    new_mom = _split(None, jnp.concatenate([accs[i][1].reshape(-1) for i in dense]) if dense else jnp.zeros(0),
                     layout) if mom else []
    for i in sparse:
        leaf = layout.leaves[i]
        kept = accs[i][0].reshape(-1).at[_local_index(taken, leaf)].add(-out.sent, mode="drop")
        kept = kept.at[_local_index(out.keep_index, leaf)].add(out.keep_value, mode="drop")
        residual[i] = kept.reshape(leaf.shape)
        if mom:  # DGC's momentum factor masking where sent; dense leaves keep plain momentum (sent every step)
            new_mom[i] = accs[i][1].reshape(-1).at[_local_index(taken, leaf)].set(0.0, mode="drop").reshape(
                leaf.shape)
    updates = _split(None, out.dense_update, layout)
    for i, u in zip(sparse, out.update):
        updates[i] = u.reshape(layout.leaves[i].shape)
    thr = jnp.concatenate(thr_out) if sparse else thresholds
    dev_out = [a.reshape(*lead, -1) for a in (thr, out.gather_threshold, out.boundaries, out.stats)]
    return ([u.astype(g.dtype) for u, g in zip(updates, grads)], [r[None] for r in residual],
            [u[None] for u in new_mom], tuple(dev_out))


def _split(flat_sparse, flat_dense, layout: ex.Layout):
    """Per leaf: its slice of the sparse or the dense flat vector, in its shape (None where that vector is None)."""
    def part(flat, leaf):
        return None if flat is None else flat[leaf.offset:leaf.offset + leaf.size].reshape(leaf.shape)
    return [part(flat_sparse if leaf.sparse else flat_dense, leaf) for leaf in layout.leaves]


def _local_index(index, leaf: ex.Leaf):
    """Each flat sparse index's index inside `leaf`, or the leaf's size (out of range: dropped) outside it."""
    inside = (index >= leaf.offset) & (index < leaf.offset + leaf.size)
    return jnp.where(inside, index - leaf.offset, leaf.size)


def _gather(x, local):
    """x's entries at in-leaf indices `local` (those out of range clamped: the caller masks them)."""
    return x.reshape(-1).at[jnp.minimum(local, x.size - 1)].get(mode="promise_in_bounds")


def state_shardings(config: CompressionConfig, mesh, params, specs=None):
    """NamedShardings of the transform's state for `params` (arrays or shape structs) with `specs`: the per-rank
    arrays split over `config.axis` on their leading axis and as their parameter over the rest, the per-device
    arrays over every axis, the count replicated."""
    others = _other_axes(mesh, config.axis)
    leaves, treedef = jax.tree.flatten(params)
    spec_leaves = _flat(specs, treedef, P())
    per_rank = treedef.unflatten([NamedSharding(mesh, P(config.axis, *s)) for s in spec_leaves])
    device = NamedSharding(mesh, P(config.axis, *others))
    return SparseAllReduceState(count=NamedSharding(mesh, P()), residual=per_rank,
                                momentum=per_rank if config.momentum else (), thresholds=device,
                                gather_threshold=device, boundaries=device, stats=device)
