"""Plumbing shared by the Pallas kernels: backend choice, compiler parameters, row blocks, batch sharding.

Every kernel here is lowered through Triton (`pltriton.CompilerParams` is always passed: jax 0.10.2 would pick Mosaic
GPU otherwise, and jax 0.11.2 lowers `pallas_call` on the GPU only through Triton). On the CPU the same kernel bodies
run in interpret mode, which proves the math, not the lowering.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton
from jax.sharding import PartitionSpec as P

from .dropout import keep_mask_tile

# The Triton lowering warns that it is deprecated each time a kernel is lowered; users should not see that once per
# compiled step. Our kernels pick Triton on purpose (see DESIGN.md, Pallas backends).
warnings.filterwarnings("ignore", message=r"(?i).*triton.*deprecat.*")
warnings.filterwarnings("ignore", message=r"(?i).*deprecat.*triton.*")

# Mesh axes that split the batch: kernels run per shard on them (see `batch_shard_map`).
BATCH_AXES = ("data", "fsdp")
# The mesh axis that splits attention heads (tensor parallelism, jaxformer.sharding); see `batch_shard_map`.
HEAD_AXIS = "tensor"
# The mesh axis of pipeline stages (jaxformer.pipeline): its stage `vmap` carries spmd_axis_name=PIPELINE_AXIS.
PIPELINE_AXIS = "pipeline"


def resolve_interpret(interpret: bool | None) -> bool:
    """`None` means: interpret on a CPU backend (tests), compile through Triton on a GPU."""
    if interpret is None:
        return jax.default_backend() == "cpu"
    return bool(interpret)


def compiler_params(num_warps: int, num_stages: int = 1):
    return pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages)


def row_block_candidates(around, *, stage: str) -> list:
    """Block sizes to try around `around` for the row-wise Triton kernels (BDRLN's and bias+GELU's `Blocks` share
    these fields), for the autotuner and `benchmarks/kernels.py --tune`: stage "fwd" the forward's rows per tile and
    warps; "bwd" the backward's rows per chunk and per program, warps and software-pipeline stages (2 stages moved
    bias+GELU's backward from 122.7 to 97.6 us at 8192x3072 on an H200: kernels-h200.md)."""
    if stage == "fwd":
        return [dataclasses.replace(around, block_rows=br, num_warps=w)
                for br, w in ((1, 4), (2, 4), (4, 8), (8, 8), (16, 8))]
    if stage == "bwd":
        return [dataclasses.replace(around, bwd_block_rows=br, bwd_rows_per_program=rpp, bwd_num_warps=w,
                                    bwd_num_stages=st)
                for br, rpp, w in ((1, 16, 8), (2, 16, 4), (4, 16, 8), (8, 32, 8), (8, 64, 8)) for st in (1, 2, 3)]
    raise ValueError(f"{stage=} must be 'fwd' or 'bwd'")


def next_pow2(n: int) -> int:
    return pl.next_power_of_2(n)


def fit_pow2(cap: int, n: int) -> int:
    """The largest power of two <= cap (a power of two) dividing n, at least 16 (a Triton dot needs every dimension
    >= 16): 16 where none divides, which the caller must check."""
    block = cap
    while block > 16 and n % block:
        block //= 2
    return block


def row_col_mask(first_row, block_rows: int, rows: int, width_p: int, width: int):
    """Row indices (block_rows,), column indices (width_p,) and the in-bounds mask of a (block_rows, width_p) tile.

    Triton needs power-of-two tiles, so a width of 768 is a 1024-wide tile whose last columns are masked.
    """
    r = first_row + jnp.arange(block_rows, dtype=jnp.int32)
    c = jnp.arange(width_p, dtype=jnp.int32)
    return r, c, (r < rows)[:, None] & (c < width)[None, :]


def keep(seed_ref, rows, first_col, n_cols: int, width: int, rate: float):
    """The dropout keep mask of a (rows, n_cols) tile at columns first_col.., the same as
    `pallas_kernels.dropout.keep_mask` (`keep_mask_tile`: one hash per two neighbouring elements where width is even).

    `seed_ref` holds uint32 [seed0, seed1, row_offset, 0]: the element index is (row_offset + row) * width + col in
    the logical (unsharded) tensor, so every batch shard draws its own mask and the kernel matches the reference.
    """
    return keep_mask_tile(seed_ref[0], seed_ref[1], rows.astype(jnp.uint32) + seed_ref[2], first_col, n_cols, width,
                          rate)


def seed_words(seed, row_offset=0, head_offset=0):
    """uint32[4] = [seed0, seed1, row_offset, head_offset] for `keep` and the attention kernels (a power-of-two
    length, as Triton wants); head_offset is the first head of a tensor-parallel shard (0 elsewhere)."""
    if seed is None:
        seed = jnp.zeros((2,), jnp.uint32)
    off = jnp.asarray(row_offset, jnp.uint32).reshape(1)
    head = jnp.asarray(head_offset, jnp.uint32).reshape(1)
    return jnp.concatenate([jnp.asarray(seed, jnp.uint32).reshape(2), off, head])


def load(ref, mask, other=0.0):
    return pltriton.load(ref, mask=mask, other=other)


def store(ref, value, mask):
    pltriton.store(ref, value.astype(ref.dtype), mask=mask)


def column_sums(*partials, interpret: bool, block_cols: int = 16, chunk_rows: int = 256, num_warps: int = 4):
    """Each (G, D) float32 array of `partials` summed over its G rows, as a (1, D) float32 array, all in one kernel
    launch (None stays None): the backward kernels' per-program partial sums of the parameter gradients. XLA runs one
    reduction kernel per array: three (G, D) arrays took 4.5-7.4 us on an H100 at G = 256-512, D = 768-1024, this
    kernel 1.9-2.4 (its defaults the fastest of 30 block sizes there; kernels-h100.md, "Session 23"). Program (k, j)
    sums columns j·block_cols.. of array k in `chunk_rows`-row chunks, in a fixed order: the sums are deterministic
    (no atomics)."""
    present = [i for i, p in enumerate(partials) if p is not None]
    if not present:
        return partials
    arrays = [partials[i] for i in present]
    g, d = arrays[0].shape
    for a in arrays:
        if a.shape != (g, d) or a.dtype != jnp.float32:
            raise ValueError(f"partials must all be ({g}, {d}) float32, got {a.shape} {a.dtype}")
    n, gp = len(arrays), next_pow2(g)
    chunk = min(chunk_rows, gp)

    def kernel(*refs):
        ins, outs = refs[:n], refs[n:]
        k, j = pl.program_id(0), pl.program_id(1)
        cols = j * block_cols + jnp.arange(block_cols, dtype=jnp.int32)
        col_ok = (cols < d)[None, :]

        for i in range(n):
            @pl.when(k == i)
            def _(i=i):
                def add(c, acc):
                    rows = c * chunk + jnp.arange(chunk, dtype=jnp.int32)
                    return acc + load(ins[i].at[pl.ds(c * chunk, chunk), :], (rows < g)[:, None] & col_ok)

                acc = jax.lax.fori_loop(0, pl.cdiv(g, chunk), add, jnp.zeros((chunk, block_cols), jnp.float32))
                store(outs[i], jnp.sum(acc, axis=0, keepdims=True), col_ok)

    sums = pl.pallas_call(
        kernel,
        out_shape=[jax.ShapeDtypeStruct((1, d), jnp.float32)] * n,
        grid=(n, pl.cdiv(d, block_cols)),
        in_specs=[pl.BlockSpec((gp, block_cols), lambda k, j: (0, j))] * n,
        out_specs=[pl.BlockSpec((1, block_cols), lambda k, j: (0, j))] * n,
        compiler_params=compiler_params(num_warps),
        interpret=interpret,
        name="column_sums",
    )(*arrays)
    out = list(partials)
    for i, s in zip(present, sums):
        out[i] = s
    return tuple(out)


def _batch_axes(mesh) -> tuple[str, ...]:
    return tuple(a for a in BATCH_AXES if a in mesh.axis_names and mesh.shape[a] > 1)


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
