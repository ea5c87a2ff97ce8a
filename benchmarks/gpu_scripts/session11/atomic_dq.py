"""Session 11: the dK/dV kernel adding dQ atomically into an fp32 buffer (`BlockSizes.atomic_dq`, no dQ kernel)
against the shipped dK/dV + dQ pair, fwd+bwd with benchmarks/kernels.py's clock, beside XLA's reference, at BERT-large
attention shapes (B16 N16 S512, B64 N16 S128), p=0.1 and p=0, separate q/k/v and the packed qkv the layer uses.
PROFILE=1 adds the per-kernel device time of one unchained fwd+bwd call of the shipped and the atomic form.
ONLY=a|b: only the rows whose name contains a or b; SHAPE=512 or 128: one shape; SEM=relaxed: Pallas's Triton atomic
lowering patched to relaxed memory ordering (it emits acquire-release; an experiment, not shipped); REPEAT=n: every
row n times, interleaved (run 2).

    patch -p1 < benchmarks/gpu_scripts/session11/atomic_dq.patch   # the atomic form (measured slower, reverted)
    PYTHONPATH=. python benchmarks/gpu_scripts/session11/atomic_dq.py
"""
import dataclasses
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import kernels as kb  # noqa: E402  benchmarks/kernels.py

from pallas_kernels.attention import attention, default_block_sizes, flash_attention, flash_attention_qkv  # noqa: E402


def main():
    if os.environ.get("SEM") == "relaxed":
        import functools
        from jax._src.lib.triton import dialect as tt_dialect
        from jax._src.pallas.triton import lowering
        lowering._atomic_rmw = functools.partial(lowering._atomic_rmw, semantic=tt_dialect.MemSemantic.RELAXED)
        print("atomics: relaxed (patched)", flush=True)
    print(f"# {jax.devices()[0].device_kind}, jax {jax.__version__}", flush=True)
    bw = kb.copy_bandwidth(5)
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s", flush=True)
    key = jax.random.split(jax.random.key(1), 5)
    seed = np.array([1, 2], np.uint32)
    for b, n, s in [(16, 16, 512), (64, 16, 128)]:
        if os.environ.get("SHAPE", str(s)) != str(s):
            continue
        q, k, v = (jax.random.normal(key[i], (b, s, n, 64), jnp.bfloat16) for i in range(3))
        qkv = jnp.stack([q, k, v], axis=2)
        lengths = jax.random.randint(key[3], (b,), s // 2, s + 1).astype(jnp.int32)
        mask = jnp.arange(s)[None, :] < lengths[:, None]
        base = default_block_sizes(s, 64)
        pair = dataclasses.replace(base, fused_bwd=False, key_major=True, fold_bias=False,
                                   block_q_dkv=64, block_k_dkv=64)
        forms = {"shipped": base}
        atomic = any(f.name == "atomic_dq" for f in dataclasses.fields(base))  # only with atomic_dq.patch applied
        for km in (True, False) if atomic else ():
            for bq, bk, w in ((64, 64, 4), (32, 64, 4), (64, 128, 8), (128, 64, 8), (32, 128, 4)):
                forms[f"atomic km={int(km)} {bq}x{bk} w{w}"] = dataclasses.replace(
                    pair, atomic_dq=True, key_major=km, block_q_dkv=bq, block_k_dkv=bk, num_warps_bwd=w)
        if s == 128:
            forms["pair km=1 32x64 w4"] = dataclasses.replace(pair, block_q_dkv=32)
            forms["pair km=1 64x64 w4"] = pair
            forms["pair km=1 32x64 w4 fold"] = dataclasses.replace(pair, block_q_dkv=32, fold_bias=True)
        only = [o for o in os.environ.get("ONLY", "").split("|") if o] or [""]
        for rate in (0.1, 0.0):
            impls = {f"xla reference p={rate}": (lambda q, k, v, rate=rate: attention(q, k, v, mask, seed=seed,
                                                                                       rate=rate), (q, k, v))}
            for name, blocks in forms.items():
                if rate == 0.0 and name not in ("shipped", "atomic km=1 64x64 w4"):
                    continue  # p=0: the shipped form and the atomic default candidate only
                impls[f"ours {name} p={rate}"] = (lambda q, k, v, blocks=blocks, rate=rate: flash_attention(
                    q, k, v, mask, seed=seed, rate=rate, block_sizes=blocks), (q, k, v))
            bias = jax.random.normal(key[4], (3, n, 64), jnp.bfloat16)
            for name in forms:
                impls[f"packed {name} p={rate}"] = (lambda x, blocks=forms[name], rate=rate: flash_attention_qkv(
                    x, mask, seed=seed, rate=rate, block_sizes=blocks), (qkv,))
                impls[f"packed+bias {name} p={rate}"] = (lambda x, bias, blocks=forms[name], rate=rate:
                                                         flash_attention_qkv(x, mask, bias=bias, seed=seed, rate=rate,
                                                                             block_sizes=blocks), (qkv, bias))
            rows = [name for name in impls if any(o in name for o in only)]
            for name in rows * int(os.environ.get("REPEAT", "1")):
                fn, args = impls[name]
                try:
                    if os.environ.get("PROFILE") and rate and ("shipped" in name or "64x64 w4" in name):
                        kb.profile_kernels(kb._grads_as_carry(fn, len(args)), args, 20, 8, f"B{b} S{s} {name}")
                    t = kb.per_iteration(kb._grads_as_carry(fn, len(args)), args, 5)
                    print(f"| B{b} N{n} S{s} H64 | fwd+bwd | {name} | {t * 1e6:.1f} us |", flush=True)
                except Exception as e:  # noqa: BLE001
                    print(f"| B{b} N{n} S{s} H64 | fwd+bwd | {name} | failed: {type(e).__name__}: {str(e)[:300]} |",
                          flush=True)


if __name__ == "__main__":
    main()
