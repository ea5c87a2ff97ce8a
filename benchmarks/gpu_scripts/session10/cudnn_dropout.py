"""Session 10: cuDNN's fused attention *with its own dropout* (Philox, through JAX's private
`jax._src.cudnn.fused_attention_stablehlo.dot_product_attention(dropout_rate=)`) as a speed anchor for the 2x target
of attention with dropout: the vendor's kernel at the same rate and padding mask. Not a usable path here (its seed is
a static Python int, so every step would draw the same mask, and its mask cannot match our hash reference) and not
checked against a reference (a different mask): only timed, fwd+bwd with benchmarks/kernels.py's clock, beside the
XLA reference and our flash attention at p=0.1 and cuDNN at p=0.

    PYTHONPATH=. python benchmarks/gpu_scripts/session10/cudnn_dropout.py
"""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import kernels as kb  # noqa: E402  benchmarks/kernels.py

from pallas_kernels.attention import attention, flash_attention  # noqa: E402


def main():
    from jax._src.cudnn.fused_attention_stablehlo import MaskType, dot_product_attention as cudnn_dpa
    print(f"# {jax.devices()[0].device_kind}, jax {jax.__version__}", flush=True)
    bw = kb.copy_bandwidth(5)
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s", flush=True)
    key = jax.random.split(jax.random.key(1), 5)
    seed = np.array([1, 2], np.uint32)
    for b, n, s in [(16, 16, 512), (64, 16, 128)]:
        q, k, v = (jax.random.normal(key[i], (b, s, n, 64), jnp.bfloat16) for i in range(3))
        lengths = jax.random.randint(key[3], (b,), s // 2, s + 1).astype(jnp.int32)
        mask = jnp.arange(s)[None, :] < lengths[:, None]
        full = jnp.full_like(lengths, s)

        def cudnn(rate):
            return lambda q, k, v: cudnn_dpa(q, k, v, None, None, full, lengths, scale=64 ** -0.5,
                                             mask_type=MaskType.PADDING, dropout_rate=rate, qkv_layout="BTNH")
        impls = {"xla reference p=0.1": lambda q, k, v: attention(q, k, v, mask, seed=seed, rate=0.1),
                 "ours (flash) p=0.1": lambda q, k, v: flash_attention(q, k, v, mask, seed=seed, rate=0.1),
                 "cuDNN p=0.1 (its own dropout)": cudnn(0.1),
                 "cuDNN p=0": cudnn(0.0),
                 "ours (flash) p=0": lambda q, k, v: flash_attention(q, k, v, mask, seed=seed, rate=0.0)}
        if os.environ.get("ONLY"):  # a substring of the implementations' names to time (run 11: cuDNN's backward
            impls = {k_: f for k_, f in impls.items() if os.environ["ONLY"] in k_}  # with dropout aborted XLA)
        try:  # cuDNN's dropout applied at all? (its output must differ from its p=0 output)
            a, c = jax.jit(cudnn(0.1))(q, k, v), jax.jit(cudnn(0.0))(q, k, v)
            print(f"B{b} S{s}: cuDNN p=0.1 vs p=0 output rel diff "
                  f"{float(jnp.linalg.norm((a - c).astype(jnp.float32)) / jnp.linalg.norm(c.astype(jnp.float32))):.3f}",
                  flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"B{b} S{s}: cuDNN with dropout failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
            impls = {k_: f for k_, f in impls.items() if "cuDNN p=0.1" not in k_}
        for name, fn in impls.items():
            try:
                if os.environ.get("PROFILE"):  # device time per kernel of one unchained fwd+bwd call (run 14)
                    kb.profile_kernels(kb._grads_as_carry(fn, 3), (q, k, v), 20, 6, f"B{b} S{s} {name}")
                    continue
                if os.environ.get("ONLY"):  # one plain (unchained) fwd+bwd first
                    jax.block_until_ready(jax.jit(lambda a, fn=fn: jax.vjp(fn, *a)[1](fn(*a)))((q, k, v)))
                    print(f"B{b} S{s} {name}: one fwd+bwd ran", flush=True)
                t = kb.per_iteration(kb._grads_as_carry(fn, 3), (q, k, v), 5)
                print(f"| B{b} N{n} S{s} H64 | fwd+bwd | {name} | {t * 1e6:.1f} us |", flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"| B{b} N{n} S{s} H64 | fwd+bwd | {name} | failed: {type(e).__name__}: {str(e)[:200]} |",
                      flush=True)


if __name__ == "__main__":
    main()
