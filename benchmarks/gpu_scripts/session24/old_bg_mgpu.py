"""bias+GELU's Mosaic GPU kernels as of 34429b8 (session 23: h = x + b, erf's 1/Q from rsqrt.approx, the dropout
scale as a multiply), kept for session 24's alternating A/B against main's z-form (`ab_gelu_z.py`). Imports made
absolute; session 23's `_math.erf_f32(approx=True)` and `gelu_and_grad(approx=)` (1/Q from rsqrt.approx) copied in,
as main's `_math` dropped that form."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels._math import _ERF_P, _ERF_Q, _SQRT_HALF
from pallas_kernels import _mgpu
from pallas_kernels._mgpu import (LANES, check_rows, iota, kernel_call, pipeline, split_programs, strided, supported,
                                  vec_size, zeros)
from pallas_kernels.dropout import keep_mask_lanes, keep_scale

__all__ = ["Blocks", "backward", "default_blocks", "forward", "supported"]

_INV_SQRT_2PI = 0.3989422804014327


def erf_f32(x, *, approx: bool = False):
    """Session 23's `_math.erf_f32`: x·P(x²)/Q(x²), with `approx` 1/Q = -rsqrt(-Q)² (rsqrt.approx under approx_math)."""
    x = jnp.clip(x, -4.0, 4.0)
    x2 = x * x
    p = jnp.float32(_ERF_P[0])
    for a in _ERF_P[1:]:
        p = p * x2 + jnp.float32(a)
    q = jnp.float32(_ERF_Q[0])
    for b in _ERF_Q[1:]:
        q = q * x2 + jnp.float32(b)
    if approx:
        r = jax.lax.rsqrt(-q)
        return -(x * p) * (r * r)
    return x * p / q


def gelu_and_grad(h, *, approx: bool = False):
    """Session 23's `_math.gelu_and_grad`."""
    cdf = 0.5 * (1.0 + erf_f32(h * _SQRT_HALF, approx=approx))
    return h * cdf, cdf + h * jnp.exp(-0.5 * h * h) * _INV_SQRT_2PI

@dataclasses.dataclass(frozen=True)
class Blocks:
    """Rows per pipeline step, tiles in flight and the target number of programs (CTAs) of each pass."""
    block_rows: int = 2
    max_concurrent_steps: int = 3
    programs: int = 264  # 2 per SM on an H100/H200; the largest divisor of the tile count not above it is used
    bwd_block_rows: int = 1
    bwd_max_concurrent_steps: int = 3
    bwd_programs: int = 264
    # exp as ex2.approx (~2 ulp) and erf's divide from rsqrt.approx (`erf_f32`): fwd+bwd 4-6% faster with dropout,
    # 1-5% without (H200, session 22), within the tests' bound of the reference (float32 1e-5 relative)
    approx_math: bool = True


def default_blocks(rows: int, width: int, rate: float = 0.0) -> Blocks:
    """Forward tiles of ~8K elements without dropout (2 rows of 3072 or 4096), at most 6K with (2 rows of 3072, 1 of
    4096: 48 per thread, room for the hash); one row per backward step (its registers also hold the bias and the
    bias-gradient accumulator), 3 steps in flight. From a sweep of rows per step 1/2/4 x steps in flight 2/3/4 x
    132/264 programs (H200 device time, benchmarks/results/kernels-h200.md, "Session 22"): with dropout 2 rows of
    4096 per forward step took 59.7 / 225.5 us at 8192 / 32768 rows, 1 row 53.4 / 202.5; without, 1 row was 0-4%
    slower than 2 and 3072 wide preferred 2 either way; the backward with 3 steps in flight was 0-4% faster than with
    4 (the default before)."""
    del rows
    return Blocks(block_rows=max(1, (6144 if rate else 8192) // width))


def candidate_blocks(around: Blocks, *, stage: str) -> list[Blocks]:
    """Block sizes the autotuner (and `benchmarks/kernels.py --tune`) tries around `around`, per stage: rows per
    step in (1, 2, 4)."""
    return _mgpu.row_block_candidates(around, (1, 2, 4), stage=stage)


# ----------------------------------------------------------------------------------------------------------------

def _keep(s0, s1, first, n, vec, interpret, rate):
    """The tile's keep mask: elements first + [0, n), in the pair form (`keep_mask_lanes`: one hash per two lanes once
    the compiler sees the shared expression). `check_rows` makes the width a multiple of 256, so `first` is even."""
    return keep_mask_lanes((s0, s1), first, iota(n, vec, interpret), rate)


def _gelu(h, approx: bool):
    """u·Φ(u) with the same float32 operations as `gelu_and_grad`'s first output (no derivative computed)."""
    return h * (0.5 * (1.0 + erf_f32(h * _SQRT_HALF, approx=approx)))


def _forward(x, bias, seed_words, *, rate, interpret, blocks: Blocks):
    """x (R, F), bias (F,), seed_words uint32[4] = [seed0, seed1, row_offset, head_offset] -> y (R, F) in x.dtype."""
    rows, width = x.shape
    br = blocks.block_rows
    check_rows(rows, width, x.dtype, br, "block_rows")
    n, vec = br * width, vec_size(x.dtype)
    tile = (n // LANES, LANES)
    programs, steps = split_programs(rows // br, blocks.programs)

    def body(x_gmem, b_gmem, seed_gmem, y_gmem):
        p = lax.axis_index("p")
        b = strided(b_gmem[...], vec, interpret)  # (F,) float32, once per program
        if rate:
            s0, s1, offset = seed_gmem[0], seed_gmem[1], seed_gmem[2]

        def step(idx, x_smem, y_smem):
            h = x_smem[...].astype(jnp.float32).reshape(br, width) + b
            y = _gelu(h, blocks.approx_math).reshape(n)
            if rate:
                first_row = (p * steps + idx[0]) * br
                first = (offset + first_row.astype(jnp.uint32)) * jnp.uint32(width)
                y = jnp.where(_keep(s0, s1, first, n, vec, interpret, rate), y * keep_scale(rate), 0.0)
            y_smem[...] = y.astype(y_smem.dtype).reshape(tile)

        spec = plgpu.BlockSpec(tile, lambda s: (p * steps + s, 0))
        pipeline(step, steps=steps, in_specs=[spec], out_specs=[spec],
                 max_concurrent_steps=blocks.max_concurrent_steps, interpret=interpret)(x_gmem, y_gmem)

    out = jax.ShapeDtypeStruct((rows * width // LANES, LANES), x.dtype)
    y = kernel_call(body, out, programs=programs, interpret=interpret, approx_math=blocks.approx_math,
                    name="bias_gelu_fwd_mgpu")(x.reshape(-1, LANES), bias.astype(jnp.float32), seed_words)
    return y.reshape(rows, width)


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

    def body(x_gmem, b_gmem, seed_gmem, dy_gmem, dx_gmem, db_gmem, *acc_smem):
        p = lax.axis_index("p")
        b = strided(b_gmem[...], vec, interpret)
        if rate:
            s0, s1, offset = seed_gmem[0], seed_gmem[1], seed_gmem[2]

        def step(idx, x_smem, dy_smem, dx_smem, acc):
            h = x_smem[...].astype(jnp.float32).reshape(br, width) + b
            grad = gelu_and_grad(h, approx=blocks.approx_math)[1].reshape(n)
            g = dy_smem[...].astype(jnp.float32).reshape(n)
            if rate:
                first_row = (p * steps + idx[0]) * br
                first = (offset + first_row.astype(jnp.uint32)) * jnp.uint32(width)
                g = jnp.where(_keep(s0, s1, first, n, vec, interpret, rate), g * keep_scale(rate), 0.0)
            dx = g * grad
            dx_smem[...] = dx.astype(dx_smem.dtype).reshape(tile)
            return acc + dx

        spec = plgpu.BlockSpec(tile, lambda s: (p * steps + s, 0))
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


forward = _mgpu.one_module(_forward, ("rate", "interpret", "blocks"))
backward = _mgpu.one_module(_backward, ("rate", "interpret", "blocks"))
