"""Session 28: is the kernels' distance from the floor their structure or their arithmetic? Copy kernels built like
the shipped Mosaic GPU kernels — the same grid, tiles, tiles in flight, tile order, loads and stores — with the
arithmetic replaced by an add, timed (device time on rotated inputs) next to the shipped operator and `floors.py`'s
floor (XLA's plain kernels moving the same arrays):

- BDRLN: the forward reads x and r by TMA and stores x + r from registers to GMEM (`_Tile`'s row layout, one
  warpgroup barrier per step, as `kernel_mgpu._forward`); the backward reads x, r and dy and stores x + dy and r + dy
  the same way (as `_backward`, without its statistics, column sums or partial-sum launch). Blocks: BDRLN's
  `default_blocks` with dropout.
- bias+GELU: the forward reads x and writes x + x through SMEM and TMA, the backward reads x and dy and writes x + dy
  (as `bias_gelu.kernel_mgpu`, without the bias gradient). Blocks: its `default_blocks` with dropout.

    PYTHONPATH=. python benchmarks/gpu_scripts/session28/structure.py [--rounds 2] [--bdrln 8192x768,...]
        [--gelu 8192x3072,...]
"""
import functools
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # floors.py
from floors import (bdrln_floor, fwd_bwd, gelu_floor, gelu_inputs, kernels_cell, parser, shapes,  # noqa: E402
                    timed_rounds, total_of)

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "session22"))  # its common.py
from common import bdrln_inputs, copy_device_time, header, keys  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402
from jax.experimental import pallas as pl  # noqa: E402
from jax.experimental.pallas import mosaic_gpu as plgpu  # noqa: E402

from pallas_kernels import _mgpu  # noqa: E402
import pallas_kernels.bias_dropout_residual_layernorm as bdrln  # noqa: E402
from pallas_kernels.bias_dropout_residual_layernorm import kernel_mgpu as km  # noqa: E402
import pallas_kernels.bias_gelu as bias_gelu  # noqa: E402
from pallas_kernels.bias_gelu import kernel_mgpu as gm  # noqa: E402


def _row_kernel(n_in: int, outs, br: int, steps_in_flight: int, target: int, interleave: bool, name: str):
    """A BDRLN-shaped copy kernel: `n_in` (R, D) inputs by TMA, `outs(loaded) -> values` stored from registers."""
    def call(*arrays):
        rows, width = arrays[0].shape
        dtype = arrays[0].dtype
        tile, flat, view = km._views(br, width, False)
        programs, steps = _mgpu.split_programs(rows // br, target)
        tile_of = _mgpu.tile_order(interleave, programs, steps)
        n_out = len(outs([0] * n_in))

        def body(*refs):
            ins, dsts = refs[:n_in], refs[n_in:]
            p = lax.axis_index("p")
            t = km._Tile((br, width), km._vec(dtype), False)

            def step(idx, *smem):
                first_row = tile_of(p, idx[0]) * br
                for dst, v in zip(dsts, outs([t.load(view(s)) for s in smem])):
                    t.store(dst.at[pl.ds(first_row, br)], v.astype(dtype))
                _mgpu.warpgroup_barrier(False, auto_barriers=False)

            spec = plgpu.BlockSpec(tile, lambda s: (tile_of(p, s), 0))
            _mgpu.pipeline(step, steps=steps, in_specs=[spec] * n_in, out_specs=[],
                           max_concurrent_steps=steps_in_flight, interpret=False)(*ins)

        out = tuple(jax.ShapeDtypeStruct((rows, width), dtype) for _ in range(n_out))
        return _mgpu.kernel_call(body, out, programs=programs, interpret=False, approx_math=True, name=name,
                                 auto_barriers=False)(*(flat(a) for a in arrays))
    return call


def bdrln_structure(args, *, rows, width):
    b = km.default_blocks(rows, width, rate=0.1)
    fwd = _row_kernel(2, lambda v: (v[0] + v[1],), b.block_rows, b.max_concurrent_steps, b.programs,
                      b.fwd_interleave, "copy_fwd")
    bwd = _row_kernel(3, lambda v: (v[0] + v[2], v[1] + v[2]), b.bwd_block_rows, b.bwd_max_concurrent_steps,
                      b.bwd_programs, b.bwd_interleave, "copy_bwd")
    x, _, res, _, _ = args
    (y,) = fwd(x, res)
    return bwd(x, res, y)


def gelu_structure(args, *, rows, width, direct=False):
    """bias+GELU's pipeline shape: TMA in and out through SMEM (Pallas' own barriers), flat (n/LANES, LANES) tiles;
    `direct`: the output stored from registers straight to GMEM instead (no SMEM staging, no TMA store)."""
    b = gm.default_blocks(rows, width, rate=0.1)
    x = args[0]

    def kernel(n_in, br, steps_in_flight, target, name):
        tile = (br * width // _mgpu.LANES, _mgpu.LANES)
        programs, steps = _mgpu.split_programs(rows // br, target)
        tile_of = _mgpu.tile_order(b.interleave, programs, steps)

        def body(*refs):
            p = lax.axis_index("p")
            y_gmem = refs[-1]

            def step(idx, *smem):
                ins = smem[:n_in]
                total = ins[0][...].astype(jnp.float32)
                total = total + (ins[1][...].astype(jnp.float32) if n_in == 2 else total)
                if direct:
                    _mgpu.store(y_gmem.at[pl.ds(tile_of(p, idx[0]) * tile[0], tile[0])], total.astype(y_gmem.dtype),
                                interpret=False)
                else:
                    smem[-1][...] = total.astype(smem[-1].dtype)

            spec = plgpu.BlockSpec(tile, lambda s: (tile_of(p, s), 0))
            _mgpu.pipeline(step, steps=steps, in_specs=[spec] * n_in, out_specs=[] if direct else [spec],
                           max_concurrent_steps=steps_in_flight, interpret=False)(*(refs[:-1] if direct else refs))

        flat_shape = jax.ShapeDtypeStruct((rows * width // _mgpu.LANES, _mgpu.LANES), x.dtype)
        return _mgpu.kernel_call(body, flat_shape, programs=programs, interpret=False, approx_math=True, name=name)

    xf = x.reshape(-1, _mgpu.LANES)
    y = kernel(1, b.block_rows, b.max_concurrent_steps, b.programs, "copy_fwd")(xf)
    return kernel(2, b.bwd_block_rows, b.bwd_max_concurrent_steps, b.bwd_programs, "copy_bwd")(xf, y)


def main():
    ap = parser()
    a = ap.parse_args()
    _, gbs = copy_device_time()
    header("fwd+bwd, the shipped operator with dropout 0.1, its structure as a copy, and the floor", a.calls,
           ["op", "shape", "impl", "round", "total", "% of copy BW", "kernels (us)"], gbs)
    key, seed = keys()
    cases = []
    for rows, d in shapes(a.bdrln):
        args = bdrln_inputs(key, rows, d)
        cases.append(("bdrln", rows, d, 8 * rows * d * 2, args, {
            "auto": fwd_bwd(lambda *t: bdrln.bias_dropout_residual_layernorm(*t, seed=seed, rate=0.1, eps=1e-12),
                            args),
            "structure": functools.partial(bdrln_structure, rows=rows, width=d),
            "floor": functools.partial(bdrln_floor, rate=0.1)}))
    for rows, d in shapes(a.gelu):
        args = gelu_inputs(key, rows, d)
        cases.append(("bias_gelu", rows, d, 5 * rows * d * 2, args, {
            "auto": fwd_bwd(lambda *t: bias_gelu.bias_gelu(*t, seed=seed, rate=0.1), args),
            "structure": functools.partial(gelu_structure, rows=rows, width=d),
            "structure, direct stores": functools.partial(gelu_structure, rows=rows, width=d, direct=True),
            "floor": functools.partial(gelu_floor, rate=0.1)}))
    for op, rows, d, nbytes, args, steps in cases:
        for r, order, times in timed_rounds(steps, args, a.calls, a.rounds):
            for name in order:  # as timed
                total = total_of(times[name])
                print(f"| {op} | {rows}x{d} | {name} | {r} | {total:.1f} | "
                      f"{100 * nbytes / (total * 1e-6) / (gbs * 1e9):.1f}% | {kernels_cell(times[name])} |", flush=True)

if __name__ == "__main__":
    main()
