"""The flat index space of one device's gradient shards and the two fixed-capacity sparse exchanges over it.

`Layout`: the leaves (local shards) laid end to end, sparse ones first (their entries form the sparse index space
[0, n_sparse)), then the dense ones (the dense space [0, n_dense), always sent whole). A sparse leaf is viewed as
(rows, cols): one row per layer for the stacked encoder weights, else one row; each row sends k = ceil(density *
cols) entries.

Both exchanges take each rank's sorted entries (index, value, count n; slots from n on are padding) and its dense
values, send one packed uint16 buffer per collective (`format.py`) and return an `Exchanged`: the summed update in
each sparse leaf's own array (identical on every rank), what of this rank's entries was consumed (sent and counted
in the update), and what the rank must keep on top of its unsent entries (the balanced exchange's owner
remainders). Sums are formed by one scatter per source rank, each with distinct indices, in rank order: the same
bits on every rank.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from . import format as fmt
from .selection import select


@dataclasses.dataclass(frozen=True)
class Leaf:
    shape: tuple[int, ...]  # the local shard's shape
    rows: int
    cols: int
    sparse: bool
    k: int  # entries per row (sparse leaves)
    offset: int  # first index in the sparse (or dense) space

    @property
    def size(self) -> int:
        return self.rows * self.cols


@dataclasses.dataclass(frozen=True)
class Layout:
    leaves: tuple[Leaf, ...]
    n_sparse: int
    n_dense: int

    @classmethod
    def build(cls, shapes, stacked, density: float, min_size: int) -> "Layout":
        """`shapes`: each leaf's local shape; `stacked`: whether its leading axis is the layer axis (one row per
        layer). Rows shorter than `min_size` make the leaf dense."""
        kinds = []
        for shape, st in zip(shapes, stacked):
            size = math.prod(shape)
            rows = shape[0] if st and len(shape) > 1 and shape[0] > 0 else 1
            cols = size // rows
            kinds.append((tuple(shape), rows, cols, cols >= min_size and cols > 0))
        off = {True: 0, False: 0}
        leaves = []
        for shape, rows, cols, sparse in kinds:
            k = min(cols, math.ceil(density * cols)) if sparse else 0
            leaves.append(Leaf(shape, rows, cols, sparse, k, off[sparse]))
            off[sparse] += rows * cols
        if off[True] >= 2 ** 30:  # int32 indices, with room for boundary arithmetic
            raise ValueError(f"the sparse index space of one device ({off[True]} entries) is too large for int32 "
                             f"indices; split the parameters over more devices (tensor or pipeline)")
        return cls(tuple(leaves), off[True], off[False])

    @property
    def sparse(self) -> list[Leaf]:
        return [leaf for leaf in self.leaves if leaf.sparse]

    @property
    def dense(self) -> list[Leaf]:
        return [leaf for leaf in self.leaves if not leaf.sparse]

    @property
    def k_total(self) -> int:
        return sum(leaf.rows * leaf.k for leaf in self.sparse)

    @property
    def rows_total(self) -> int:
        return sum(leaf.rows for leaf in self.sparse)


@dataclasses.dataclass(frozen=True)
class Capacities:
    """The balanced exchange's fixed sizes: entries per all-to-all buffer (send), per owner's reply (gather), the
    largest region (bounding the rebalanced boundaries and the per-region count blocks), the dense slice per rank."""
    send: int
    gather: int
    region: int
    dense: int

    @classmethod
    def of(cls, layout: Layout, ranks: int, send_slack: float, gather_factor: float) -> "Capacities":
        share = layout.k_total / ranks
        send = min(layout.k_total, math.ceil(share * send_slack))
        return cls(send, min(ranks * send, max(1, math.ceil(share * gather_factor))),
                   min(layout.n_sparse, 2 * -(-layout.n_sparse // ranks)), -(-layout.n_dense // ranks))


def even_boundaries(n_sparse: int, ranks: int):
    return jnp.asarray([q * n_sparse // ranks for q in range(ranks + 1)], jnp.int32)


def wire_bytes(layout: Layout, ranks: int, exchange: str, dtype, send_slack=1.25, gather_factor=1.0) -> float:
    """Bytes one device sends per step (ring collectives): what the exchange moves, from its buffer sizes."""
    vb, p = jnp.dtype(dtype).itemsize, ranks
    if exchange == "dense":  # a ring all-reduce of float32 gradients
        return 2 * (p - 1) / p * 4 * (layout.n_sparse + layout.n_dense)
    if exchange == "allgather":
        return (p - 1) * (fmt.nbytes(layout.k_total, layout.n_sparse, dtype) + vb * layout.n_dense)
    send, gather = balanced_buffer_bytes(layout, ranks, dtype, send_slack, gather_factor)
    return (p - 1) / p * (send + gather)


def balanced_buffer_bytes(layout: Layout, ranks: int, dtype, send_slack=1.25, gather_factor=1.0) -> tuple[int, int]:
    """Per device, the bytes of the balanced exchange's all-to-all operand (a fixed-size buffer to each owner) and of
    its all-gather result (each owner's reduced entries, its dense slice and its boundary quantiles)."""
    vb, p = jnp.dtype(dtype).itemsize, ranks
    c = Capacities.of(layout, ranks, send_slack, gather_factor)
    send = p * (fmt.nbytes(c.send, c.region, dtype) + vb * c.dense)
    gather = p * (fmt.nbytes(c.gather, c.region, dtype) + vb * c.dense + 4 * (p - 1))
    return send, gather


class Exchanged(NamedTuple):
    update: list  # per sparse leaf, (rows * cols,) float32: the summed sparse update, the same on every rank
    dense_update: jax.Array  # (n_dense,) float32
    consumed: jax.Array  # (K,) bool: which of this rank's slots went into the update
    sent: jax.Array  # (K,) float32: each slot's value as sent (rounded to the wire dtype)
    dense_sent: jax.Array  # (n_dense,) float32
    keep_index: jax.Array  # (J,) int32: owner remainders to add to this rank's residual (n_sparse: none)
    keep_value: jax.Array  # (J,) float32
    dense_keep: jax.Array  # (n_dense,) float32
    boundaries: jax.Array  # (ranks + 1,) int32: the regions for the next step
    gather_threshold: jax.Array  # (1,) float32
    stats: jax.Array  # (4,) int32: entries selected, overflowed, reduced in this rank's region, sent back


def _sum_per_rank(index, value, size: int):
    """Sum of every rank's (index, value) rows into `size` entries, one scatter per rank in rank order."""
    out = jnp.zeros(size, jnp.float32)
    for p in range(index.shape[0]):
        out = out.at[index[p]].add(value[p], mode="drop")
    return out


def _sum_into_leaves(index, value, layout: Layout):
    """`_sum_per_rank` over the sparse space, formed in each sparse leaf's own array (no flat vector of them all to
    slice the leaves from afterwards): per leaf, one scatter per rank in rank order, so the same sums."""
    out = []
    for leaf in layout.sparse:
        inside = (index >= leaf.offset) & (index < leaf.offset + leaf.size)
        out.append(_sum_per_rank(jnp.where(inside, index - leaf.offset, leaf.size), value, leaf.size))
    return out


def allgather(index, value, n, dense, *, layout: Layout, axis: str, dtype) -> Exchanged:
    """Every rank gathers every rank's packed entries and dense values and sums them."""
    k, ns, nd = index.shape[0], layout.n_sparse, layout.n_dense
    sent = value.astype(dtype)
    dense_sent = dense.astype(dtype)
    buf = jnp.concatenate([fmt.pack_words(fmt.encode(index, sent, n, ns, dtype)), fmt.to_words(dense_sent)])
    got = jax.lax.all_gather(buf, axis)  # (ranks, W)
    packed, rest = fmt.unpack_words(got, k, ns, dtype)
    gidx, gval = fmt.decode(packed, ns)
    dense_update = jnp.zeros(nd, jnp.float32)
    for p in range(got.shape[0]):
        dense_update = dense_update + fmt.from_words(rest[p], dtype, nd).astype(jnp.float32)
    ranks = got.shape[0]
    return Exchanged(_sum_into_leaves(gidx, gval, layout), dense_update, jnp.arange(k) < n, sent.astype(jnp.float32),
                     dense_sent.astype(jnp.float32), jnp.full((1,), ns, jnp.int32), jnp.zeros(1, jnp.float32),
                     jnp.zeros(nd, jnp.float32), even_boundaries(ns, ranks), jnp.zeros(1, jnp.float32),
                     jnp.stack([n, jnp.zeros_like(n), jnp.zeros_like(n), n]).astype(jnp.int32))


def _clamp(interior, n_sparse: int, region: int):
    """Monotone boundaries [0, ..., n_sparse] from interior points, no region longer than `region`."""
    b = [jnp.int32(0)] + [x for x in interior] + [jnp.int32(n_sparse)]
    b = list(jax.lax.cummax(jnp.stack(b)))
    for q in range(1, len(b)):
        b[q] = jnp.minimum(b[q], b[q - 1] + region)
    b[-1] = jnp.int32(n_sparse)
    for q in range(len(b) - 2, -1, -1):
        b[q] = jnp.maximum(b[q], b[q + 1] - region)
    return jnp.stack(b).astype(jnp.int32)


def balanced(index, value, n, dense, boundaries, gather_threshold, *, layout: Layout, axis: str, dtype,
             caps: Capacities, selection: str, step, key, rebalance, sample_fraction: float = 0.01,
             refresh_every: int = 128) -> Exchanged:
    """Ok-Topk's sparse all-reduce: region q = [boundaries[q], boundaries[q+1]) of the sparse space belongs to
    rank q. One all-to-all sends each owner its region's entries (at most `caps.send`; the overflow stays with the
    sender) and a slice of the dense values; the owner sums them, keeps the `caps.gather` largest sums (selected as
    the ranks select their own entries), rounds them to the wire dtype and keeps the rest of its sums itself. One
    all-gather returns every owner's kept sums, its dense slice's sum and its index quantiles, from which every rank
    computes the same new boundaries (applied where `rebalance`)."""
    ranks, k = boundaries.shape[0] - 1, index.shape[0]
    ns, nd, region = layout.n_sparse, layout.n_dense, caps.region
    me = jax.lax.axis_index(axis)
    starts = fmt.count_le(index, boundaries - 1)  # the slots below each boundary; padding (= ns) sorts last
    first, last = starts[:-1], jnp.minimum(starts[1:], n)
    slot = first[:, None] + jnp.arange(caps.send)[None]  # (ranks, send)
    ok = slot < last[:, None]
    src = jnp.minimum(slot, k - 1)
    sent = value.astype(dtype)
    rel = jnp.where(ok, index[src] - boundaries[:-1, None], 0)
    owner = jnp.minimum(fmt.count_le(boundaries[1:], index), ranks - 1)
    consumed = (jnp.arange(k) < n) & (jnp.arange(k) < first[owner] + caps.send)
    words = [fmt.pack_words(fmt.encode(rel, jnp.where(ok, sent[src], 0), jnp.sum(ok, 1), region, dtype))]
    dense_sent = dense.astype(dtype)
    words.append(fmt.to_words(jnp.pad(dense_sent, (0, ranks * caps.dense - nd)).reshape(ranks, caps.dense)))
    got = jax.lax.all_to_all(jnp.concatenate(words, axis=1), axis, 0, 0, tiled=True)  # row p: from rank p

    packed, rest = fmt.unpack_words(got, caps.send, region, dtype)
    ridx, rval = fmt.decode(packed, region)  # (ranks, send), relative to my region
    sums_by_index = _sum_per_rank(ridx, rval, region)
    keys = jnp.sort(ridx.reshape(-1))
    unique = (keys < region) & jnp.concatenate([jnp.ones(1, bool), keys[1:] != keys[:-1]])
    sums = jnp.where(unique, sums_by_index[jnp.minimum(keys, region - 1)], 0.0)
    m = keys.shape[0]
    chosen, nb, (gather_threshold,) = select([jnp.where(unique, jnp.abs(sums), -1.0)[None]], [caps.gather],
                                             selection, [gather_threshold], step=step, key=key,
                                             sample_fraction=sample_fraction, refresh_every=refresh_every)
    valid = chosen < m
    at = jnp.minimum(chosen, m - 1)
    back = jnp.where(valid, sums[at], 0.0).astype(dtype)
    returned = jnp.zeros(m, jnp.float32).at[chosen].set(back.astype(jnp.float32), mode="drop")
    keep_value = jnp.where(unique, sums - returned, 0.0)
    keep_index = jnp.where(unique, boundaries[me] + keys, ns)

    dense_sum = jnp.zeros(caps.dense, jnp.float32)
    for p in range(ranks):
        dense_sum = dense_sum + fmt.from_words(rest[p], dtype, caps.dense).astype(jnp.float32)
    dense_back = dense_sum.astype(dtype)
    dense_keep = jax.lax.dynamic_update_slice(jnp.zeros(ranks * caps.dense, jnp.float32),
                                              dense_sum - dense_back.astype(jnp.float32), (me * caps.dense,))[:nd]
    at_quantiles = jnp.minimum(jnp.arange(1, ranks) * n // ranks, k - 1)
    quantiles = jnp.where(n > 0, index[at_quantiles], boundaries[1:-1]).astype(jnp.int32)
    out = jnp.concatenate([fmt.pack_words(fmt.encode(jnp.where(valid, keys[at], 0), back, nb, region, dtype)),
                           fmt.to_words(dense_back), fmt.to_words(quantiles)])
    got = jax.lax.all_gather(out, axis)  # (ranks, W)

    packed, rest = fmt.unpack_words(got, caps.gather, region, dtype)
    gidx, gval = fmt.decode(packed, region)
    gidx = jnp.where(gidx < region, gidx + boundaries[:-1, None], ns)
    dense_update = fmt.from_words(rest[:, :caps.dense * jnp.dtype(dtype).itemsize // 2], dtype, caps.dense)
    all_quantiles = fmt.from_words(rest[:, -2 * (ranks - 1):], jnp.int32, ranks - 1) if ranks > 1 else None
    new = boundaries
    if ranks > 1:
        mean = jnp.round(jnp.mean(all_quantiles.astype(jnp.float32), axis=0)).astype(jnp.int32)
        new = jnp.where(rebalance, _clamp(list(mean), ns, region), boundaries)
    stats = jnp.stack([n, n - jnp.sum(consumed), jnp.sum(unique), nb]).astype(jnp.int32)
    return Exchanged(_sum_into_leaves(gidx, gval, layout), dense_update.astype(jnp.float32).reshape(-1)[:nd], consumed,
                     sent.astype(jnp.float32), dense_sent.astype(jnp.float32), keep_index, keep_value, dense_keep,
                     new, gather_threshold, stats)
