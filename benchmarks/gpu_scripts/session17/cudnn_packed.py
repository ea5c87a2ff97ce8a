"""Session 17: attention without dropout (p = 0) as the encoder layer would run it, fwd+bwd, us: our flash kernels on
the packed (B, S, 3, N, H) projection (`flash_attention_qkv`, dQKV written packed) against cuDNN through
`jax.nn.dot_product_attention(implementation="cudnn")` on q, k, v sliced from the same packed array (XLA copies the
slices in and assembles the packed gradient), and cuDNN on separate contiguous q, k, v (the plumbing left out), with
the key mask as key lengths. Predicted (session 6's 88 us of plumbing at B64 S128; cuDNN 169 vs ours 128 us at S128,
207-241 vs 252-265 at S512 in earlier invocations): ours faster at S128 by ~40%; at S512 within 10% either way."""
import jax
import jax.numpy as jnp

from benchmarks.kernels import _grads_as_carry, copy_bandwidth, per_iteration
from pallas_kernels.attention import flash_attention_qkv

print(jax.__version__, jax.devices()[0].device_kind, f"copy bandwidth {copy_bandwidth(5) / 1e9:.0f} GB/s")
print("| shape, p=0 | ours, packed | cuDNN, sliced from packed | cuDNN, separate q/k/v | max rel diff cuDNN vs ours |")
for b, s in ((64, 128), (16, 512)):
    n, h = 16, 64
    key = jax.random.split(jax.random.key(0), 3)
    qkv = jax.random.normal(key[0], (b, s, 3, n, h), jnp.float32).astype(jnp.bfloat16)
    lengths = jax.random.randint(key[1], (b,), s // 2, s + 1)
    mask = jnp.arange(s)[None, :] < lengths[:, None]
    full = jnp.full_like(lengths, s)

    def ours(qkv):
        return flash_attention_qkv(qkv, mask)

    def cudnn_sliced(qkv):
        return jax.nn.dot_product_attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], query_seq_lengths=full,
                                            key_value_seq_lengths=lengths, implementation="cudnn")

    def cudnn_separate(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, query_seq_lengths=full, key_value_seq_lengths=lengths,
                                            implementation="cudnn")

    a, c = (jax.jit(f)(qkv).astype(jnp.float32) for f in (ours, cudnn_sliced))
    diff = float(jnp.max(jnp.abs(a - c)) / jnp.max(jnp.abs(a)))
    t_ours = per_iteration(_grads_as_carry(lambda x: ours(x), 1), (qkv,), 5)
    t_sliced = per_iteration(_grads_as_carry(lambda x: cudnn_sliced(x), 1), (qkv,), 5)
    sep = tuple(qkv[:, :, i] for i in range(3))
    t_sep = per_iteration(_grads_as_carry(cudnn_separate, 3), sep, 5)
    print(f"| B{b} N{n} S{s} H{h} | {t_ours * 1e6:.1f} | {t_sliced * 1e6:.1f} | {t_sep * 1e6:.1f} | {diff:.4f} |",
          flush=True)
