"""Plumbing shared by the Triton-lowered Pallas kernels: compiler parameters, row blocks, masks, column sums.

Every kernel here is lowered through Triton (`pltriton.CompilerParams` is always passed: jax 0.10.2 would pick Mosaic
GPU otherwise, and jax 0.11.2 lowers `pallas_call` on the GPU only through Triton). On the CPU the same kernel bodies
run in interpret mode, which proves the math, not the lowering.
"""

from __future__ import annotations

import dataclasses
import warnings

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from .dropout import keep_mask_tile

# The Triton lowering warns that it is deprecated each time a kernel is lowered; users should not see that once per
# compiled step. Our kernels pick Triton on purpose (see DESIGN.md, Pallas backends).
warnings.filterwarnings("ignore", message=r"(?i).*triton.*deprecat.*")
warnings.filterwarnings("ignore", message=r"(?i).*deprecat.*triton.*")


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
    kernel 1.9-2.4 (its defaults the fastest of 30 block sizes there; kernels-h100.md, BDRLN). Program (k, j)
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
