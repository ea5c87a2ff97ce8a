"""Plumbing shared by session 22's device-time scripts: session 21's `ab_rowwise.py` method (the profiler's kernel
time per call, each call on the next of K copies of the inputs, K x bytes >= 180 MB) with its argument conventions."""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "session21"))
from ab_rowwise import SHAPES, bdrln_inputs, cold_profile, copy_device_time, split  # noqa: E402,F401

import jax  # noqa: E402

from benchmarks.kernels import _grads_as_carry  # noqa: E402
from pallas_kernels.dropout import seed_from_key  # noqa: E402


def parse(op: str, *, shapes: str | None = None, extra=()):
    """`--calls`, `--shapes` (RxD labels, comma-separated, in that order; default all of `SHAPES[op]`, or `shapes`),
    `--rates`, and `extra` (name, default, help) string options."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--shapes", default=shapes or ",".join(f"{r}x{d}" for r, d in SHAPES[op]))
    ap.add_argument("--rates", default="0.1,0")
    for name, default, help_ in extra:
        ap.add_argument(name, default=default, help=help_)
    a = ap.parse_args()
    a.shape_list = [tuple(int(v) for v in label.split("x")) for label in a.shapes.split(",") if label]
    a.rate_list = [float(r) for r in a.rates.split(",")]
    return a


def header(what: str, calls: int, columns: list[str], gbs: float | None = None):
    """The log's first line (jax, GPU, copy probe) and the table's header."""
    probe = f"copy probe {gbs:.0f} GB/s (device time); " if gbs else ""
    print(f"# {jax.__version__} {jax.devices()[0].device_kind}; {probe}{what}, device time per call, us, {calls} "
          "calls on rotated inputs", flush=True)
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns), flush=True)


def keys():
    """The input keys and the dropout seed every script uses (session 21's)."""
    key = jax.random.split(jax.random.key(1), 8)
    return key, seed_from_key(key[7])


def fwd_bwd_time(fn, args, calls: int):
    """(total, forward kernels, backward kernels, everything else) of fn's forward + VJP, us per call."""
    return split(cold_profile(_grads_as_carry(fn, len(args)), args, calls), calls)
