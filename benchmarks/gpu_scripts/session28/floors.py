"""Session 28: each unmet issue-4 target against a floor. For BDRLN and bias+GELU with dropout (p = 0.1), device time
on rotated inputs (session 21's method, `session22/common.py`) of

- the operator as shipped (`backend="auto"`, the default dispatch), its XLA reference (the 2x denominator), and
- an *arity floor*: a custom VJP whose forward is one XLA elementwise fusion reading and writing the same (R, D) bf16
  arrays as the operator's forward kernel, and whose backward is one XLA elementwise fusion with the backward
  kernel's arrays (BDRLN: x, r -> x + r; x, r, dy -> x + dy, r + dy. bias+GELU: x -> 2x; x, dy -> x + dy), with no
  dropout, no reductions, and the parameters' gradients as zeros (an optimisation barrier keeps XLA from fusing the
  two into one kernel that never writes the forward's output): XLA's simplest kernels that move the operator's bytes
  in its two launches.

If the floor itself sits near or below 85% of the copy probe (or at under 2x XLA's fusion), the target asks the
kernels to move their bytes faster than XLA's plain add of the same arrays.

    PYTHONPATH=. python benchmarks/gpu_scripts/session28/floors.py [--calls 20] [--rounds 2]
        [--bdrln 8192x768,...] [--gelu 8192x3072,...]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "session22"))  # its common.py
from common import bdrln_inputs, cold_profile, copy_device_time, header, keys  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from benchmarks.kernels import _grads_as_carry  # noqa: E402
import pallas_kernels.bias_dropout_residual_layernorm as bdrln  # noqa: E402
import pallas_kernels.bias_gelu as bias_gelu  # noqa: E402


@jax.custom_vjp
def bdrln_floor(x, bias, res, scale, shift):
    return x + res


def _bdrln_floor_fwd(x, bias, res, scale, shift):
    return x + res, (x, res, bias)


def _bdrln_floor_bwd(saved, dy):
    x, res, bias = saved
    x, res, dy = jax.lax.optimization_barrier((x, res, dy))  # the forward's output materialised, as the kernels'
    z = jnp.zeros_like(bias)
    return x + dy, z, res + dy, z, z


bdrln_floor.defvjp(_bdrln_floor_fwd, _bdrln_floor_bwd)


@jax.custom_vjp
def gelu_floor(x, bias):
    return x * 2


def _gelu_floor_fwd(x, bias):
    return x * 2, (x, bias)


def _gelu_floor_bwd(saved, dy):
    x, bias = saved
    x, dy = jax.lax.optimization_barrier((x, dy))
    return x + dy, jnp.zeros_like(bias)


gelu_floor.defvjp(_gelu_floor_fwd, _gelu_floor_bwd)


def shapes(s):
    return [tuple(int(v) for v in label.split("x")) for label in s.split(",") if label]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--bdrln", default="8192x768,8192x1024,16384x768,16384x1024,32768x1024")
    ap.add_argument("--gelu", default="8192x3072,8192x4096,16384x4096,32768x4096")
    a = ap.parse_args()
    _, gbs = copy_device_time()
    header("fwd+bwd with dropout 0.1 (the floor without), each kernel's device time", a.calls,
           ["op", "shape", "impl", "round", "total", "% of copy BW", "XLA / impl", "kernels (us)"], gbs)
    key, seed = keys()
    rate = 0.1
    cases = []
    for rows, d in shapes(a.bdrln):
        args = bdrln_inputs(key, rows, d)
        kw = dict(seed=seed, rate=rate, eps=1e-12)
        cases.append(("bdrln", rows, d, 8 * rows * d * 2, args, {
            "xla": lambda *t, kw=kw: bdrln.reference.bias_dropout_residual_layernorm(*t, **kw),
            "auto": lambda *t, kw=kw: bdrln.bias_dropout_residual_layernorm(*t, **kw),
            "floor": bdrln_floor}))
    for rows, d in shapes(a.gelu):
        args = (jax.random.normal(key[0], (rows, d), jnp.bfloat16), jax.random.normal(key[2], (d,)))
        cases.append(("bias_gelu", rows, d, 5 * rows * d * 2, args, {
            "xla": lambda *t: bias_gelu.reference.bias_gelu(*t, seed=seed, rate=rate),
            "auto": lambda *t: bias_gelu.bias_gelu(*t, seed=seed, rate=rate),
            "floor": gelu_floor}))
    for op, rows, d, nbytes, args, impls in cases:
        names = list(impls)
        for r in range(a.rounds):
            k = r % len(names)
            rows_out = {}
            for name in names[k:] + names[:k]:
                times = cold_profile(_grads_as_carry(impls[name], len(args)), args, a.calls)
                rows_out[name] = {n: v / a.calls / 1e3 for n, v in times.items()}
            xla = sum(rows_out["xla"].values())
            for name in names:
                us = rows_out[name]
                total = sum(us.values())
                kern = ", ".join(f"{n[:40]} {v:.1f}" for n, v in sorted(us.items(), key=lambda kv: -kv[1]) if v >= 0.05)
                print(f"| {op} | {rows}x{d} | {name} | {r} | {total:.1f} | "
                      f"{100 * nbytes / (total * 1e-6) / (gbs * 1e9):.1f}% | {xla / total:.2f}x | {kern} |", flush=True)

if __name__ == "__main__":
    main()
