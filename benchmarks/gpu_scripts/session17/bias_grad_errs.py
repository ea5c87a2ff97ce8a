"""Session 17: the packed GPU test's relative errors (context, dQKV, q's and v's bias gradient) against the fp32
reference with the biased input rounded in qkv's dtype (XLA's add, the unfolded path), with only q's sum rounded (the
folding kernels' form), and against the reference before session 17 (the rounded bias added in fp32, no sum rounded).
tests/test_attention_kernel.py now uses the form of the path: fold_bias (S = 128 here) q's, else all rounded."""
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, "tests")
from test_attention_kernel import _GPU_CASES, _gpu_blocks, _mask, _packed_bias, _packed_value_and_vjp, _rel_err  # noqa: E402

from pallas_kernels.attention import flash_attention_qkv  # noqa: E402
from pallas_kernels.attention.reference import attention_qkv  # noqa: E402
from pallas_kernels.dropout import seed_from_key  # noqa: E402

print(jax.__version__, jax.devices()[0].device_kind)
print("| S | variant | p | reference | out | dQ | dK | dV | dbias q | dbias v |")
for s, variant in _GPU_CASES:
    for rate in (0.0, 0.1):
        qkv = jax.random.normal(jax.random.key(10), (4, s, 3, 16, 64), jnp.float32).astype(jnp.bfloat16)
        g = jax.random.normal(jax.random.key(11), (4, s, 16, 64), jnp.float32).astype(jnp.bfloat16)
        mask, seed, bias = _mask([s, s - 17, s // 2, 5], s), seed_from_key(jax.random.key(1)), _packed_bias(qkv)
        blocks = _gpu_blocks(s, variant)
        got = _packed_value_and_vjp(lambda *a, **k: flash_attention_qkv(*a, **k, interpret=False, block_sizes=blocks),
                                    qkv, mask, g, seed, rate, bias)
        g32 = g.astype(jnp.float32)
        out, dqkv = _packed_value_and_vjp(attention_qkv, (qkv + bias.astype(qkv.dtype)).astype(jnp.float32), mask,
                                          g32, seed, rate)
        exact = qkv.astype(jnp.float32) + bias.astype(qkv.dtype).astype(jnp.float32)
        q_only = exact.at[:, :, 0].set((qkv + bias.astype(qkv.dtype)).astype(jnp.float32)[:, :, 0])
        out_q, dqkv_q = _packed_value_and_vjp(attention_qkv, q_only, mask, g32, seed, rate)
        refs = {"rounded sum": (out, dqkv, dqkv.sum(axis=(0, 1))),
                "q's sum rounded": (out_q, dqkv_q, dqkv_q.sum(axis=(0, 1))),
                "sum in fp32 (before)": _packed_value_and_vjp(attention_qkv, qkv.astype(jnp.float32), mask, g32, seed,
                                                              rate, bias.astype(qkv.dtype).astype(jnp.float32))}
        for name, ref in refs.items():
            errs = [_rel_err(got[0], ref[0])] + [_rel_err(got[1][:, :, c], ref[1][:, :, c]) for c in range(3)]
            errs += [_rel_err(got[2][c], ref[2][c]) for c in (0, 2)]
            cells = " | ".join(f"{e:.4f}" for e in errs)
            print(f"| {s} | {variant} fold_bias={blocks.fold_bias} | {rate} | {name} | {cells} |", flush=True)
