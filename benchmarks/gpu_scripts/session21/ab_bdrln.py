"""Session 21: BDRLN fwd+bwd with dropout, the shipped code (29c03cd) against this session's two changes, one process
per variant so that every kernel compiles afresh:

- `--mask element|pair`: the Mosaic GPU kernel's dropout mask per element (`keep_mask`, as shipped) or in the pair
  form (`keep_mask_lanes`, one hash per two columns, as bias+GELU's Mosaic GPU kernel since session 16);
- `--reduce three|stack|variadic`: the backward's three per-program partial sums (d_scale, d_shift, d_bias) summed
  by three XLA reductions (as shipped, and main's again since 16f22c6), by one over their stack (run 1-2's "one"),
  or by one variadic `lax.reduce` with three outputs (64040c5, reverted; runs 3-14 had it);
- `--rpp 16,64`: Triton rows per backward program (the partial sums have rows / rpp rows); default blocks if absent.

    PYTHONPATH=. python benchmarks/gpu_scripts/session21/ab_bdrln.py --mask pair --reduce variadic [--rates 0.1]
"""
import argparse
import dataclasses
import os

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.pallas import mosaic_gpu as plgpu

from benchmarks.kernels import _grads_as_carry, copy_bandwidth, per_iteration, profile_kernels
import pallas_kernels.bias_dropout_residual_layernorm as bdrln
from pallas_kernels.bias_dropout_residual_layernorm import kernel as bdrln_triton, kernel_mgpu
from pallas_kernels.dropout import keep_mask, seed_from_key

SHAPES = ((8192, 768), (8192, 1024), (16384, 768), (32768, 768), (32768, 1024))


def _keep_per_element(self, seeds, first, width, rate):
    """29c03cd's mask: keep_mask of each element's index (one hash per element unless the compiler merges pairs)."""
    r = plgpu.broadcasted_iota(jnp.uint32, self.shape, 0, layout=self.layout)
    c = plgpu.broadcasted_iota(jnp.uint32, self.shape, 1, layout=self.layout)
    return keep_mask(seeds, (r + first) * jnp.uint32(width) + c, rate)


def _bwd_summed_by(sums):
    """BDRLN's `_bwd` with its per-program partial sums summed by `sums` ([partials] -> [totals]) instead of three
    XLA sums (main's form, the `three` variant)."""
    def bwd(rate, eps, interpret, blocks, kernels, res, dy):
        _, bias, _, scale, shift, *_ = res
        dx, dres, *parts = bdrln._bwd_partials(rate, eps, interpret, blocks, kernels, res, dy)
        totals = iter(sums([p for p in parts if p is not None]))
        dscale, dshift, dbias = (None if p is None else next(totals) for p in parts)
        cast = lambda t, like: None if t is None else t.astype(like.dtype)  # noqa: E731
        return (dx, cast(dbias, bias), dres, cast(dscale, scale), cast(dshift, shift), None)
    return bwd


# The reverted forms: one sum over the partials' stack (runs 1-2's "one": one reduction, three slice copies), and one
# variadic `lax.reduce` with three outputs (64040c5, reverted in 16f22c6).
SUMS = {"stack": lambda ps: list(jnp.sum(jnp.stack(ps), axis=1)),
        "variadic": lambda ps: list(lax.reduce(tuple(ps), (jnp.float32(0),) * len(ps),
                                               lambda a, b: tuple(u + v for u, v in zip(a, b)), (0,)))}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mask", choices=("element", "pair"), required=True)
    ap.add_argument("--reduce", choices=("three", "stack", "variadic"), required=True)
    ap.add_argument("--rpp", default="", help="Triton bwd_rows_per_program values to try (comma-separated)")
    ap.add_argument("--rates", default="0.1")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--profile", type=int, default=0, metavar="CALLS",
                    help="print each kernel's device time per call (CALLS unchained calls) instead of timed chains")
    a = ap.parse_args()
    if a.profile:  # inside a CUDA-graph command buffer the profiler sees one event per graph, not per kernel
        os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_gpu_enable_command_buffer="
    if a.mask == "element":
        kernel_mgpu._Tile.keep = _keep_per_element
    if a.reduce != "three":
        bdrln._op.defvjp(bdrln._fwd, _bwd_summed_by(SUMS[a.reduce]))
    bw = copy_bandwidth(a.repeats) if not a.profile else float("nan")
    print(f"# mask={a.mask} reduce={a.reduce}; {jax.__version__} {jax.devices()[0].device_kind}; "
          f"copy {bw / 1e9:.0f} GB/s (fp32 probe)", flush=True)
    key = jax.random.split(jax.random.key(1), 8)
    seed = seed_from_key(key[7])
    for rows, d in SHAPES:
        x, res = (jax.random.normal(key[i], (rows, d), jnp.bfloat16) for i in (0, 1))
        bias, shift = (jax.random.normal(key[i], (d,)) for i in (2, 3))
        scale = 1 + 0.1 * jax.random.normal(key[4], (d,))
        for rate in (float(r) for r in a.rates.split(",")):
            nbytes = (3 + (5 if rate else 4)) * rows * d * 2
            tri = bdrln_triton.default_blocks(rows, d)
            variants = [("triton", None)] if not a.rpp else [
                (f"triton rpp={n}", dataclasses.replace(tri, bwd_rows_per_program=int(n))) for n in a.rpp.split(",")]
            for backend, blocks in variants + [("mgpu", None)]:
                fn = _grads_as_carry(lambda *args, backend=backend, rate=rate, blocks=blocks:
                                     bdrln.bias_dropout_residual_layernorm(
                                         *args, seed=seed, rate=rate, eps=1e-12, backend=backend.split()[0],
                                         blocks=blocks), 5)
                if a.profile:
                    profile_kernels(fn, (x, bias, res, scale, shift), a.profile, 8,
                                    f"{a.mask} {a.reduce} {rows}x{d} p={rate} {backend}")
                    continue
                t = per_iteration(fn, (x, bias, res, scale, shift), a.repeats)
                print(f"| {a.mask} | {a.reduce} | {rows}x{d} | {rate} | {backend} | {t * 1e6:.1f} | "
                      f"{100 * nbytes / t / bw:.0f}% |", flush=True)


if __name__ == "__main__":
    main()
