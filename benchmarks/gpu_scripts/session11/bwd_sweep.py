"""Session 11: the S=512 backward's tiles beyond the tuner's candidates (which vary the dK/dV kernel only): dQ kernel
tiles, warps and stages, and a few dK/dV launch settings; per-kernel device time of one unchained fwd+bwd call
(profiled; run with XLA's command buffers off), B16 N16 S512 H64 bf16, p=0.1.

    XLA_FLAGS=--xla_gpu_enable_command_buffer= PYTHONPATH=. python benchmarks/gpu_scripts/session11/bwd_sweep.py
"""
import dataclasses
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import kernels as kb  # noqa: E402  benchmarks/kernels.py

from pallas_kernels.attention import default_block_sizes, flash_attention  # noqa: E402


def main():
    print(f"# {jax.devices()[0].device_kind}, jax {jax.__version__}", flush=True)
    b, n, s = 16, 16, 512
    key = jax.random.split(jax.random.key(1), 4)
    q, k, v = (jax.random.normal(key[i], (b, s, n, 64), jnp.bfloat16) for i in range(3))
    lengths = jax.random.randint(key[3], (b,), s // 2, s + 1).astype(jnp.int32)
    mask = jnp.arange(s)[None, :] < lengths[:, None]
    seed = np.array([1, 2], np.uint32)
    base = default_block_sizes(s, 64)
    print(f"default: {base}", flush=True)
    variants = {"default": {}}
    for bq, bk, w, st in ((64, 64, 4, 3), (128, 32, 4, 3), (128, 32, 8, 3), (128, 64, 8, 3), (64, 32, 4, 2),
                          (64, 32, 8, 3), (32, 64, 4, 3), (64, 16, 4, 3), (64, 32, 4, 4)):
        variants[f"dq {bq}x{bk} w{w} s{st}"] = dict(block_q_dq=bq, block_k_dq=bk, num_warps_dq=w, num_stages_dq=st)
    for bq, bk, w, st in ((64, 64, 4, 2), (64, 64, 8, 3), (64, 64, 4, 4), (16, 64, 4, 3)):
        variants[f"dkdv {bq}x{bk} w{w} s{st}"] = dict(block_q_dkv=bq, block_k_dkv=bk, num_warps_bwd=w,
                                                      num_stages_bwd=st, num_warps_dq=base.num_warps_bwd,
                                                      num_stages_dq=base.num_stages_bwd)
    for name, change in variants.items():
        blocks = dataclasses.replace(base, **change)
        fn = lambda q, k, v, blocks=blocks: flash_attention(q, k, v, mask, seed=seed, rate=0.1,  # noqa: E731
                                                             block_sizes=blocks)
        try:
            kb.profile_kernels(kb._grads_as_carry(fn, 3), (q, k, v), 20, 3, name)
        except Exception as e:  # noqa: BLE001
            print(f"  {name}: failed: {type(e).__name__}: {str(e)[:300]}", flush=True)


if __name__ == "__main__":
    main()
