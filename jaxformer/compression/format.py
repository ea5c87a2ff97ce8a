"""The compact sparse format: values in the wire dtype, 16-bit offsets inside 65536-entry blocks, per-block counts.

A sparse vector over an index space of `space` entries is a fixed number `K` of slots whose first `n` hold entries
in ascending index order (the rest are padding). It travels as three arrays:

* `values`: K values in the wire dtype (bfloat16: 2 bytes, float32: 4), padding 0;
* `offsets`: K uint16, each index modulo 65536;
* `counts`: int32 per block of 65536 indices, how many entries fall in it (`ceil(space / 65536)` of them).

Index i of slot j is `block(j) * 65536 + offsets[j]`, where block(j) is the block whose running count first
exceeds j. That is 2 bytes of index per entry plus 4 bytes per 65536 indices of the space: at density d (entries
per index) the index costs 2 + 4 / (65536 d) bytes, 2.06 at d = 0.001, against 4 for an int32 index. With bfloat16
values an entry costs about 4.06 bytes instead of (int32, float32)'s 8.

Everything here is fixed-shape, so it runs inside a jit; `to_words` / `from_words` view any array as uint16 words,
so one buffer (and one collective) carries values, offsets, counts and any dense tail together.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

BLOCK_BITS = 16
BLOCK = 1 << BLOCK_BITS


def n_blocks(space: int) -> int:
    """The number of count blocks of an index space of `space` entries."""
    return max(1, -(-space // BLOCK))


class Packed(NamedTuple):
    values: jax.Array  # (..., K) wire dtype
    offsets: jax.Array  # (..., K) uint16
    counts: jax.Array  # (..., n_blocks) int32


def encode(index, value, n, space: int, dtype) -> Packed:
    """Pack the first `n` slots of `index` (int32, ascending, in [0, space)) and `value` along the last axis;
    slots from `n` on are padding. Leading axes are independent vectors (n has their shape)."""
    k = index.shape[-1]
    valid = jnp.arange(k) < jnp.asarray(n)[..., None]
    block = jnp.where(valid, index >> BLOCK_BITS, n_blocks(space))  # padding counts in no block
    counts = jax.vmap(lambda b: jnp.zeros(n_blocks(space), jnp.int32).at[b].add(1, mode="drop"))(
        block.reshape(-1, k)).reshape(*index.shape[:-1], n_blocks(space))
    offsets = jnp.where(valid, index & (BLOCK - 1), 0).astype(jnp.uint16)
    return Packed(jnp.where(valid, value, 0).astype(dtype), offsets, counts)


def decode(packed: Packed, space: int):
    """(index int32, value float32) of every slot; padding slots get index `space` (outside the space) and 0."""
    k = packed.offsets.shape[-1]
    ends = jnp.cumsum(packed.counts, axis=-1)
    slots = jnp.arange(k, dtype=ends.dtype)
    block = jax.vmap(lambda e: jnp.searchsorted(e, slots, side="right"))(ends.reshape(-1, ends.shape[-1]))
    block = block.reshape(*packed.offsets.shape[:-1], k).astype(jnp.int32)
    valid = slots < ends[..., -1:]
    index = jnp.where(valid, block * BLOCK + packed.offsets.astype(jnp.int32), space)
    return index, jnp.where(valid, packed.values.astype(jnp.float32), 0.0)


def nbytes(k: int, space: int, dtype) -> int:
    """Bytes of a packed vector of `k` slots over `space` indices."""
    return k * (jnp.dtype(dtype).itemsize + 2) + 4 * n_blocks(space)


# ----------------------------------------------------------------------------------------------- uint16 words
def to_words(x) -> jax.Array:
    """`x` (..., n) of any 2- or 4-byte dtype as uint16 words (..., n * itemsize / 2)."""
    if x.dtype.itemsize == 2:
        return jax.lax.bitcast_convert_type(x, jnp.uint16)
    words = jax.lax.bitcast_convert_type(x, jnp.uint16)  # (..., n, itemsize / 2)
    return words.reshape(*x.shape[:-1], -1)


def from_words(words, dtype, n: int) -> jax.Array:
    """The inverse of `to_words` for `n` elements of `dtype` along the last axis."""
    dtype = jnp.dtype(dtype)
    if dtype.itemsize == 2:
        return jax.lax.bitcast_convert_type(words, dtype)
    return jax.lax.bitcast_convert_type(words.reshape(*words.shape[:-1], n, dtype.itemsize // 2), dtype)


def pack_words(packed: Packed) -> jax.Array:
    """One uint16 buffer of `packed` (values, offsets, counts)."""
    return jnp.concatenate([to_words(packed.values), packed.offsets, to_words(packed.counts)], axis=-1)


def unpack_words(words, k: int, space: int, dtype) -> tuple[Packed, jax.Array]:
    """`Packed` of `k` slots from the front of `words`, and the words after it."""
    dtype = jnp.dtype(dtype)
    nv, nb = k * dtype.itemsize // 2, n_blocks(space)
    values = from_words(words[..., :nv], dtype, k)
    offsets = words[..., nv:nv + k]
    counts = from_words(words[..., nv + k:nv + k + 2 * nb], jnp.int32, nb)
    return Packed(values, offsets, counts), words[..., nv + k + 2 * nb:]
