"""Mosaic GPU (Hopper+) kernel of the feed-forward's input gradient with GELU's derivative in the GEMM's epilogue:

    dx = (dy[M, K] @ w[N, K]^T) * g[M, N],   g = GELU'(x + bias) (written by the forward's bias+GELU kernel)
    db[i, :] = column sums of dx's rows of tile i (as stored)

Without it the product dy @ w^T is one cuBLAS GEMM that writes a bf16 (M, N) array, and bias+GELU's backward reads it
back with x to write dx: three (M, N) passes over HBM besides dx's. Here the product stays in float32 registers,
g's tile is fetched by TMA while the product runs, and dx and the bias gradient's partial sums are all that is
written. The derivative comes from the forward (one more bf16 write there) because computing it here, in the
consumer warpgroups while the tensor cores wait, cost more than cuBLAS plus bias+GELU's backward
(benchmarks/results/kernels-h100.md, GELU in the GEMM's epilogue).

The GEMM is JAX's warp-specialized Hopper GEMM (jax.experimental.pallas.ops.gpu.hopper_matmul_mgpu): a persistent
grid of one CTA per SM walking the (M, N) tiles in a snake order, a producer warpgroup streaming (tile_m, tile_k)
tiles of dy and (2 tile_n, tile_k) tiles of w into a `max_concurrent_steps`-deep SMEM ring, two consumer warpgroups
issuing wgmma on the two halves of the CTA tile along N (w's tile read transposed: it is stored (N, K), the order of
the forward's kernel FD). Each consumer's epilogue works in (64, epi_n) sub-tiles of its float32 accumulator: g's
sub-tiles, requested before the product, are overwritten in SMEM by dx and stored by TMA. The column sums are a
wgmma too, dx^T @ ones (row h of the result is column h's sum): a reduction over the accumulator's rows would cross
warps through SMEM scratch that the two consumer warpgroups share.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from .. import _mgpu

__all__ = ["Blocks", "backward_input", "check_shape"]

_EPI_M = 64  # rows of an epilogue sub-tile (one wgmma row block)


@dataclasses.dataclass(frozen=True)
class Blocks:
    """A consumer warpgroup's (tile_m, tile_n) output tile (the CTA's is (tile_m, 2 tile_n)), the K step, the SMEM
    ring's depth, the epilogue sub-tile's columns and the tile walk (`plgpu.planar_snake`: `grid_tile_width`
    row tiles per band)."""
    tile_m: int = 128
    tile_n: int = 128
    tile_k: int = 64
    max_concurrent_steps: int = 3
    epi_n: int = 64
    grid_tile_width: int = 1


def check_shape(m: int, k: int, n: int, dtype, blocks: Blocks) -> None:
    """ValueError (before any compile) where `backward_input` does not take dy (m, k), w (n, k) and g (m, n)."""
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        raise ValueError(f"dtype={jnp.dtype(dtype).name} must be bfloat16 or float16 for the wgmma kernel")
    b = blocks
    for name, size, tile in (("rows", m, b.tile_m), ("width", n, 2 * b.tile_n), ("depth", k, b.tile_k)):
        if size % tile:
            raise ValueError(f"{name}={size} must be a multiple of {tile} (the kernel's tile) for the Mosaic GPU "
                             "GEMM epilogue kernel")
    if b.tile_m % _EPI_M or b.tile_n % b.epi_n:
        raise ValueError(f"blocks={b} must tile tile_m by {_EPI_M} and tile_n by epi_n")


def _transforms(cols: int, dtype):
    swizzle = plgpu.find_swizzle(cols * jnp.dtype(dtype).itemsize * 8)
    return (plgpu.TilingTransform((8, swizzle // jnp.dtype(dtype).itemsize)), plgpu.SwizzleTransform(swizzle))


def _backward_input(dy, w, g, *, blocks: Blocks, interpret: bool):
    """dy (M, K), w (N, K), g (M, N) in one 16-bit dtype -> dx = (dy @ w^T) * g (M, N) in g.dtype and the column
    sums of dx's tiles of rows (M / tile_m, N) float32."""
    (m, k), (n, _) = dy.shape, w.shape
    check_shape(m, k, n, g.dtype, blocks)
    b = blocks
    tm, tn, tk, en = b.tile_m, b.tile_n, b.tile_k, b.epi_n
    cta_n = 2 * tn
    m_iters, n_iters, k_iters = m // tm, n // cta_n, k // tk
    col_blocks = tn // en
    n_epi = (tm // _EPI_M) * col_blocks
    in_transforms = _transforms(tk, dy.dtype)
    epi_transforms = _transforms(en, g.dtype)
    ones_transforms = _transforms(_EPI_M, g.dtype)

    def pipeline_of(body, compute_context):
        spec = functools.partial(plgpu.BlockSpec, transforms=in_transforms, memory_space=plgpu.SMEM)
        w_spec = spec((tk, cta_n), lambda kk: (kk, 0)) if interpret else spec((cta_n, tk), lambda kk: (0, kk))
        return plgpu.emit_pipeline_warp_specialized(
            body, grid=(k_iters,), memory_registers=40, in_specs=[spec((tm, tk), lambda kk: (0, kk)), w_spec],
            wg_axis="wg", num_compute_wgs=2, max_concurrent_steps=b.max_concurrent_steps,
            compute_context=compute_context)

    def column_sums(e_smem, ones, acc):
        """(en,) column sums of the (64, en) SMEM tile `e_smem`, added to `acc` (or None); `ones`: (64, 64) SMEM."""
        if interpret:  # interpret mode's wgmma takes no transposed operand; no shared scratch there either
            part = jnp.sum(e_smem[...].astype(jnp.float32), axis=0)
            return part if acc is None else acc + part

        def product(ref):
            plgpu.wgmma(ref, e_smem.transpose((1, 0)), ones)  # (en, 64): every column the sums
            return ref[...]
        sums = pl.run_scoped(product, plgpu.ACC((en, _EPI_M), jnp.float32))
        part = jnp.sum(sums, axis=1) * jnp.float32(1 / _EPI_M)  # within each warp's rows; exact (a power of 2)
        return part if acc is None else acc + part

    def kernel(dy_gmem, w_gmem, g_gmem, dx_gmem, db_gmem):
        ignore = lambda *_, **__: None  # noqa: E731  (the allocations do not depend on the bodies)

        @functools.partial(
            pl.run_scoped,
            pipeline_allocs=pipeline_of(ignore, ignore).get_allocations(dy_gmem, w_gmem),
            g_smem=plgpu.SMEM((2, n_epi, _EPI_M, en), g.dtype, transforms=epi_transforms),
            o_smem=plgpu.SMEM((_EPI_M, _EPI_M), g.dtype, transforms=ones_transforms),
            s_smem=plgpu.SMEM((2, tn), jnp.float32),
            g_bar=plgpu.Barrier(num_barriers=2 * n_epi),
            o_bar=plgpu.Barrier(num_barriers=1),
            collective_axes="wg",
        )
        def scope(pipeline_allocs, g_smem, o_smem, s_smem, g_bar, o_bar):
            wg = lax.axis_index("wg")
            if not interpret:  # warpgroup 0 writes the ones tile once; warpgroup 1 waits for it before its first sums
                @pl.when(wg == 0)
                def _ones():
                    o_smem[...] = jnp.ones((_EPI_M, _EPI_M), g.dtype)
                    plgpu.commit_smem()
                    plgpu.barrier_arrive(o_bar.at[0])

                @pl.when(wg == 1)
                def _wait_ones():
                    plgpu.barrier_wait(o_bar.at[0])

            @plgpu.nd_loop((m_iters * n_iters,), collective_axes="cluster_grid")
            def _tiles(info):
                (lin,) = info.index
                mi, ni = plgpu.planar_snake(lin, (m_iters, n_iters), 1, b.grid_tile_width)
                rows, cols = pl.ds(mi * tm, tm), pl.ds(ni * cta_n + wg * tn, tn)  # this warpgroup's tile

                def sub(ref, e):  # epilogue sub-tile e of this warpgroup's tile of an (M, N) array
                    i, j = divmod(e, col_blocks)
                    return ref.at[rows, cols].at[pl.ds(i * _EPI_M, _EPI_M), pl.ds(j * en, en)]

                def compute_context(eval_pipeline):
                    # The previous tile's stores have read g_smem and s_smem; fetch this tile's g so that it
                    # arrives while the product runs.
                    plgpu.wait_smem_to_gmem(0, wait_read_only=True)
                    for e in range(n_epi):
                        plgpu.copy_gmem_to_smem(sub(g_gmem, e), g_smem.at[wg, e], g_bar.at[wg * n_epi + e])

                    @functools.partial(pl.run_scoped, acc_ref=plgpu.ACC((tm, tn), jnp.float32))
                    def _acc(acc_ref):
                        eval_pipeline(acc_ref)
                        acc = acc_ref[...]
                        for j in range(col_blocks):
                            col_sum = None
                            for i in range(tm // _EPI_M):
                                e = i * col_blocks + j
                                plgpu.barrier_wait(g_bar.at[wg * n_epi + e])
                                tile = g_smem.at[wg, e]
                                dx = acc[i * _EPI_M:(i + 1) * _EPI_M, j * en:(j + 1) * en] * \
                                    tile[...].astype(jnp.float32)
                                tile[...] = dx.astype(tile.dtype)
                                plgpu.commit_smem()  # visible to the TMA store and to the sums' wgmma
                                plgpu.copy_smem_to_gmem(tile, sub(dx_gmem, e))
                                col_sum = column_sums(tile, o_smem, col_sum)
                            s_smem[wg, pl.ds(j * en, en)] = col_sum
                        plgpu.commit_smem()
                        plgpu.copy_smem_to_gmem(s_smem.at[wg], db_gmem.at[mi, cols])

                def mma(_, a_smem, w_smem, acc_ref):
                    if interpret:  # w arrives as (K, N): interpret mode's wgmma takes no transposed operand
                        w_tile = w_smem.at[:, pl.ds(wg * tn, tn)]
                    else:  # (tn, tk), this warpgroup's rows of w, read transposed
                        w_tile = w_smem.at[pl.ds(wg * tn, tn)].transpose((1, 0))
                    plgpu.wgmma(acc_ref, a_smem, w_tile)
                    plgpu.wgmma_wait(0)
                    return acc_ref

                w_cols = pl.ds(ni * cta_n, cta_n)
                pipeline_of(mma, compute_context)(dy_gmem.at[rows, :],
                                                  w_gmem.at[:, w_cols] if interpret else w_gmem.at[w_cols, :],
                                                  allocations=pipeline_allocs)

        plgpu.wait_smem_to_gmem(0, wait_read_only=True)

    num_sms = 2 if interpret else jax.devices()[0].core_count
    out = (jax.ShapeDtypeStruct((m, n), g.dtype), jax.ShapeDtypeStruct((m_iters, n), jnp.float32))
    f = plgpu.kernel(kernel, out_type=out, grid=(num_sms,), grid_names=("cluster_grid",), cluster=(1,),
                     cluster_names=("cluster",), num_threads=3, thread_name="wg",
                     compiler_params=plgpu.CompilerParams(approx_math=True,
                                                          lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
                     interpret=_mgpu.interpret_params(interpret), kernel_name="gelu_dense_dx_mgpu")
    return f(dy, w.T if interpret else w, g)


backward_input = _mgpu.one_module(_backward_input, ("blocks", "interpret"))
