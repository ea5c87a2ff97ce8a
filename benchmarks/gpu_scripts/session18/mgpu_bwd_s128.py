"""Session 18 prototype: a one-kernel flash-attention backward for T = S = 128, H = 64 in Mosaic GPU (wgmma), to
measure whether Hopper's asynchronous matrix unit moves the S=128 backward where Triton's one-kernel backward
(`kernel._bwd_fused_kernel`, 32 x 128 x 64 products at ~100 TFLOP/s: kernels-h200.md, session 7) cannot.

Prototype scope: no key mask, no dropout, no bias, separate (B, S, N, H) q/k/v; delta = rowsum(dO * O) by XLA (as
JAX's own Mosaic GPU attention does). One CTA per (b, n), two compute warpgroups. Warpgroup w owns queries
[64w, 64w + 64): it forms its scores S_w = Q_w K^T as two 64 x 64 key halves, P, dP = dO_w V^T, dS, and
dQ_w = dS_w K complete in registers; it writes P and dS (bf16) to SMEM as (key half, query, key) tiles; after a
barrier between the two warpgroups, warpgroup w owns keys [64w, 64w + 64) and forms dV_w = P^T dO and dK_w = dS^T Q
from SMEM (transposed lhs). Predicted: the backward's bytes (q, k, v, dO, lse, delta in; dq, dk, dv out: ~118 MB at
B64 N16) at ~2.5 TB/s is ~47 us, against the Triton one-kernel backward's ~90-100 us at p = 0; 1 CTA per SM (144 KB
of SMEM) and no overlap of one CTA's loads with its compute may cost half of that gain.

Usage (GPU): PYTHONPATH=. python benchmarks/gpu_scripts/session18/mgpu_bwd_s128.py [--check-only]
"""
import functools
import math
import sys

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels import _mgpu
from pallas_kernels.attention import kernel as fk

LOG2E = math.log2(math.e)


def mgpu_backward(q, k, v, o, do, lse, interpret=False):
    """(dq, dk, dv) for q, k, v, o, do (B, S, N, H) bf16 and our forward's base-2 logsumexp lse (B, N, S)."""
    b, s, n, h = q.shape
    assert s == 128 and h == 64, (s, h)
    half = 64
    scale = h ** -0.5
    dtype = q.dtype
    delta = jnp.einsum("bsnh,bsnh->bns", o.astype(jnp.float32), do.astype(jnp.float32))
    tiling = plgpu.TilingTransform((8, 64))
    swizzle = plgpu.SwizzleTransform(128)
    tr = (tiling, swizzle)

    def body(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, dk_ref, dv_ref, scoped):
        (q_s, k_s, v_s, do_s, p_s, ds_s, out_s, lse_s, delta_s), bars, sync = scoped
        bi, ni, w = lax.axis_index("b"), lax.axis_index("n"), lax.axis_index("wg")
        rows = pl.ds(w * half, half)
        # each warpgroup loads its half (rows 64w..) of q, k, v, dO, lse, delta; both wait for every half
        for src, dst, bar in ((q_ref, q_s, bars[0]), (k_ref, k_s, bars[1]), (v_ref, v_s, bars[2]),
                              (do_ref, do_s, bars[3])):
            plgpu.copy_gmem_to_smem(src.at[bi, rows, ni], dst.at[rows], bar.at[w])
        plgpu.copy_gmem_to_smem(lse_ref.at[bi, ni, rows], lse_s.at[rows], bars[4].at[w])
        plgpu.copy_gmem_to_smem(delta_ref.at[bi, ni, rows], delta_s.at[rows], bars[5].at[w])
        for bar in bars:
            plgpu.barrier_wait(bar.at[0])
            plgpu.barrier_wait(bar.at[1])

        def rowvec(ref):  # (64,) per query row, in the layout that broadcasts along a WGMMA tile's rows
            return ref[...] if interpret else _mgpu.load(ref, layout=plgpu.Layout.WGMMA.reduce(1))

        lse = rowvec(lse_s.at[rows])
        delta = rowvec(delta_s.at[rows])
        shape = (half, half)
        lse_b = lax.broadcast_in_dim(lse, shape, [0])
        delta_b = lax.broadcast_in_dim(delta, shape, [0])

        def scores(refs):  # S_w and dP_w, each as two key halves
            s0, s1, dp0, dp1 = refs
            plgpu.wgmma(s0, q_s.at[rows], k_s.at[pl.ds(0, half)].transpose((1, 0)))
            plgpu.wgmma(s1, q_s.at[rows], k_s.at[pl.ds(half, half)].transpose((1, 0)))
            plgpu.wgmma(dp0, do_s.at[rows], v_s.at[pl.ds(0, half)].transpose((1, 0)))
            plgpu.wgmma(dp1, do_s.at[rows], v_s.at[pl.ds(half, half)].transpose((1, 0)))

        zeros = plgpu.layout_cast(jnp.zeros(shape, jnp.float32), plgpu.Layout.WGMMA)
        s0, s1, dp0, dp1 = pl.run_state(scores)(tuple(plgpu.ACC.init(zeros) for _ in range(4)))
        ds16 = []
        for kh, (sc, dp) in enumerate(((s0, dp0), (s1, dp1))):
            p = jnp.exp2(sc * (scale * LOG2E) - lse_b)
            ds = p * (dp - delta_b)
            p_s.at[kh, rows][...] = p.astype(dtype)
            d16 = ds.astype(dtype)
            ds_s.at[kh, rows][...] = d16
            ds16.append(d16)

        def dq_prod(acc):
            plgpu.wgmma(acc, ds16[0], k_s.at[pl.ds(0, half)])
            plgpu.wgmma(acc, ds16[1], k_s.at[pl.ds(half, half)])

        dq = pl.run_state(dq_prod)(plgpu.ACC.init(zeros))
        out_s.at[0, rows][...] = (dq * scale).astype(dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(out_s.at[0, rows], dq_ref.at[bi, rows, ni])
        plgpu.barrier_arrive(sync)  # P and dS of both query halves are in SMEM
        plgpu.barrier_wait(sync)

        def kv_prod(refs):  # keys 64w..: dV = P^T dO, dK = dS^T Q over all 128 queries
            dv_acc, dk_acc = refs
            plgpu.wgmma(dv_acc, p_s.at[w].transpose((1, 0)), do_s)
            plgpu.wgmma(dk_acc, ds_s.at[w].transpose((1, 0)), q_s)

        dv, dk = pl.run_state(kv_prod)((plgpu.ACC.init(zeros), plgpu.ACC.init(zeros)))
        out_s.at[1, rows][...] = (dk * scale).astype(dtype)
        out_s.at[2, rows][...] = dv.astype(dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(out_s.at[1, rows], dk_ref.at[bi, rows, ni])
        plgpu.copy_smem_to_gmem(out_s.at[2, rows], dv_ref.at[bi, rows, ni])
        plgpu.wait_smem_to_gmem(0)

    def entry(*refs):
        tile = plgpu.SMEM((s, h), dtype, transforms=tr)
        pl.run_scoped(
            lambda *scoped: body(*refs, scoped),
            (tile, tile, tile, tile,
             plgpu.SMEM((2, s, half), dtype, transforms=tr), plgpu.SMEM((2, s, half), dtype, transforms=tr),
             plgpu.SMEM((3, s, h), dtype, transforms=tr),
             plgpu.SMEM((s,), jnp.float32), plgpu.SMEM((s,), jnp.float32)),
            tuple(plgpu.Barrier(num_barriers=2) for _ in range(6)),
            plgpu.Barrier(num_arrivals=2),
            collective_axes="wg",
        )

    out = jax.ShapeDtypeStruct(q.shape, dtype)
    return plgpu.kernel(entry, out_type=(out, out, out), grid=(b, n), grid_names=("b", "n"), num_threads=2,
                        thread_name="wg", compiler_params=plgpu.CompilerParams(approx_math=True),
                        interpret=_mgpu.interpret_params(interpret))(
        q, k, v, do, lse, delta)


def main():
    from benchmarks.kernels import _grads_as_carry, copy_bandwidth, per_iteration, profile_kernels
    check_only = "--check-only" in sys.argv
    print(jax.__version__, jax.devices()[0].device_kind, flush=True)
    b, s, n, h = 64, 128, 16, 64
    keys = jax.random.split(jax.random.key(0), 4)
    q, k, v, do = (jax.random.normal(kk, (b, s, n, h), jnp.float32).astype(jnp.bfloat16) for kk in keys)
    code = jnp.ones((b, s), jnp.int32)
    blocks = fk.default_block_sizes(s, h)
    fwd = functools.partial(fk.forward, rate=0.0, blocks=blocks, interpret=False)
    o, lse = jax.jit(lambda q, k, v: fwd(q, k, v, code, None))(q, k, v)
    ref = jax.jit(lambda *a: fk.backward(*a[:3], code, None, *a[3:], rate=0.0, blocks=blocks, interpret=False))(
        q, k, v, o, lse, do)
    got = jax.jit(mgpu_backward)(q, k, v, o, do, lse)
    for name, a, r in zip(("dq", "dk", "dv"), got, ref):
        a, r = a.astype(jnp.float32), r.astype(jnp.float32)
        print(f"{name}: rel L2 vs Triton backward {float(jnp.linalg.norm(a - r) / jnp.linalg.norm(r)):.2e}",
              flush=True)
    if check_only:
        return

    def make(bwd_impl):
        @jax.custom_vjp
        def f(q, k, v):
            return fwd(q, k, v, code, None)[0]

        def f_fwd(q, k, v):
            o, lse = fwd(q, k, v, code, None)
            return o, (q, k, v, o, lse)

        def f_bwd(res, do):
            q, k, v, o, lse = res
            if bwd_impl == "triton":
                return fk.backward(q, k, v, code, None, o, lse, do, rate=0.0, blocks=blocks, interpret=False)
            return mgpu_backward(q, k, v, o, do, lse)

        f.defvjp(f_fwd, f_bwd)
        return f

    print(f"copy bandwidth {copy_bandwidth(5) / 1e9:.0f} GB/s", flush=True)
    print("| B64 N16 S128 H64 p=0, no mask | fwd+bwd us (Triton forward both) |")
    for rnd in range(2):
        for impl in ("triton", "mgpu"):
            t = per_iteration(_grads_as_carry(make(impl), 3), (q, k, v), 5)
            print(f"| backward {impl} (round {rnd}) | {t * 1e6:.1f} |", flush=True)
    for impl in ("triton", "mgpu"):
        profile_kernels(_grads_as_carry(make(impl), 3), (q, k, v), 10, 6, f"fwd+bwd, backward {impl}")


if __name__ == "__main__":
    main()
