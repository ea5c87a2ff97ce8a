"""Session 12: the S=512 pair with dS stored by the dK/dV kernel (`BlockSizes.store_ds`) against the shipped pair
(dQ kernel recomputing scores, mask and dP). flash_attention_qkv as the layer calls it (packed qkv, the Q/K/V bias
added by XLA at S=512, its gradient from the kernels), B16 N16 S512 H64 bf16, key lengths in [S/2, S].

Part 1 (`profile`): per-kernel device time of one unchained fwd+bwd call (run with XLA's command buffers off).
Part 1b (`sweep`): the same profile for dK/dV kernel tiles and launch settings with dS stored (the default since
run 2; session 11 swept them for the recomputing pair).
Part 2 (`time`): chained fwd+bwd per call with inputs rotated over 180 MB (benchmarks/kernels.py's method), variants
alternated, so the shipped default is timed first and last.

    XLA_FLAGS=--xla_gpu_enable_command_buffer= PYTHONPATH=. python benchmarks/gpu_scripts/session12/ds_store.py profile
    PYTHONPATH=. python benchmarks/gpu_scripts/session12/ds_store.py time
"""
import dataclasses
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import kernels as kb  # noqa: E402  benchmarks/kernels.py

from pallas_kernels.attention import default_block_sizes, flash_attention_qkv  # noqa: E402

VARIANTS = {
    "default": {},
    "store_ds dq 64x32": dict(store_ds=True),
    "store_ds dq 64x64": dict(store_ds=True, block_k_dq=64),
    "store_ds dq 128x64": dict(store_ds=True, block_q_dq=128, block_k_dq=64),
    "store_ds dq 64x128": dict(store_ds=True, block_k_dq=128),
    "store_ds dq 128x64 w8": dict(store_ds=True, block_q_dq=128, block_k_dq=64, num_warps_dq=8),
    "store_ds row-major": dict(store_ds=True, key_major=False),
}
SWEEP = {"default": {}}
for _bq, _bk, _w, _st in ((32, 64, 4, 3), (64, 128, 8, 3), (128, 64, 8, 3), (32, 128, 4, 3), (64, 64, 4, 2),
                          (64, 64, 8, 3), (64, 64, 4, 4), (128, 128, 8, 3)):
    SWEEP[f"dkdv {_bq}x{_bk} w{_w} s{_st}"] = dict(block_q_dkv=_bq, block_k_dkv=_bk, num_warps_bwd=_w,
                                                   num_stages_bwd=_st, num_warps_dq=4, num_stages_dq=3)


def setup(s=512, b=16, n=16):
    key = jax.random.split(jax.random.key(1), 3)
    qkv = jax.random.normal(key[0], (b, s, 3, n, 64), jnp.bfloat16)
    bias = jax.random.normal(key[1], (3, n, 64), jnp.bfloat16)
    lengths = jax.random.randint(key[2], (b,), s // 2, s + 1).astype(jnp.int32)
    mask = jnp.arange(s)[None, :] < lengths[:, None]
    return qkv, bias, mask


def step_for(change, mask, rate, s=512):
    blocks = dataclasses.replace(default_block_sizes(s, 64), **change)
    seed = np.array([1, 2], np.uint32) if rate else None
    fn = lambda x, bias: flash_attention_qkv(x, mask, bias=bias, seed=seed, rate=rate,  # noqa: E731
                                             block_sizes=blocks)
    return kb._grads_as_carry(fn, 2)


def main(mode):
    print(f"# {jax.devices()[0].device_kind}, jax {jax.__version__}, mode {mode}", flush=True)
    qkv, bias, mask = setup()
    if mode in ("profile", "sweep"):
        for name, change in (VARIANTS if mode == "profile" else SWEEP).items():
            try:
                kb.profile_kernels(step_for(change, mask, 0.1), (qkv, bias), 20, 8, name)
            except Exception as e:  # noqa: BLE001
                print(f"  {name}: failed: {type(e).__name__}: {str(e)[:400]}", flush=True)
        return
    print(f"copy bandwidth {kb.copy_bandwidth(3) / 1e9:.0f} GB/s", flush=True)
    names = sys.argv[2].split(",") if len(sys.argv) > 2 else ["default", "store_ds dq 64x64"]
    for rate in (0.1, 0.0):
        for name in names + names[:1]:
            t = kb.per_iteration(step_for(VARIANTS[name], mask, rate), (qkv, bias), 5)
            print(f"  p={rate} {name:28s} fwd+bwd {t * 1e6:7.1f} us", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
