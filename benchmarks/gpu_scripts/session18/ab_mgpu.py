"""Session 18: the Mosaic GPU one-kernel backward (`BlockSizes.mgpu_bwd`, the new default at S = T = 128, H = 64 on
Hopper) against the Triton one-kernel backward it replaces, in one process, alternating.

    PYTHONPATH=. python benchmarks/gpu_scripts/session18/ab_mgpu.py op [TEXT]       # attention fwd+bwd, us, + XLA
    PYTHONPATH=. python benchmarks/gpu_scripts/session18/ab_mgpu.py profile [TEXT]  # device time per kernel

TEXT: only the cases whose label contains it (e.g. "p=0.1"); `op ... --once` times each implementation once.
    PYTHONPATH=. python benchmarks/gpu_scripts/session18/ab_mgpu.py triton benchmarks/train_step.py ARGS...

`triton SCRIPT ARGS` runs SCRIPT with the defaults' `mgpu_bwd` forced off (the Triton backward), for a same-code A/B
of the layer or the train step against a plain run of SCRIPT.
"""
import dataclasses
import runpy
import sys

import jax
import jax.numpy as jnp

import pallas_kernels.attention as attn
from pallas_kernels.attention import kernel as fk


def force_triton():
    orig = fk.default_block_sizes

    def triton_defaults(*a, **k):
        return dataclasses.replace(orig(*a, **k), mgpu_bwd=False)

    fk.default_block_sizes = attn.default_block_sizes = triton_defaults


def op_cases():
    """(label, fn(blocks) -> step over the inputs, inputs, xla step) for the layer's call (packed qkv with the
    bias) and the plain one (separate q, k, v), p = 0.1 and 0, B64 N16 S128 H64, random key lengths in [64, 128]."""
    from benchmarks.kernels import _grads_as_carry
    from pallas_kernels.attention.reference import attention, attention_qkv
    from pallas_kernels.dropout import seed_from_key
    b, s, n, h = 64, 128, 16, 64
    key = jax.random.split(jax.random.key(0), 6)
    qkv = jax.random.normal(key[0], (b, s, 3, n, h), jnp.float32).astype(jnp.bfloat16)
    bias = 0.1 * jax.random.normal(key[1], (3, n, h), jnp.float32)
    lengths = jax.random.randint(key[2], (b,), s // 2, s + 1)
    mask = jnp.arange(s)[None, :] < lengths[:, None]
    seed = seed_from_key(key[3])
    sep = tuple(qkv[:, :, i] for i in range(3))
    out = []
    for rate in (0.1, 0.0):
        def packed(blocks, rate=rate):
            return _grads_as_carry(lambda x, bb: attn.flash_attention_qkv(
                x, mask, bias=bb, seed=seed, rate=rate, block_sizes=blocks), 2)

        def plain(blocks, rate=rate):
            return _grads_as_carry(lambda q, k, v: attn.flash_attention(
                q, k, v, mask, seed=seed, rate=rate, block_sizes=blocks), 3)

        xla_packed = _grads_as_carry(lambda x, bb: attention_qkv(
            (x + bb.astype(x.dtype)), mask, seed=seed, rate=rate), 2)
        xla_plain = _grads_as_carry(lambda q, k, v: attention(q, k, v, mask, seed=seed, rate=rate), 3)
        out.append((f"packed+bias p={rate}", packed, (qkv, bias), xla_packed))
        out.append((f"q/k/v p={rate}", plain, sep, xla_plain))
    return out


def main():
    mode = sys.argv[1]
    if mode == "triton":
        force_triton()
        script = sys.argv[2]
        sys.argv = sys.argv[2:]
        runpy.run_path(script, run_name="__main__")
        return
    from benchmarks.kernels import copy_bandwidth, per_iteration, profile_kernels
    mg = fk.default_block_sizes(128, 64, dtype=jnp.bfloat16)
    tr = dataclasses.replace(mg, mgpu_bwd=False)
    print(jax.__version__, jax.devices()[0].device_kind, f"default mgpu_bwd={mg.mgpu_bwd}", flush=True)
    only = sys.argv[2] if len(sys.argv) > 2 and not sys.argv[2].startswith("--") else ""
    cases = [c for c in op_cases() if only in c[0]]
    if mode == "profile":
        for label, fn, args, _ in cases:
            for name, blocks in (("mgpu", mg), ("triton", tr)):
                profile_kernels(fn(blocks), args, 10, 6, f"{label} {name}")
        return
    print(f"copy bandwidth {copy_bandwidth(5) / 1e9:.0f} GB/s", flush=True)
    rounds = 1 if "--once" in sys.argv else 2
    head = "| B64 N16 S128 H64 | XLA | Triton backward | Mosaic GPU backward |"
    print(head + " Triton | Mosaic GPU |" * (rounds - 1), flush=True)
    print("|---|---|---|---|" + "---|---|" * (rounds - 1))
    for label, fn, args, xla in cases:
        t = [per_iteration(xla, args, 5)]
        for _ in range(rounds):
            t += [per_iteration(fn(tr), args, 5), per_iteration(fn(mg), args, 5)]
        print(f"| {label} | " + " | ".join(f"{x * 1e6:.1f}" for x in t) + " |", flush=True)


if __name__ == "__main__":
    main()
