"""Counter-based dropout: the keep mask is a pure function of (seed, element index).

The same arithmetic (uint32 multiply, xor and shifts) runs in jax.numpy and inside Pallas/Triton kernels, so a
fused kernel and its reference draw the *same* mask, and a backward pass regenerates the mask instead of storing
it. The seed is two uint32 words derived from a JAX key (the layer is folded into the key before), and the element
index is the row-major position in the logical tensor.

The hash is one MurmurHash3 32-bit finaliser over (pair ^ seed0) * golden + seed1 (10 integer operations), a
counter-based generator in the spirit of Philox/Squares, not a cryptographic one. One hash serves two neighbouring
elements: element i takes the low (i even) or high (i odd) 16 bits of the hash of pair i >> 1 and is kept when they
are >= round(rate * 2^16), so the kept fraction is the configured rate to within 2^-17 (0.1 -> 6554 / 65536).
Inside the attention kernels the mask is drawn for every score three times (forward, dK/dV, dQ; twice with the
one-kernel backward), where the hash is the largest cost besides the matrix products: one hash per two scores, the
halves interleaved on the tile's last axis (`keep_mask_tile`), took flash attention fwd+bwd at S = 512 from 377-387
to 348 us (benchmarks/results/kernels-h200.md, Attention). tests/ops/test_dropout.py checks the keep rate and the
independence across seeds, layers and neighbouring elements (pair mates included).
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


_BITS = 16  # hash bits per element: one 32-bit hash per pair of elements


def keep_threshold(rate: float) -> int:
    """An element is kept when its 16 hash bits are >= this threshold, i.e. with probability 1 - rate (to 2^-17)."""
    return min(int(round(rate * 2.0**_BITS)), 2**_BITS)


def _halves_keep(h, rate):
    """(low-half keep, high-half keep) of uint32 hashes `h`: the masks of a pair's even and odd element."""
    t = jnp.uint32(keep_threshold(rate))
    return (h & jnp.uint32(0xFFFF)) >= t, (h >> _BITS) >= t


def keep_mask(seed, index, rate: float):
    """Boolean keep mask for elements `index` (uint32 array) under `seed` (uint32[2]): the reference, per element."""
    index = index.astype(jnp.uint32)
    lo, hi = _halves_keep(hash_uint32(seed[0], seed[1], index >> 1), rate)
    return jnp.where((index & jnp.uint32(1)) == 1, hi, lo)


def keep_mask_lanes(seed, first, lane, rate: float):
    """`keep_mask(seed, first + lane)` for an even uint32 `first` and a uint32 array `lane`, written so that the two
    elements of a pair (lanes 2j and 2j + 1) hash the same expression, (first >> 1) + (lane >> 1): where a kernel's
    lanes sit in registers with their low bit known at compile time (Mosaic GPU's WG_STRIDED layout: each thread holds
    `vec` consecutive lanes), the compiler can draw the hash once per pair instead of once per element. The & keeps
    the uint32 wrap of `first + lane` (the reference's index)."""
    u32 = jnp.uint32
    pair = ((first.astype(u32) >> 1) + (lane.astype(u32) >> 1)) & u32(0x7FFFFFFF)
    lo, hi = _halves_keep(hash_uint32(seed[0], seed[1], pair), rate)
    return jnp.where((lane.astype(u32) & u32(1)) == 1, hi, lo)


def keep_mask_tile(seed0, seed1, row_index, first_col, n_cols: int, width: int, rate: float):
    """`keep_mask` of a (rows, n_cols) tile of a row-major tensor `width` wide, for use inside kernels.

    Element (i, j) has index row_index[i] * width + first_col + j (uint32, wrapping like the reference's arange).
    When `width` and `n_cols` are even (`first_col` must then be even: a multiple of an even block), each hash is
    drawn once for the pair (j, j + 1) and its halves are interleaved along the last axis (a stack on the last axis
    and a reshape, which the Triton lowering supports): half the hashes of the per-element form. Otherwise per
    element.
    """
    u32 = jnp.uint32
    rows = row_index.astype(u32)[:, None] * u32(width)
    if width % 2 or n_cols % 2:
        return keep_mask((seed0, seed1), rows + (first_col + jnp.arange(n_cols, dtype=jnp.int32)).astype(u32), rate)
    even = rows + (first_col + 2 * jnp.arange(n_cols // 2, dtype=jnp.int32)).astype(u32)[None, :]
    h = hash_uint32(seed0, seed1, even >> 1)
    bits = jnp.stack([h & u32(0xFFFF), h >> _BITS], axis=-1).reshape(row_index.shape[0], n_cols)  # as run on the GPU
    return bits >= u32(keep_threshold(rate))


def keep_scale(rate: float) -> float:
    """What a kernel multiplies a kept element by: 1 / (1 - rate), folded to a constant here. `x / (1 - rate)` inside
    a Mosaic GPU kernel is an IEEE division per element (PTX `div.rn.f32`, about ten instructions); the product
    differs from it by at most one float32 ulp before the cast to the output dtype. 1.0 at rate 0."""
    return 1.0 / (1.0 - rate)


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
