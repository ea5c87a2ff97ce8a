"""Mosaic GPU (Hopper+) kernels of bias + exact GELU (+ dropout): the same contract as `kernel.py`'s forward/backward.

Programming model (`plgpu.kernel` + `plgpu.emit_pipeline`): one warpgroup (128 threads) per program; each program
owns `steps` tiles of `block_rows` full rows (dealt round-robin, `Blocks.interleave`) and streams them GMEM -> SMEM
(TMA) -> registers -> SMEM -> GMEM (TMA) with `max_concurrent_steps` tiles in flight. The bias is read once per
program into registers.

Layouts: the (R, F) arrays are viewed as (R·F/LANES, LANES) — a free reshape — so a tile of `block_rows` rows is a
2-D TMA box of (block_rows·F/LANES, LANES), within TMA's 256-per-dimension limit. In registers every value uses the
WG_STRIDED layout (a flat array dealt to the 128 threads in vectors of `vec` = 8 bytes / itemsize elements), so
(a) a tile reshapes freely between (tile rows, LANES), (block_rows, F) and flat; (b) the dropout element index
(row_offset + row)·F + col is the tile's first flat index plus a 1-D iota; (c) the bias (F,) broadcasts over the
tile's rows when F is a multiple of 128·vec (each thread then meets the same columns in every row). Strided arrays
cannot be reduced along one axis, so the backward keeps the bias gradient as an elementwise (block_rows, F) sum over
its tiles (a loop carry) and folds the rows through SMEM once per program: its partials are (programs, F), written
from registers to GMEM and summed by the caller.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.pallas import mosaic_gpu as plgpu

from .._math import _SQRT_HALF, gelu_grad, gelu_grad_from_terms, gelu_terms
from .. import _mgpu
from .._mgpu import (LANES, check_rows, iota, kernel_call, pipeline, reciprocal, split_programs, strided, vec_size,
                     zeros)
from ..dropout import keep_mask_lanes, keep_scale

__all__ = ["Blocks", "backward", "check_shape", "default_blocks", "forward"]


@dataclasses.dataclass(frozen=True)
class Blocks:
    """Rows per pipeline step, tiles in flight and the target number of programs (CTAs) of each pass."""
    block_rows: int = 2
    max_concurrent_steps: int = 3
    programs: int = 264  # 2 per SM on an H100/H200; the largest divisor of the tile count not above it is used
    bwd_block_rows: int = 1
    bwd_max_concurrent_steps: int = 3
    bwd_programs: int = 264
    # Both kernels' tiles dealt round-robin to the programs (`_mgpu.tile_order`), not a contiguous run per program:
    # fwd+bwd -3.5 to -4% without dropout (BERT's FFN), -1.5% to +0.2% with (H200); -1 to -3.6% on the H100
    # (kernels-h200.md and kernels-h100.md, bias+GELU).
    interleave: bool = True
    # exp as ex2.approx.ftz (~2 ulp) and erf's 1/Q as rcp.approx.ftz (<= 1 ulp; `_mgpu.reciprocal`), within the
    # tests' bound of the reference (float32 1e-5 relative); off: IEEE exp and division
    approx_math: bool = True


def default_blocks(rows: int, width: int, rate: float = 0.0, *, kind: str = "") -> Blocks:
    """One row per backward step (its registers also hold the bias and the bias-gradient accumulator); the rest per
    GPU `kind` (jax's device kind), from alternating A/Bs of device time (kernels-h200.md and kernels-h100.md,
    bias+GELU): on the H200 (and others; compute-bound with dropout) forward tiles of ~8K elements (2 rows of 3072 or
    4096) and the backward with 3 steps in flight, 2 without dropout from 4096 wide; on the H100 (~3.0 TB/s,
    memory-bound either way) at most 6K elements per forward tile with dropout (1 row of 4096) and 2 backward steps
    in flight everywhere."""
    del rows
    if "H100" in kind:
        return Blocks(block_rows=max(1, (6144 if rate else 8192) // width), bwd_max_concurrent_steps=2)
    return Blocks(block_rows=max(1, 8192 // width), bwd_max_concurrent_steps=2 if not rate and width >= 4096 else 3)


def candidate_blocks(around: Blocks, *, stage: str) -> list[Blocks]:
    """Block sizes the autotuner (and `benchmarks/kernels.py --tune`) tries around `around`, per stage: rows per
    step in (1, 2, 4)."""
    return _mgpu.row_block_candidates(around, (1, 2, 4), stage=stage)


def check_shape(rows: int, width: int, dtype, blocks: Blocks) -> None:
    """ValueError (before any compile) where `forward` or `backward` would not take a (rows, width) shard."""
    check_rows(rows, width, dtype, blocks.block_rows, "block_rows")
    check_rows(rows, width, dtype, blocks.bwd_block_rows, "bwd_block_rows")


# ----------------------------------------------------------------------------------------------------------------

def _keep(seeds, tile_index, br, width, vec, interpret, rate):
    """The keep mask of tile `tile_index` (`br` rows of `width`) under `seeds` = (seed0, seed1, row offset), read once
    per program: elements (offset + first row)·width + [0, br·width), in the pair form (`keep_mask_lanes`: one hash
    per two lanes once the compiler sees the shared expression). `check_rows` makes the width a multiple of 256, so
    the first element is even."""
    s0, s1, offset = seeds
    first = (offset + (tile_index * br).astype(jnp.uint32)) * jnp.uint32(width)
    return keep_mask_lanes((s0, s1), first, iota(br * width, vec, interpret), rate)


def _forward(x, bias, seed_words, *, rate, interpret, blocks: Blocks, with_grad: bool = False):
    """x (R, F), bias (F,), seed_words uint32[4] = [seed0, seed1, row_offset, head_offset] -> y (R, F) in x.dtype;
    `with_grad` (no dropout): also GELU'(x + bias) in x.dtype, from the same erf (`pallas_kernels.gelu_dense`'s
    backward multiplies by it in its GEMM's epilogue)."""
    rows, width = x.shape
    br = blocks.block_rows
    check_rows(rows, width, x.dtype, br, "block_rows")
    if with_grad and rate:
        raise ValueError(f"with_grad needs rate=0 (got {rate})")
    n, vec = br * width, vec_size(x.dtype)
    tile = (n // LANES, LANES)
    programs, steps = split_programs(rows // br, blocks.programs)
    tile_of = _mgpu.tile_order(blocks.interleave, programs, steps)
    scale = keep_scale(rate)  # 1 without dropout
    recip = functools.partial(reciprocal, vec=vec, interpret=interpret, approx=blocks.approx_math)

    def body(x_gmem, b_gmem, seed_gmem, y_gmem, *g_gmem):
        p = lax.axis_index("p")
        bc = strided(b_gmem[...], vec, interpret) * _SQRT_HALF  # (F,) float32 b/√2, once per program
        seeds = _mgpu.seeds(seed_gmem, rate)

        def step(idx, x_smem, y_smem, *g_smem):
            x = x_smem[...].astype(jnp.float32).reshape(br, width)
            z, cdf = gelu_terms(x, bc, scale, recip)
            z, cdf = z.reshape(n), cdf.reshape(n)
            if rate:  # the mask selects the factor (z·0 = 0 for the finite z of a finite input)
                cdf = jnp.where(_keep(seeds, tile_of(p, idx[0]), br, width, vec, interpret, rate), cdf, 0.0)
            y_smem[...] = (z * cdf).astype(y_smem.dtype).reshape(tile)
            if g_smem:  # GELU' from the same erf: cdf = (1 + erf(z))/√2 without dropout
                g = gelu_grad_from_terms(z, cdf * _SQRT_HALF, 1.0)
                g_smem[0][...] = g.astype(g_smem[0].dtype).reshape(tile)

        spec = plgpu.BlockSpec(tile, lambda s: (tile_of(p, s), 0))
        pipeline(step, steps=steps, in_specs=[spec], out_specs=[spec] * (1 + len(g_gmem)),
                 max_concurrent_steps=blocks.max_concurrent_steps, interpret=interpret)(x_gmem, y_gmem, *g_gmem)

    out = jax.ShapeDtypeStruct((rows * width // LANES, LANES), x.dtype)
    outs = kernel_call(body, (out, out) if with_grad else out, programs=programs, interpret=interpret,
                       approx_math=blocks.approx_math, name="bias_gelu_fwd_grad_mgpu" if with_grad else
                       "bias_gelu_fwd_mgpu")(x.reshape(-1, LANES), bias.astype(jnp.float32), seed_words)
    if with_grad:
        return tuple(o.reshape(rows, width) for o in outs)
    return outs.reshape(rows, width)


def _backward(x, bias, seed_words, dy, *, rate, interpret, blocks: Blocks):
    """Returns dx (R, F) in x.dtype and the bias gradient's partial sums (programs, F), float32."""
    rows, width = x.shape
    br = blocks.bwd_block_rows
    check_rows(rows, width, x.dtype, br, "bwd_block_rows")
    if dy.shape != x.shape:
        raise ValueError(f"dy.shape={dy.shape} must equal x.shape={x.shape}")
    n, vec = br * width, vec_size(x.dtype)
    if vec_size(dy.dtype) != vec:
        raise ValueError(f"dy.dtype={dy.dtype} must have the itemsize of x.dtype={x.dtype}")
    tile = (n // LANES, LANES)
    programs, steps = split_programs(rows // br, blocks.bwd_programs)
    tile_of = _mgpu.tile_order(blocks.interleave, programs, steps)
    scale = keep_scale(rate)  # 1 without dropout
    recip = functools.partial(reciprocal, vec=vec, interpret=interpret, approx=blocks.approx_math)

    def body(x_gmem, b_gmem, seed_gmem, dy_gmem, dx_gmem, db_gmem, *acc_smem):
        p = lax.axis_index("p")
        bc = strided(b_gmem[...], vec, interpret) * _SQRT_HALF
        seeds = _mgpu.seeds(seed_gmem, rate)

        def step(idx, x_smem, dy_smem, dx_smem, acc):
            x = x_smem[...].astype(jnp.float32).reshape(br, width)
            grad = gelu_grad(x, bc, scale, recip).reshape(n)  # times the scale
            if rate:
                grad = jnp.where(_keep(seeds, tile_of(p, idx[0]), br, width, vec, interpret, rate), grad, 0.0)
            dx = dy_smem[...].astype(jnp.float32).reshape(n) * grad
            dx_smem[...] = dx.astype(dx_smem.dtype).reshape(tile)
            return acc + dx

        spec = plgpu.BlockSpec(tile, lambda s: (tile_of(p, s), 0))
        acc = pipeline(step, steps=steps, in_specs=[spec, spec], out_specs=[spec],
                       max_concurrent_steps=blocks.bwd_max_concurrent_steps, interpret=interpret,
                       init_carry=zeros(n, vec, interpret))(x_gmem, dy_gmem, dx_gmem)
        # Fold the accumulator's rows through SMEM (strided arrays have no per-axis reduction; the store's barrier
        # orders the row reads), then one row of partial sums per program, from registers straight to GMEM.
        if br == 1:
            total = acc
        else:
            (acc_ref,) = acc_smem
            acc_ref[...] = acc.reshape(br, width)
            total = acc_ref[0]
            for r in range(1, br):
                total = total + acc_ref[r]
        db_gmem[p] = total

    out = (jax.ShapeDtypeStruct((rows * width // LANES, LANES), x.dtype),
           jax.ShapeDtypeStruct((programs, width), jnp.float32))
    scratch = (plgpu.SMEM((br, width), jnp.float32),) if br > 1 else ()
    dx, db = kernel_call(body, out, programs=programs, interpret=interpret, approx_math=blocks.approx_math,
                         name="bias_gelu_bwd_mgpu", scratch_types=scratch)(
        x.reshape(-1, LANES), bias.astype(jnp.float32), seed_words, dy.reshape(-1, LANES))
    return dx.reshape(rows, width), db


forward = _mgpu.one_module(_forward, ("rate", "interpret", "blocks", "with_grad"))
backward = _mgpu.one_module(_backward, ("rate", "interpret", "blocks"))
