"""Counter-based dropout: the keep mask is a pure function of (seed, element index).

The same arithmetic (uint32 multiply, xor and shifts) runs in jax.numpy and inside Pallas/Triton kernels, so a
fused kernel and its reference draw the *same* mask, and a backward pass regenerates the mask instead of storing
it. The seed is two uint32 words derived from a JAX key (the layer is folded into the key before), and the element
index is the row-major position in the logical tensor.

The hash is one MurmurHash3 32-bit finaliser over (index ^ seed0) * golden + seed1: 11 integer operations per
element, a counter-based generator in the spirit of Philox/Squares, not a cryptographic one. One round, not two:
inside the attention kernels the mask is drawn for every score three times (forward, dK/dV, dQ; twice with the
one-kernel backward), where the hash is the largest cost besides the matrix products
(benchmarks/results/kernels-h200.md); tests/test_ops.py checks the keep rate and the independence across seeds,
layers and neighbouring elements.
"""

import jax
import jax.numpy as jnp

_M1 = 0x85EBCA6B
_M2 = 0xC2B2AE35
_GOLDEN = 0x9E3779B9


def _fmix32(h):
    h = h ^ (h >> 16)
    h = h * jnp.uint32(_M1)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(_M2)
    return h ^ (h >> 16)


def hash_uint32(seed0, seed1, index):
    """uint32 hash of a uint32 `index` array under the two uint32 seed words."""
    index = index.astype(jnp.uint32)
    return _fmix32((index ^ seed0.astype(jnp.uint32)) * jnp.uint32(_GOLDEN) + seed1.astype(jnp.uint32))


def keep_threshold(rate: float) -> int:
    """An element is kept when its hash is >= this threshold, i.e. with probability 1 - rate."""
    return min(int(round(rate * 2.0**32)), 2**32 - 1)


def keep_mask(seed, index, rate: float):
    """Boolean keep mask for elements `index` (uint32 array) under `seed` (uint32[2])."""
    return hash_uint32(seed[0], seed[1], index) >= jnp.uint32(keep_threshold(rate))


def seed_from_key(key) -> jax.Array:
    """The uint32[2] seed a fused operator uses, drawn from a JAX PRNG key."""
    return jax.random.bits(key, (2,), jnp.uint32)


def dropout(x, seed, rate: float, *, index_offset=0):
    """Inverted dropout of `x` with the counter-based mask (reference implementation)."""
    if rate == 0.0:
        return x
    index = jnp.arange(x.size, dtype=jnp.uint32).reshape(x.shape) + jnp.uint32(index_offset)
    keep = keep_mask(seed, index, rate)
    return jnp.where(keep, x / (1.0 - rate), jnp.zeros_like(x)).astype(x.dtype)
