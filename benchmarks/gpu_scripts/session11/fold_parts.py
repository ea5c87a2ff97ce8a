"""Session 11: where folding the Q/K/V bias into the S=512 kernels costs (session 8: forward +15, dK/dV +33, dQ +11 us
against a 31 us XLA add): per-kernel device time of flash_attention_qkv(bias=) fwd+bwd, B16 N16 S512 p=0.1, with the
bias added by XLA, folded (q and v), and folded with only q's or only v's bias (the other kernel operand patched to
None: a diagnostic, the results of those two are not the full bias). Run with XLA's command buffers off.

    XLA_FLAGS=--xla_gpu_enable_command_buffer= PYTHONPATH=. python benchmarks/gpu_scripts/session11/fold_parts.py
"""
import dataclasses
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import kernels as kb  # noqa: E402  benchmarks/kernels.py

from pallas_kernels.attention import default_block_sizes, flash_attention_qkv, kernel  # noqa: E402

_specs, _args = kernel._bias_specs, kernel._bias_args


def only(which):
    """Patch the kernels' bias operands to q's (0) or v's (2) only; None restores both."""
    def specs(bias):
        s = _specs(bias)
        return s if which is None or bias is None else [s[0] if which == 0 else None, s[1] if which == 2 else None]

    def args(bias, dtype):
        a = _args(bias, dtype)
        return a if which is None or bias is None else (a[0] if which == 0 else None, a[1] if which == 2 else None)
    kernel._bias_specs, kernel._bias_args = specs, args


def main():
    print(f"# {jax.devices()[0].device_kind}, jax {jax.__version__}", flush=True)
    b, n, s = 16, 16, 512
    key = jax.random.split(jax.random.key(1), 3)
    qkv = jax.random.normal(key[0], (b, s, 3, n, 64), jnp.bfloat16)
    bias = jax.random.normal(key[1], (3, n, 64), jnp.bfloat16)
    lengths = jax.random.randint(key[2], (b,), s // 2, s + 1).astype(jnp.int32)
    mask = jnp.arange(s)[None, :] < lengths[:, None]
    seed = np.array([1, 2], np.uint32)
    base = default_block_sizes(s, 64)
    for name, fold, which in [("bias by XLA", False, None), ("folded q+v", True, None), ("folded q only", True, 0),
                              ("folded v only", True, 2), ("no bias", False, None)]:
        only(which)
        blocks = dataclasses.replace(base, fold_bias=fold)
        fn = lambda x, bias, blocks=blocks, nb=name == "no bias": flash_attention_qkv(  # noqa: E731
            x, mask, bias=None if nb else bias, seed=seed, rate=0.1, block_sizes=blocks)
        try:
            kb.profile_kernels(kb._grads_as_carry(fn, 2), (qkv, bias), 20, 8, name)
        except Exception as e:  # noqa: BLE001
            print(f"  {name}: failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
    only(None)


if __name__ == "__main__":
    main()
