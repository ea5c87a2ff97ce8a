"""Session 18: does each call site of the Mosaic GPU attention backward compile its kernel again? The BERT-large
train step compiled in 126.7 / 121.6 s with it against 55.5 / 54.7 s with the Triton backward (run 8). Compile time
of the gradient of L chained `flash_attention_qkv` calls (B8 N16 S128 H64, bias, dropout 0.1), L = 1 and 4, with
the default (Mosaic GPU backward on Hopper) and the Triton backward; the kernel's module and hash are identical at
every call site (checked on the CPU by lowering for CUDA).

    PYTHONPATH=. python benchmarks/gpu_scripts/session18/compile_probe.py
"""
import dataclasses
import time

import jax
import jax.numpy as jnp

from pallas_kernels.attention import default_block_sizes, flash_attention_qkv
from pallas_kernels.dropout import seed_from_key


def main():
    b, s, n, h = 8, 128, 16, 64
    key = jax.random.split(jax.random.key(0), 3)
    qkv = jax.random.normal(key[0], (b, s, 3, n, h), jnp.float32).astype(jnp.bfloat16)
    bias = jnp.zeros((3, n, h), jnp.float32)
    mask = jnp.ones((b, s), bool)
    seed = seed_from_key(key[1])
    mg = default_block_sizes(s, h, dtype=jnp.bfloat16)
    print(jax.devices()[0].device_kind, f"default mgpu_bwd={mg.mgpu_bwd}", flush=True)
    for name, blocks in (("mgpu", mg), ("triton", dataclasses.replace(mg, mgpu_bwd=False))):
        for layers in (1, 4):
            def loss(x, bb, blocks=blocks, layers=layers):
                total = 0.0
                for i in range(layers):
                    out = flash_attention_qkv(x, mask, bias=bb, seed=seed, rate=0.1, block_sizes=blocks)
                    total = total + out.astype(jnp.float32).sum()
                    x = x * (1 + i / 8)
                return total

            t = time.perf_counter()
            jax.jit(jax.grad(loss, argnums=(0, 1))).lower(qkv, bias).compile()
            print(f"| {name} | {layers} call sites | compile {time.perf_counter() - t:.1f} s |", flush=True)


if __name__ == "__main__":
    main()
