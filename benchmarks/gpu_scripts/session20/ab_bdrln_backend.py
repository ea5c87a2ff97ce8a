"""Session 20: BDRLN's Triton kernels against its Mosaic GPU ones across row counts, alternating, fwd+bwd (run 5 had
Mosaic GPU ahead at 32768x1024 and behind at 8192 rows; earlier sessions had it behind everywhere). For a per-shape
`auto` backend decision; changes nothing.

    PYTHONPATH=. python benchmarks/gpu_scripts/session20/ab_bdrln_backend.py [--rounds N]
"""
import sys

import jax
import jax.numpy as jnp

from benchmarks.kernels import _grads_as_carry, copy_bandwidth, per_iteration
import pallas_kernels.bias_dropout_residual_layernorm as bdrln
from pallas_kernels.dropout import seed_from_key


def main():
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 2
    bw = copy_bandwidth(5)
    print(jax.__version__, jax.devices()[0].device_kind, f"copy bandwidth {bw / 1e9:.0f} GB/s (fp32 probe)", flush=True)
    print("| rows x D | p | " + " Triton | Mosaic GPU |" * rounds + " Mosaic / Triton (medians) |")
    print("|---|---|" + "---|---|" * rounds + "---|", flush=True)
    key = jax.random.split(jax.random.key(1), 8)
    seed = seed_from_key(key[7])
    for d in (768, 1024):
        for rows in (8192, 16384, 32768):
            x, res = (jax.random.normal(key[i], (rows, d), jnp.bfloat16) for i in (0, 1))
            bias, shift = (jax.random.normal(key[i], (d,)) for i in (2, 3))
            scale = 1 + 0.1 * jax.random.normal(key[4], (d,))
            args = (x, bias, res, scale, shift)
            for rate in (0.0, 0.1):
                nbytes = (3 + (5 if rate else 4)) * rows * d * 2
                t = {"triton": [], "mgpu": []}
                for _ in range(rounds):
                    for backend in ("triton", "mgpu"):
                        op = bdrln.bias_dropout_residual_layernorm
                        fn = _grads_as_carry(lambda *a, backend=backend, rate=rate, op=op: op(
                            *a, seed=seed, rate=rate, eps=1e-12, backend=backend), 5)
                        t[backend].append(per_iteration(fn, args, 5))
                cells = " | ".join(f"{t['triton'][i] * 1e6:.1f} ({100 * nbytes / t['triton'][i] / bw:.0f}%) | "
                                   f"{t['mgpu'][i] * 1e6:.1f} ({100 * nbytes / t['mgpu'][i] / bw:.0f}%)"
                                   for i in range(rounds))
                ratio = sorted(t["mgpu"])[rounds // 2] / sorted(t["triton"])[rounds // 2]
                print(f"| {rows}x{d} | {rate} | {cells} | {ratio:.2f} |", flush=True)


if __name__ == "__main__":
    main()
