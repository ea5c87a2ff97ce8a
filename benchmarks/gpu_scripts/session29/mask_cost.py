"""Session 29: what a cheaper dropout mask would buy the two operators still short of issue 4's 85% target. The
shipped operators (`backend="auto"`) with dropout 0.1, device time on rotated inputs (session 21's method, as
session 28's `floors.py`), with the mask's hash replaced *in this process* (`--hash`):

- `fmix32`: the shipped MurmurHash3 finaliser (two multiplies, three xor-shifts per pair of elements);
- `one-round`: h ^= h >> 16; h *= M1; h ^= h >> 16 (one multiply, two xor-shifts: 4 integer ops fewer per pair);
- `none`: no finaliser at all, the pre-mix (i ^ seed0) * golden + seed1 alone: not a usable mask (its bits follow
  the index), an upper bound on what any cheaper mask could gain.

The kernels trace the hash from `pallas_kernels.dropout` when they are compiled, so each variant runs in its own
process (the Mosaic GPU kernels sit behind module-level jits that would keep the first variant's trace). The mask
changes the values, not the bytes: each operator's bytes and the 85% time are as in `floors.py`.

    PYTHONPATH=. python benchmarks/gpu_scripts/session29/mask_cost.py --hash one-round [--calls 20]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "session22"))  # its common.py
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "session28"))  # floors.py
from common import bdrln_inputs, cold_profile, copy_device_time, keys  # noqa: E402
from floors import fwd_bwd, gelu_inputs, kernels_cell, shapes, total_of  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import pallas_kernels.bias_dropout_residual_layernorm as bdrln  # noqa: E402
import pallas_kernels.bias_gelu as bias_gelu  # noqa: E402
from pallas_kernels import dropout  # noqa: E402


def one_round(h):
    h = h ^ (h >> 16)
    h = h * jnp.uint32(dropout._M1)
    return h ^ (h >> 16)


HASHES = {"fmix32": dropout._fmix32, "one-round": one_round, "none": lambda h: h}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hash", choices=tuple(HASHES), required=True)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--bdrln", default="8192x768,8192x1024,16384x768,16384x1024")
    ap.add_argument("--gelu", default="8192x3072,8192x4096,16384x4096")
    a = ap.parse_args()
    dropout._fmix32 = HASHES[a.hash]
    _, gbs = copy_device_time()
    print(f"# {jax.__version__} {jax.devices()[0].device_kind}; copy probe {gbs:.0f} GB/s (device time); hash "
          f"{a.hash}; fwd+bwd at p = 0.1, device time per call, us, {a.calls} calls on rotated inputs", flush=True)
    print("| op | shape | hash | total | % of copy BW | 85% time | kernels (us) |")
    print("|---|---|---|---|---|---|---|", flush=True)
    key, seed = keys()
    kw = dict(seed=seed, rate=0.1)
    cases = [("bdrln", s, 8, bdrln_inputs(key, *s),
              lambda *t: bdrln.bias_dropout_residual_layernorm(*t, **kw, eps=1e-12)) for s in shapes(a.bdrln)]
    cases += [("bias_gelu", s, 5, gelu_inputs(key, *s), lambda *t: bias_gelu.bias_gelu(*t, **kw))
              for s in shapes(a.gelu)]
    for op, (rows, d), arrays, args, fn in cases:
        nbytes = arrays * rows * d * 2
        us = {n: v / a.calls / 1e3 for n, v in cold_profile(fwd_bwd(fn, args), args, a.calls).items()}
        total, target = total_of(us), nbytes / (0.85 * gbs * 1e9) * 1e6
        print(f"| {op} | {rows}x{d} | {a.hash} | {total:.1f} | {100 * nbytes / (total * 1e-6) / (gbs * 1e9):.1f}% | "
              f"{target:.1f} | {kernels_cell(us)} |", flush=True)


if __name__ == "__main__":
    main()
