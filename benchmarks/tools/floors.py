"""Session 28: each unmet issue-4 target against a floor. For BDRLN and bias+GELU, device time on rotated inputs
(session 21's method, `session22/common.py`) of

- the operator as shipped (`backend="auto"`, the default dispatch) at each of `--rates` (default 0.1), its XLA
  reference (the 2x denominator), and
- a *floor*: two XLA elementwise kernels reading and writing as many (R, D) bf16 arrays as the operator's forward
  and backward kernels, added as uint32 words (BDRLN: x, r -> y = x + r; x, r, y -> x + y, r + y, or x + r + y
  without dropout. bias+GELU: x -> y = x + 1; x, y -> x + y; an optimisation barrier between them keeps XLA from
  fusing the two into one kernel that never writes y), with no dropout, no reductions and no parameter gradients:
  XLA's simplest kernels that move the operator's bytes in its two launches.

If the floor itself sits near or below 85% of the copy probe (or at under 2x XLA's fusion), the target asks the
kernels to move their bytes faster than XLA's plain add of the same arrays.

    PYTHONPATH=. python benchmarks/gpu_scripts/session28/floors.py [--calls 20] [--rounds 2]
        [--bdrln 8192x768,...] [--gelu 8192x3072,...]
"""
import argparse
import functools
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "session22"))  # its common.py
from common import bdrln_inputs, cold_profile, copy_device_time, header, keys  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from benchmarks.kernels import _grads_as_carry  # noqa: E402
import pallas_kernels.bias_dropout_residual_layernorm as bdrln  # noqa: E402
import pallas_kernels.bias_gelu as bias_gelu  # noqa: E402


def words(a):
    """A bf16 (R, D) array as (R, D/2) uint32 words (a bitcast, free inside a fusion): XLA's bf16 elementwise kernels
    move bytes 16-24% below its 32-bit ones ("Session 20", 5; this script's run 3: bf16 `2x` at 76-78% of the copy
    probe), so the floor adds words, not bf16 numbers."""
    return jax.lax.bitcast_convert_type(a.reshape(a.shape[0], -1, 2), jnp.uint32)


def bdrln_floor(args, rate):
    """BDRLN's arrays in two XLA kernels: x, r -> y (the forward's); with dropout x, r, y -> (2R, D/2), the backward's
    two outputs as one array so that XLA writes them from one fusion (as two outputs it emitted two kernels, each
    re-reading dy); without, x, r, y -> x + r + y (dx = d_residual, one array)."""
    x, _, res, _, _ = args
    x, res = words(x), words(res)
    y = x + res
    x, res, y = jax.lax.optimization_barrier((x, res, y))  # the forward's output materialised, as the kernels'
    return jnp.concatenate([x + y, res + y], axis=0) if rate else x + res + y


def gelu_floor(args, rate):
    """bias+GELU's arrays in two XLA kernels: x -> y (the forward's); x, y -> dx."""
    x = words(args[0])
    y = x + 1
    x, y = jax.lax.optimization_barrier((x, y))
    return x + y


def total_of(us: dict) -> float:
    """The kernels' sum without device-to-device copies: BDRLN's gradients of x and of the residual are one array
    without dropout, which the benchmark's step returns twice, so XLA copies it (the kernels list still shows it)."""
    return sum(v for n, v in us.items() if "MemcpyD2D" not in n)


def fwd_bwd(fn, args):
    """The operator's forward and VJP as one step (`benchmarks.kernels._grads_as_carry`)."""
    return _grads_as_carry(fn, len(args))


def gelu_inputs(key, rows, d):
    """(x, bias) of a (rows, d) bias+GELU shard: bf16 x, float32 bias (session 24's `ab_gelu_z.py` inputs)."""
    return jax.random.normal(key[0], (rows, d), jnp.bfloat16), jax.random.normal(key[2], (d,))


def timed_rounds(steps: dict, args, calls: int, rounds: int):
    """Per round r: (r, the order timed, {name: {kernel: us per call}} in `steps`' order). Each step is timed by
    device time on rotated inputs (`cold_profile`), the names in an order rotated by one each round."""
    names = list(steps)
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        times = {name: {n: v / calls / 1e3 for n, v in cold_profile(steps[name], args, calls).items()}
                 for name in order}
        yield r, order, {name: times[name] for name in names}


def kernels_cell(us: dict) -> str:
    """The kernels of one timing, longest first, for a table cell."""
    return ", ".join(f"{n[:40]} {v:.1f}" for n, v in sorted(us.items(), key=lambda kv: -kv[1]) if v >= 0.05)


def parser() -> argparse.ArgumentParser:
    """The options `floors.py` and `structure.py` share: calls per timing, rounds, and the shapes of each operator."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--bdrln", default="8192x768,8192x1024,16384x768,16384x1024,32768x1024")
    ap.add_argument("--gelu", default="8192x3072,8192x4096,16384x4096,32768x4096")
    return ap


def shapes(s):
    return [tuple(int(v) for v in label.split("x")) for label in s.split(",") if label]


def main():
    ap = parser()
    ap.add_argument("--rates", default="0.1")
    a = ap.parse_args()
    _, gbs = copy_device_time()
    header("fwd+bwd at dropout rate p (the floor without dropout), each kernel's device time", a.calls,
           ["op", "shape", "p", "impl", "round", "total", "% of copy BW", "XLA / impl", "kernels (us)"], gbs)
    key, seed = keys()
    cases = []
    for rate, (rows, d) in ((float(p), s) for p in a.rates.split(",") for s in shapes(a.bdrln)):
        args = bdrln_inputs(key, rows, d)
        kw = dict(seed=seed, rate=rate, eps=1e-12)
        cases.append(("bdrln", rate, rows, d, (8 if rate else 7) * rows * d * 2, args, {
            "xla": fwd_bwd(lambda *t, kw=kw: bdrln.reference.bias_dropout_residual_layernorm(*t, **kw), args),
            "auto": fwd_bwd(lambda *t, kw=kw: bdrln.bias_dropout_residual_layernorm(*t, **kw), args),
            "floor": functools.partial(bdrln_floor, rate=rate)}))
    for rate, (rows, d) in ((float(p), s) for p in a.rates.split(",") for s in shapes(a.gelu)):
        args = gelu_inputs(key, rows, d)
        cases.append(("bias_gelu", rate, rows, d, 5 * rows * d * 2, args, {
            "xla": fwd_bwd(lambda *t, rate=rate: bias_gelu.reference.bias_gelu(*t, seed=seed, rate=rate), args),
            "auto": fwd_bwd(lambda *t, rate=rate: bias_gelu.bias_gelu(*t, seed=seed, rate=rate), args),
            "floor": functools.partial(gelu_floor, rate=rate)}))
    for op, rate, rows, d, nbytes, args, steps in cases:
        for r, _, times in timed_rounds(steps, args, a.calls, a.rounds):
            xla = total_of(times["xla"])
            for name, us in times.items():
                total = total_of(us)
                print(f"| {op} | {rows}x{d} | {rate} | {name} | {r} | {total:.1f} | "
                      f"{100 * nbytes / (total * 1e-6) / (gbs * 1e9):.1f}% | {xla / total:.2f}x | {kernels_cell(us)} |",
                      flush=True)

if __name__ == "__main__":
    main()
