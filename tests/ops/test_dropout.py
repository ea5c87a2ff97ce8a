"""The counter-based dropout the references and the kernels share: the keep rate, independence across seeds, layers
and neighbouring elements, and the tile and lane forms the kernels draw equal to the per-element mask."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import dropout as dr


def _seed(i):
    return dr.seed_from_key(jax.random.key(i))


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_keep_rate(rate):
    index = jnp.arange(1 << 20, dtype=jnp.uint32)
    keep = np.asarray(dr.keep_mask(_seed(0), index, rate))
    # 1M Bernoulli draws: the standard error of the kept fraction is below 5e-4.
    assert abs(keep.mean() - (1 - rate)) < 3e-3


def test_masks_independent_across_seeds_and_layers():
    index = jnp.arange(1 << 18, dtype=jnp.uint32)
    base = jax.random.key(3)
    masks = [np.asarray(dr.keep_mask(dr.seed_from_key(jax.random.fold_in(base, layer)), index, 0.5))
             for layer in range(4)]
    masks.append(np.asarray(dr.keep_mask(_seed(4), index, 0.5)))
    for i in range(len(masks)):
        for j in range(i + 1, len(masks)):
            corr = np.corrcoef(masks[i].astype(np.float32), masks[j].astype(np.float32))[0, 1]
            assert abs(corr) < 0.01, (i, j, corr)
    # Neighbouring elements are not correlated either.
    m = masks[0].astype(np.float32)
    assert abs(np.corrcoef(m[:-1], m[1:])[0, 1]) < 0.01


def test_pair_mates_independent():
    # One 32-bit hash serves elements 2i and 2i+1 (16 bits each): the mates must still be independent draws.
    keep = np.asarray(dr.keep_mask(_seed(5), jnp.arange(1 << 20, dtype=jnp.uint32), 0.1)).astype(np.float32)
    even, odd = keep[0::2], keep[1::2]
    assert abs(np.corrcoef(even, odd)[0, 1]) < 0.01
    # P(both dropped) = 0.01 for independent draws (2^19 pairs: standard error ~1.4e-4).
    assert abs(((1 - even) * (1 - odd)).mean() - 0.01) < 1e-3


@pytest.mark.parametrize(("width", "first_col", "n_cols", "rows"),
                         [(768, 0, 1024, (0, 1, 7, 1000)), (512, 128, 64, (3, 4)), (7, 0, 8, (0, 1, 2)),
                          (1024, 0, 1024, (4194303, 4194309, 2**31 - 1))])  # last: the uint32 index wraps
def test_tile_mask_matches_per_element_mask(width, first_col, n_cols, rows):
    # keep_mask_tile (one hash per pair, halves interleaved; per element where width is odd) is keep_mask.
    seed = _seed(6)
    rows = jnp.asarray(rows, jnp.uint32)
    cols = jnp.uint32(first_col) + jnp.arange(n_cols, dtype=jnp.uint32)
    want = dr.keep_mask(seed, rows[:, None] * jnp.uint32(width) + cols[None, :], 0.1)
    got = dr.keep_mask_tile(seed[0], seed[1], rows, first_col, n_cols, width, 0.1)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("first", [0, 2, 1000, 2**31, 2**32 - 2048, 2**32 - 2])
def test_lane_mask_matches_per_element_mask(first):
    # keep_mask_lanes (the pair-friendly form the Mosaic GPU kernels use) equals keep_mask on first + lane for an even
    # first, including where the uint32 index wraps inside the tile.
    seed = dr.seed_from_key(jax.random.key(first % 97))
    lane = jnp.arange(4096, dtype=jnp.uint32)
    want = dr.keep_mask(seed, lane + jnp.uint32(first), 0.1)
    np.testing.assert_array_equal(np.asarray(dr.keep_mask_lanes(seed, jnp.uint32(first), lane, 0.1)), np.asarray(want))


def test_scales_kept_values():
    x = jax.random.normal(jax.random.key(1), (64, 128))
    y = dr.dropout(x, _seed(1), 0.25)
    kept = np.asarray(y) != 0
    np.testing.assert_allclose(np.asarray(y)[kept], np.asarray(x)[kept] / 0.75, rtol=1e-6)
    assert 0.7 < kept.mean() < 0.8
