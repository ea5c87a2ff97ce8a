"""BDRLN and bias+GELU forward+backward against a copy-bandwidth floor, by device time (a GPU).

For each shape and dropout rate, the device time per call on rotated inputs of
- the operator as shipped (the registry's default choice), and its XLA reference (the speed-up's
  denominator), and
- a *floor*: two XLA elementwise kernels reading and writing as many (R, D) bf16 arrays as the operator's forward
  and backward kernels, added as uint32 words (BDRLN: x, r -> y = x + r; x, r, y -> x + y, r + y, or x + r + y
  without dropout. bias+GELU: x -> y = x + 1; x, y -> x + y; an optimisation barrier between them keeps XLA from
  fusing the two into one kernel that never writes y), with no dropout, no reductions and no parameter gradients:
  XLA's simplest kernels that move the operator's bytes in its two launches.

If the floor itself sits near 85% of the copy probe (or at under 2x XLA's fusion), a target of 85% (or 2x) asks the
kernels to move their bytes faster than XLA's plain add of the same arrays. `summarize.py` turns the log into one
row per (op, shape, rate).

    PYTHONPATH=. python benchmarks/tools/floors.py [--calls 20] [--rounds 2] [--rates 0.1]
        [--bdrln 8192x768,...] [--gelu 8192x3072,...] > floors.txt
"""
import argparse
import functools
import itertools
import os
import sys

# The profiler must see kernels, not one event per CUDA-graph command buffer: set before the backend starts.
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_gpu_enable_command_buffer="

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from benchmarks.kernels import ROTATE_BYTES, copy_bandwidth  # noqa: E402
from jaxformer.hlo_profile import profile_compiled  # noqa: E402
import pallas_kernels.bias_dropout_residual_layernorm as bdrln  # noqa: E402
import pallas_kernels.bias_gelu as bias_gelu  # noqa: E402
from pallas_kernels.dropout import seed_from_key  # noqa: E402
from pallas_kernels.timing import grads_as_carry  # noqa: E402


def kernel_times(fn, args, calls: int) -> dict:
    """{"instruction: kernel": ns summed over `calls` calls} of jit(fn)(args), each call on the next of K copies of
    `args` (K x their bytes >= 180 MB, three times an H200's L2), so no call finds its operands in L2."""
    compiled = jax.jit(fn).lower(args).compile()
    nbytes = sum(a.nbytes for a in args)
    copies = itertools.cycle([tuple(a.copy() for a in args) for _ in range(max(1, -(-ROTATE_BYTES[0] // nbytes)))])
    return profile_compiled(compiled, (next(copies),), calls, carry=lambda out, a: (next(copies),), by="both",
                            log=lambda m: None)


def bdrln_inputs(key, rows, d):
    """(x, bias, residual, scale, shift) of a (rows, d) BDRLN shard: bf16 activations, float32 parameters."""
    x, res = (jax.random.normal(key[i], (rows, d), jnp.bfloat16) for i in (0, 1))
    bias, shift = (jax.random.normal(key[i], (d,)) for i in (2, 3))
    return x, bias, res, 1 + 0.1 * jax.random.normal(key[4], (d,)), shift


def gelu_inputs(key, rows, d):
    """(x, bias) of a (rows, d) bias+GELU shard: bf16 x, float32 bias."""
    return jax.random.normal(key[0], (rows, d), jnp.bfloat16), jax.random.normal(key[2], (d,))


def words(a):
    """A bf16 (R, D) array as (R, D/2) uint32 words (a bitcast, free inside a fusion): XLA's bf16 elementwise kernels
    move bytes 16-24% below its 32-bit ones on an H200 (benchmarks/results/kernels-h200.md, Method), so the floor
    adds words, not bf16 numbers."""
    return jax.lax.bitcast_convert_type(a.reshape(a.shape[0], -1, 2), jnp.uint32)


def bdrln_floor(args, rate):
    """BDRLN's arrays in two XLA kernels: x, r -> y (the forward's); with dropout x, r, y -> (2R, D/2), the backward's
    two outputs as one array so that XLA writes them from one fusion (as two outputs it emits two kernels, each
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
    without dropout, which the step returns twice, so XLA copies it (the kernel list still shows it)."""
    return sum(v for n, v in us.items() if "MemcpyD2D" not in n)


def timed_rounds(steps: dict, args, calls: int, rounds: int):
    """Per round r: (r, {name: {kernel: us per call}} in `steps`' order). Each step is timed by device time on
    rotated inputs, the names in an order rotated by one each round."""
    names = list(steps)
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        times = {name: {n: v / calls / 1e3 for n, v in kernel_times(steps[name], args, calls).items()}
                 for name in order}
        yield r, {name: times[name] for name in names}


def kernels_cell(us: dict) -> str:
    """The kernels of one timing, longest first, for a table cell."""
    return ", ".join(f"{n[:40]} {v:.1f}" for n, v in sorted(us.items(), key=lambda kv: -kv[1]) if v >= 0.05)


def shapes(s):
    return [tuple(int(v) for v in label.split("x")) for label in s.split(",") if label]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=20, help="unchained calls per timing")
    ap.add_argument("--rounds", type=int, default=2, help="rounds, each in an order rotated by one")
    ap.add_argument("--rates", default="0.1", help="dropout rates, comma-separated")
    ap.add_argument("--bdrln", default="8192x768,8192x1024,16384x768,16384x1024,32768x1024", help="RxD shapes")
    ap.add_argument("--gelu", default="8192x3072,8192x4096,16384x4096,32768x4096", help="RxF shapes")
    return ap


def main():
    a = parser().parse_args()
    if jax.default_backend() != "gpu":  # host events and interpreted kernels: a check of the plumbing only
        print(f"floors.py: no GPU (backend {jax.default_backend()}): these times mean nothing", file=sys.stderr)
    gbs = copy_bandwidth(5) / 1e9
    print(f"# {jax.__version__} {jax.devices()[0].device_kind}; copy probe {gbs:.0f} GB/s (device time); fwd+bwd at "
          f"dropout rate p (the floor without dropout), device time per call and per kernel, us, {a.calls} calls on "
          "rotated inputs", flush=True)
    columns = ["op", "shape", "p", "impl", "round", "total", "% of copy BW", "XLA / impl", "kernels (us)"]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns), flush=True)
    key = jax.random.split(jax.random.key(1), 8)
    seed = seed_from_key(key[7])
    rates = [float(p) for p in a.rates.split(",")]
    cases = []
    for rate, (rows, d) in itertools.product(rates, shapes(a.bdrln)):
        args = bdrln_inputs(key, rows, d)
        kw = dict(seed=seed, rate=rate, eps=1e-12)
        cases.append(("bdrln", rate, rows, d, (8 if rate else 7) * rows * d * 2, args, {
            "xla": grads_as_carry(lambda *t, kw=kw: bdrln.reference.bias_dropout_residual_layernorm(*t, **kw), 5),
            "auto": grads_as_carry(lambda *t, kw=kw: bdrln.bias_dropout_residual_layernorm(*t, **kw), 5),
            "floor": functools.partial(bdrln_floor, rate=rate)}))
    for rate, (rows, d) in itertools.product(rates, shapes(a.gelu)):
        args = gelu_inputs(key, rows, d)
        cases.append(("bias_gelu", rate, rows, d, 5 * rows * d * 2, args, {
            "xla": grads_as_carry(lambda *t, rate=rate: bias_gelu.reference.bias_gelu(*t, seed=seed, rate=rate), 2),
            "auto": grads_as_carry(lambda *t, rate=rate: bias_gelu.bias_gelu(*t, seed=seed, rate=rate), 2),
            "floor": functools.partial(gelu_floor, rate=rate)}))
    for op, rate, rows, d, nbytes, args, steps in cases:
        for r, times in timed_rounds(steps, args, a.calls, a.rounds):
            xla = total_of(times["xla"])
            for name, us in times.items():
                total = total_of(us)
                print(f"| {op} | {rows}x{d} | {rate} | {name} | {r} | {total:.1f} | "
                      f"{100 * nbytes / (total * 1e-6) / (gbs * 1e9):.1f}% | {xla / total:.2f}x | {kernels_cell(us)} |",
                      flush=True)


if __name__ == "__main__":
    main()
