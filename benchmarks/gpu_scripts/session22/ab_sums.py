"""Session 22: device time of BDRLN's Mosaic GPU backward with 0-3 of its column sums (d_scale, d_shift, d_bias) as
register loop carries and the others in SMEM tiles (`kernel_mgpu.Blocks.bwd_register_sums`), against Triton's
kernels, on rotated inputs (session 21's `ab_rowwise.py` method, `common.py`).

    PYTHONPATH=. python benchmarks/gpu_scripts/session22/ab_sums.py [--shapes 8192x1024,...] [--counts 0,1,2,3]
"""
import dataclasses

from common import bdrln_inputs, copy_device_time, fwd_bwd_time, header, keys, parse

import pallas_kernels.bias_dropout_residual_layernorm as bdrln
from pallas_kernels.bias_dropout_residual_layernorm import kernel_mgpu


def main():
    a = parse("bdrln", shapes="8192x1024,16384x1024,32768x1024",
              extra=[("--counts", "0,1,2,3", "numbers of sums in registers to time")])
    _, gbs = copy_device_time()
    header("BDRLN fwd+bwd", a.calls, ["shape", "p", "impl", "total", "fwd kernel", "bwd kernel", "other (sums)",
                                      "% of copy BW"], gbs)
    key, seed = keys()
    for rows, d in a.shape_list:
        args = bdrln_inputs(key, rows, d)
        for rate in a.rate_list:
            nbytes = (3 + (5 if rate else 4)) * rows * d * 2
            default = kernel_mgpu.default_blocks(rows, d, rate=rate)
            impls = [("triton", dict(backend="triton"))]
            for n in (int(c) for c in a.counts.split(",")):
                mark = " (default)" if n == default.bwd_register_sums else ""
                impls.append((f"mgpu sums in registers={n}{mark}",
                              dict(backend="mgpu", blocks=dataclasses.replace(default, bwd_register_sums=n))))
            for name, kw in impls:
                fn = lambda *t, rate=rate, kw=kw: bdrln.bias_dropout_residual_layernorm(  # noqa: E731
                    *t, seed=seed, rate=rate, eps=1e-12, **kw)
                total, fwd, bwd, other = fwd_bwd_time(fn, args, a.calls)
                print(f"| {rows}x{d} | {rate} | {name} | {total:.1f} | {fwd:.1f} | {bwd:.1f} | {other:.1f} | "
                      f"{100 * nbytes / (total * 1e-6) / (gbs * 1e9):.0f}% |", flush=True)


if __name__ == "__main__":
    main()
