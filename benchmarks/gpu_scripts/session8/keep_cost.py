"""How much of flash attention's time with dropout is the mask hash? Times the attention operator (fwd+bwd, p=0.1,
the default block sizes) with `kernel._keep` replaced by: `murmur` (the shipped one hash per score), `paired` (one
hash per two neighbouring keys, 16 bits each: the same 10 integer operations for half the scores, plus a join),
and `free` (a near-free pattern mask, keep-rate ~7/8: the lower bound of what any hash can cost). Only `murmur`
draws the reference's mask; the others are timing probes. python keep_cost.py"""
import sys

import jax
import jax.numpy as jnp

sys.argv = [sys.argv[0]]
from benchmarks import kernels as bench  # noqa: E402
from pallas_kernels.attention import kernel  # noqa: E402
from pallas_kernels.attention import flash_attention  # noqa: E402
from pallas_kernels.dropout import hash_uint32  # noqa: E402

_murmur = kernel._keep
u32 = jnp.uint32


def _paired(drop, q_start, k_start, block_q, block_k, *, t_len, rate, key_major=False):
    if drop is None:
        return None
    seed0, seed1, head_row = drop
    rows = head_row + (q_start + jnp.arange(block_q, dtype=jnp.int32)).astype(u32)
    pairs = (k_start // 2 + jnp.arange(block_k // 2, dtype=jnp.int32)).astype(u32)
    h = hash_uint32(seed0, seed1, rows[:, None] * u32(t_len // 2) + pairs[None, :])
    bits = jnp.stack([h & u32(0xFFFF), h >> 16], axis=-1).reshape(block_q, block_k)
    keep = bits >= u32(round(rate * 65536))
    return keep.T if key_major else keep


def _free(drop, q_start, k_start, block_q, block_k, *, t_len, rate, key_major=False):
    if drop is None:
        return None
    seed0, seed1, head_row = drop
    rows = head_row + (q_start + jnp.arange(block_q, dtype=jnp.int32)).astype(u32)
    cols = (k_start + jnp.arange(block_k, dtype=jnp.int32)).astype(u32)
    index = rows[None, :] * u32(t_len) + cols[:, None] if key_major else rows[:, None] * u32(t_len) + cols[None, :]
    return ((index ^ seed0) & u32(7)) != u32(0)


def main():
    key = jax.random.split(jax.random.key(0), 4)
    seed = jnp.array([1, 2], jnp.uint32)
    for b, s in [(64, 128), (16, 512)]:
        q, k, v = (jax.random.normal(key[i], (b, s, 16, 64), jnp.bfloat16) for i in range(3))
        mask = jnp.arange(s)[None, :] < jax.random.randint(key[3], (b,), s // 2, s + 1)[:, None]
        for name, fn in [("murmur", _murmur), ("paired", _paired), ("free", _free), ("murmur", _murmur)]:
            kernel._keep = fn
            f = lambda q, k, v: flash_attention(q, k, v, mask, seed=seed, rate=0.1)  # noqa: E731
            try:
                fw = 1e6 * bench.per_iteration(lambda c, f=f: (f(*c),) + tuple(c[1:]), (q, k, v), 5)
                us = 1e6 * bench.per_iteration(bench._grads_as_carry(f, 3), (q, k, v), 5)
                print(f"| B{b} S{s} p=0.1 | {name} | fwd {fw:.1f} | fwd+bwd {us:.1f} |", flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"| B{b} S{s} | {name} | failed: {type(e).__name__}: {str(e)[:300]} |", flush=True)


if __name__ == "__main__":
    main()
