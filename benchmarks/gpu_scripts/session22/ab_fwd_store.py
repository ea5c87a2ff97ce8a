"""Session 22: device time of BDRLN's Mosaic GPU forward with y stored through SMEM (TMA, the pipeline's out_specs)
or straight from registers to GMEM (`Blocks.fwd_direct_store`, as the backward stores dx), on rotated inputs
(session 21's `ab_rowwise.py` method, `common.py`).

    PYTHONPATH=. python benchmarks/gpu_scripts/session22/ab_fwd_store.py [--shapes 8192x768,...] [--rates 0.1,0]
"""
import dataclasses

from common import bdrln_inputs, fwd_bwd_time, header, keys, parse

import pallas_kernels.bias_dropout_residual_layernorm as bdrln
from pallas_kernels.bias_dropout_residual_layernorm import kernel_mgpu


def main():
    a = parse("bdrln")
    header("BDRLN Mosaic GPU fwd+bwd", a.calls, ["shape", "p", "y stored", "steps in flight", "total", "fwd kernel",
                                                 "bwd kernel"])
    key, seed = keys()
    for rows, d in a.shape_list:
        args = bdrln_inputs(key, rows, d)
        for rate in a.rate_list:
            default = kernel_mgpu.default_blocks(rows, d, rate=rate)
            for direct, k in ((False, default.max_concurrent_steps), (True, default.max_concurrent_steps), (True, 4)):
                b = dataclasses.replace(default, fwd_direct_store=direct, max_concurrent_steps=k)
                total, fwd, bwd, _ = fwd_bwd_time(lambda *t, rate=rate, b=b: bdrln.bias_dropout_residual_layernorm(
                    *t, seed=seed, rate=rate, eps=1e-12, backend="mgpu", blocks=b), args, a.calls)
                print(f"| {rows}x{d} | {rate} | {'registers -> GMEM' if direct else 'SMEM -> TMA'} | {k} | "
                      f"{total:.1f} | {fwd:.1f} | {bwd:.1f} |", flush=True)


if __name__ == "__main__":
    main()
