"""The Q/K/V bias inside flash attention (`fold_bias=True`) vs added by XLA before it (False), the attention operator
on the packed qkv with a bias, fwd+bwd, at the default blocks otherwise; then each variant's kernels profiled.
XLA_FLAGS="--xla_gpu_enable_command_buffer=" python bias_fold_ab.py (command buffers off for the profiles)"""
import dataclasses

import jax
import jax.numpy as jnp

from benchmarks import kernels as bench
from pallas_kernels.attention import default_block_sizes, flash_attention_qkv


def main():
    key = jax.random.split(jax.random.key(0), 4)
    seed = jnp.array([1, 2], jnp.uint32)
    for b, s in [(16, 512), (64, 128)]:
        qkv = jax.random.normal(key[0], (b, s, 3, 16, 64), jnp.bfloat16)
        bias = 0.1 * jax.random.normal(key[1], (3, 16, 64))
        mask = jnp.arange(s)[None, :] < jax.random.randint(key[3], (b,), s // 2, s + 1)[:, None]
        for fold in (True, False, True):
            blocks = dataclasses.replace(default_block_sizes(s, 64), fold_bias=fold)
            f = lambda x, bb, blocks=blocks: flash_attention_qkv(x, mask, bias=bb, seed=seed, rate=0.1,  # noqa: E731
                                                                 block_sizes=blocks)
            step = bench._grads_as_carry(f, 2)
            us = 1e6 * bench.per_iteration(step, (qkv, bias), 5)
            print(f"| B{b} S{s} p=0.1 | fold_bias={fold} | fwd+bwd {us:.1f} us |", flush=True)
        for fold in (True, False):
            blocks = dataclasses.replace(default_block_sizes(s, 64), fold_bias=fold)
            f = lambda x, bb, blocks=blocks: flash_attention_qkv(x, mask, bias=bb, seed=seed, rate=0.1,  # noqa: E731
                                                                 block_sizes=blocks)
            bench.profile_kernels(bench._grads_as_carry(f, 2), (qkv, bias), 5, 8, f"B{b} S{s} fold_bias={fold}")


if __name__ == "__main__":
    main()
