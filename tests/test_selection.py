"""The bitmap selection (`select`) against the formulation it replaced (`select_reference`): the same indices,
counts and thresholds bit for bit on random heavy-tailed rows of awkward shapes; its radix k-th largest and bit
helpers against numpy. The GPU test compiles both on a GPU (XLA's scans, scatters and sorts differ there)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.compression.format import count_le
from jaxformer.compression.selection import _nth_bit, kth_largest_rows, select, select_reference


def _rows(rng, shape):
    """Heavy-tailed magnitudes, as gradients are, rounded to 3 significant digits so that some tie."""
    x = np.abs(rng.normal(size=shape) * np.exp(rng.normal(size=shape))) + 1e-30
    scale = 10.0 ** np.floor(np.log10(x))
    return np.asarray(np.round(x / scale, 2) * scale, np.float32)


def _case(seed):
    """Rows shorter than a bitmap word, rows not a multiple of one, an all-zero row, zeros, a row of equal values
    (its ties overflow the capacity), the balanced exchange's -1 padding."""
    rng = np.random.default_rng(seed)
    mags = [_rows(rng, s) for s in [(3, 4_133), (1, 20_000), (5, 31), (2, 1_000)]]
    mags[0][2, rng.random(4_133) < 0.3] = 0.0
    mags[2][3] = 7.0
    mags[3][0, ::3] = -1.0
    mags[3][1] = 0.0
    return mags, [41, 200, 3, 10]


@functools.cache
def _jitted(fn, ks, method):
    return jax.jit(lambda m, t, step, key: fn(m, list(ks), method, t, step=step, key=key))


def _both(mags, ks, method, thresholds, step, key):
    """(select's outputs, select_reference's), each compiled once per ks and method."""
    return tuple(_jitted(fn, tuple(ks), method)(mags, thresholds, jnp.int32(step), key)
                 for fn in (select, select_reference))


def _assert_same(got, want):
    np.testing.assert_array_equal(got[0], want[0])
    assert int(got[1]) == int(want[1])
    for a, b in zip(got[2], want[2]):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["exact", "sampled", "reused"])
def test_bitmap_selection_is_the_reference_selection(method):
    mags, ks = _case(seed=["exact", "sampled", "reused"].index(method))
    thresholds = [jnp.full(m.shape[0], -1.0) for m in mags]
    got, want = _both(mags, ks, method, thresholds, 0, jax.random.key(7))
    _assert_same(got, want)
    index, n = np.asarray(got[0]), int(got[1])
    assert np.all(np.diff(index[:n]) > 0) and np.all(index[n:] == sum(m.size for m in mags))
    flat = np.concatenate([m.reshape(-1) for m in mags])
    assert np.all(flat[index[:n]] > 0)  # zeros and padding are never sent
    tied = 3 * 4_133 + 20_000 + 3 * 31
    assert np.sum((index >= tied) & (index < tied + 31)) > 3  # the tied row takes more than its k ...
    if method == "exact":  # ... which overflows the capacity: cut at the end, by index
        assert n == sum(m.shape[0] * k for m, k in zip(mags, ks))
    if method == "reused":  # a step that does not refresh: the adapted thresholds of the first
        drifted = [m * np.float32(1.1) for m in mags]
        _assert_same(*_both(drifted, ks, method, got[2], 1, jax.random.key(7)))


def test_bitmap_selection_of_one_row_longer_than_a_count_block_at_density_0001():
    rng = np.random.default_rng(5)
    mags = [_rows(rng, (1, 70_001))]
    got, want = _both(mags, [71], "sampled", [jnp.full(1, -1.0)], 0, jax.random.key(1))
    _assert_same(got, want)
    assert int(got[1]) == 71


def test_kth_largest_rows_is_each_rows_kth_largest():
    rng = np.random.default_rng(0)
    fn = jax.jit(kth_largest_rows)
    n_rows, n = 5, 3000
    for trial in range(4):
        values = np.asarray(rng.normal(size=n) * np.exp(rng.normal(size=n)), np.float32)
        if trial % 2:
            values = np.round(values, 1)  # ties, and zeros of both signs
        rows = rng.integers(0, n_rows, size=n).astype(np.int32)
        valid = rng.random(n) < 0.8
        ks = rng.integers(1, 2 * n // n_rows, size=n_rows).astype(np.int32)  # some rows have fewer than k
        counts = np.bincount(rows[valid], minlength=n_rows).astype(np.int32)
        ks[0] = counts[0]  # a row with exactly k: its smallest
        want = [np.sort(values[valid & (rows == r)])[::-1][ks[r] - 1] if counts[r] >= ks[r] else -1.0
                for r in range(n_rows)]
        np.testing.assert_array_equal(fn(values, rows, ks, counts, valid), np.asarray(want, np.float32))


def test_bit_and_rank_searches():
    rng = np.random.default_rng(1)
    words = rng.integers(0, 2 ** 32, size=2000, dtype=np.uint64).astype(np.uint32)
    words[:3] = [1, 2 ** 31, 2 ** 32 - 1]
    bits = [np.flatnonzero([(int(w) >> b) & 1 for b in range(32)]) for w in words]
    q = np.asarray([rng.integers(0, len(b)) for b in bits], np.int32)
    want = np.asarray([b[i] for b, i in zip(bits, q)], np.int32)
    np.testing.assert_array_equal(jax.jit(_nth_bit)(words, q), want)
    ends = np.cumsum(rng.integers(0, 3, size=1001)).astype(np.int32)
    queries = np.arange(-1, ends[-1] + 2, dtype=np.int32)
    np.testing.assert_array_equal(jax.jit(count_le)(ends, queries), np.searchsorted(ends, queries, side="right"))


@pytest.mark.gpu
@pytest.mark.parametrize("density", [0.01, 0.001])
def test_bitmap_selection_on_a_gpu_is_the_reference_selection(density):
    """Rows of millions (a layer-stacked weight, an embedding, one not a multiple of 32), every method."""
    assert jax.devices()[0].platform == "gpu"
    rng = np.random.default_rng(int(1e6 * density))
    shapes = [(4, 1_048_576), (1, 3_000_017), (2, 70_000)]
    mags = [jnp.asarray(_rows(rng, s)) for s in shapes]
    ks = [int(np.ceil(density * s[1])) for s in shapes]
    for method in ("exact", "sampled", "reused"):
        thresholds = [jnp.full(m.shape[0], -1.0) for m in mags]
        got, want = _both(mags, ks, method, thresholds, 0, jax.random.key(2))
        _assert_same(got, want)
        if method == "reused":
            _assert_same(*_both([m * 1.1 for m in mags], ks, method, got[2], 1, jax.random.key(2)))
