"""Session 11: per-kernel device time of flash_attention_qkv(bias=) fwd+bwd with its default blocks (B16 N16 S512: the
bias added by XLA; B64 N16 S128: folded, one-kernel backward), p=0.1, profiled (command buffers off): where the bias
gradient's reduction over dQKV went (bias_grad_sums.patch; run it on the tree and on the tree with the patch reversed).

    XLA_FLAGS=--xla_gpu_enable_command_buffer= PYTHONPATH=. python benchmarks/gpu_scripts/session11/bias_grad.py
"""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import kernels as kb  # noqa: E402  benchmarks/kernels.py

from pallas_kernels.attention import flash_attention_qkv  # noqa: E402


def main():
    print(f"# {jax.devices()[0].device_kind}, jax {jax.__version__}", flush=True)
    seed = np.array([1, 2], np.uint32)
    for b, n, s in [(16, 16, 512), (64, 16, 128)]:
        key = jax.random.split(jax.random.key(1), 3)
        qkv = jax.random.normal(key[0], (b, s, 3, n, 64), jnp.bfloat16)
        bias = jax.random.normal(key[1], (3, n, 64), jnp.float32)
        lengths = jax.random.randint(key[2], (b,), s // 2, s + 1).astype(jnp.int32)
        mask = jnp.arange(s)[None, :] < lengths[:, None]
        fn = lambda x, bias, mask=mask: flash_attention_qkv(x, mask, bias=bias, seed=seed, rate=0.1)  # noqa: E731
        kb.profile_kernels(kb._grads_as_carry(fn, 2), (qkv, bias), 20, 10, f"B{b} N{n} S{s} packed+bias p=0.1")


if __name__ == "__main__":
    main()
