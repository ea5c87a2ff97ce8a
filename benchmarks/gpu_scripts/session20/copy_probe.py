"""Session 20: how fast can this GPU copy? The "% of copy bandwidth" in kernels-<gpu>.md divides by XLA's `y = x + 1`
over a 256 MB bf16 buffer (`benchmarks/kernels.copy_bandwidth`: 2.5-3.7 TB/s on the H200 across sessions), while
PyTorch's device copy was noted at 4.3 TB/s and the AdamW fusion runs at 3.9 TB/s in the step. This times several
copies of the same bytes in one process, each as `benchmarks/kernels.py` times an operator (chained, inputs rotated
over >= 180 MB, medians of 5), at the probe's size and at BDRLN 8192x768's sizes:

    PYTHONPATH=. python benchmarks/gpu_scripts/session20/copy_probe.py [--torch]

Bytes moved = read + written. Forms: XLA `x + 1` in bf16 and fp32 (the probe), Pallas/Triton `x + 1` kernels in
1-D blocks and in BDRLN's (rows, 1024)-padded tiles over a 768-wide array, and (--torch) PyTorch's `copy_` and
`x + 1` timed by CUDA events over rotated buffers.
"""
import functools
import sys

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from benchmarks.kernels import per_iteration


def triton_1d(x, block, warps):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1
    n = x.shape[0]
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(n // block,),
                          in_specs=[pl.BlockSpec((block,), lambda i: (i,))],
                          out_specs=pl.BlockSpec((block,), lambda i: (i,)),
                          compiler_params=pltriton.CompilerParams(num_warps=warps, num_stages=1))(x)


def triton_rows(x, rows_per, warps):
    """BDRLN's access: (rows_per, 1024) tiles over an (R, 768) array, the last quarter of each tile masked."""
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1
    r, d = x.shape
    wp = pl.next_power_of_2(d)
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(pl.cdiv(r, rows_per),),
                          in_specs=[pl.BlockSpec((rows_per, wp), lambda i: (i, 0))],
                          out_specs=pl.BlockSpec((rows_per, wp), lambda i: (i, 0)),
                          compiler_params=pltriton.CompilerParams(num_warps=warps, num_stages=1))(x)


def gbs(moved, t):
    return f"{moved / t / 1e9:7.0f} GB/s  ({t * 1e6:8.1f} us for {moved / 1e6:6.1f} MB)"


def main():
    print(jax.__version__, jax.devices()[0].device_kind, flush=True)
    # (label, elements of one bf16 buffer): the probe's 256 MB buffer; BDRLN 8192x768's forward (37.7 MB moved) and
    # backward (62.9 MB) as one copy each; 1 GB.
    sizes = [("probe 256 MB buffer", 128 * 2**20), ("BDRLN fwd bytes", 37748736 // 4),
             ("BDRLN bwd bytes", 62914560 // 4), ("1 GB buffer", 512 * 2**20)]
    for label, n in sizes:
        x = jnp.ones((n,), jnp.bfloat16)
        moved = 2 * x.nbytes
        print(f"\n{label}: {n} bf16 elements", flush=True)
        rows = [("XLA x+1 bf16", lambda c: (c[0] + 1,), (x,), moved),
                ("XLA x+1 fp32 (same bytes)", lambda c: (c[0] + 1,), (jnp.ones((n // 2,), jnp.float32),), moved)]
        for block, warps in ((4096, 4), (16384, 8), (65536, 16)):
            if n % block == 0:
                rows.append((f"Triton 1-D block {block} warps {warps}",
                             lambda c, b=block, w=warps: (triton_1d(c[0], b, w),), (x,), moved))
        if n % 768 == 0:
            x2 = x.reshape(-1, 768)
            for rp, warps in ((4, 4), (8, 4), (16, 8), (32, 8)):
                rows.append((f"Triton (R,768) tiles {rp}x1024 warps {warps}",
                             lambda c, r=rp, w=warps: (triton_rows(c[0], r, w),), (x2,), moved))
        for name, step, args, m in rows:
            try:
                t = per_iteration(step, args, 5)
                print(f"  {name:42s} {gbs(m, t)}", flush=True)
            except Exception as e:  # noqa: BLE001  (a form that does not lower: say so, keep going)
                print(f"  {name:42s} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
    if "--torch" in sys.argv:
        torch_copies(sizes)


def torch_copies(sizes):
    import torch
    print(f"\ntorch {torch.__version__}, CUDA events, buffers rotated over >= 180 MB, median of 5 x 50 iterations")
    for label, n in sizes:
        k = max(1, -(-180 * 2**20 // (2 * n)))
        src = [torch.ones(n, dtype=torch.bfloat16, device="cuda") for _ in range(k)]
        dst = [torch.empty_like(s) for s in src]
        for name, fn in (("torch copy_", lambda d, s: d.copy_(s)),
                         ("torch add (out=)", functools.partial(lambda d, s: torch.add(s, 1, out=d)))):
            times = []
            for _ in range(5):
                for i in range(k):
                    fn(dst[i], src[i])
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for i in range(50):
                    fn(dst[i % k], src[i % k])
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end) / 1e3 / 50)
            t = sorted(times)[2]
            print(f"  {label:22s} {name:20s} {gbs(2 * n * 2, t)}", flush=True)
        del src, dst
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
