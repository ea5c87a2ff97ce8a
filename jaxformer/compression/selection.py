"""Top-k selection per row with fixed capacity: which entries of each row a rank sends this step.

The rows of several (R, M) magnitude arrays are laid end to end in one flat index space (array by array, row by
row). `select` returns the flat indices of at most k entries per row, ascending, in a fixed (sum of R k,) array
padded with the space's size, so what follows never changes shape. Entries of magnitude 0 (and padding, marked
below 0) are never chosen. The methods differ in the per-row threshold they start from:

* "exact": the k-th largest magnitude of the row (`lax.top_k`): the reference, slow on a GPU for rows of millions.
* "sampled" (Lin et al. 2018, DGC, section 3.1): a threshold admitting about 1.5k entries, estimated from a random
  sample of the row.
* "reused" (Li & Hoefler 2022, Ok-Topk, section 4.1): last step's threshold, multiplied by
  (admitted / 1.5k)^(1/4) (clipped to [1/2, 2]) after each step, recomputed exactly every `refresh_every` steps.

A row admits the entries at or above its threshold. "exact" sends them (k, or more on ties: cut by index). The
estimated thresholds are refined: a row's first 2k admitted entries are its candidates, of which it keeps the k
largest. A row that admits fewer than k entries sends fewer; the rest stays in the residual.

How `select` finds them in about one pass over the entries (the rows of all arrays at once, so the compiled step
grows little with the number of tensors):

1. Admission bitmap: one uint32 word per 32 entries of a row (a fused 32-wide reduction; 1/32 of the entries'
   bytes), its popcounts and their running count over all words (the only scan, over 1/32 as many elements).
2. Compaction: the admitted entry of rank g is found in its word by a binary search of the running count, then in
   the word by its set bit of rank g - (admitted before the word). Each candidate (of a row's fixed segment of 2k
   slots) or, for "exact", each of the `sum R k` output slots asks for one rank: work per chosen entry, none per
   entry of the space.
3. Refine: each row's k-th largest candidate by radix selection (`kth_largest_rows`: three histogram passes over
   the candidates, no sort), and the kept candidates scattered to their ranks among the kept (one short cumulative
   count). The sample thresholds of "sampled" use the same radix selection over all sampled rows at once.

`select_reference` is the formulation this replaced (running counts over every entry, a sort of the candidates)
and gives the same outputs bit for bit; tests and benchmarks/grad_compression.py compare the two.
"""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from .format import count_le, get_in_bounds as _get

CANDIDATES = 1.5  # sampled/reused aim their threshold at this many times k candidates ...
CANDIDATE_CAP = 2.0  # ... and keep at most this many times k of them
SAMPLED_CANDIDATES = 64  # enough sampled candidates for a ~1/8 relative error of the estimate
ADAPT_POWER = 0.25  # reused: threshold *= (admitted / target) ** ADAPT_POWER


def compact(mask, cap: int):
    """Positions (cap,) of the first `cap` True entries of the 1-D `mask`, ascending, padded with its length; and
    the number of True entries (which may exceed `cap`)."""
    csum = jnp.cumsum(mask.astype(jnp.int32))
    pos = jnp.searchsorted(csum, jnp.arange(1, cap + 1, dtype=jnp.int32), side="left").astype(jnp.int32)
    return pos, csum[-1] if mask.shape[0] else jnp.int32(0)


def kth_largest(mag, k: int):
    return jax.lax.top_k(mag, k)[0][:, -1]


def sample_size(m: int, k: int, fraction: float) -> int:
    return min(m, max(math.ceil(fraction * m), math.ceil(SAMPLED_CANDIDATES * m / (CANDIDATES * k))))


def _samples(mags, ks, key, fraction: float):
    """DGC's sample of each row (one random draw for all rows): per tensor, (its (R, s) sample, the rank in it of
    the threshold admitting ~1.5k entries of a row), or (None, the rank in the whole row) where sampling would not
    save work or needs every entry (at 1.5k >= a row: the row's minimum, everything admitted)."""
    sizes = [sample_size(m.shape[1], k, fraction) for m, k in zip(mags, ks)]
    sampled = [2 * s < m.shape[1] and CANDIDATES * k < m.shape[1] for m, s, k in zip(mags, sizes, ks)]
    n = sum(m.shape[0] * s for m, s, on in zip(mags, sizes, sampled) if on)
    u = jax.random.uniform(key, (n,)) if n else None
    out, at = [], 0
    for mag, k, s, on in zip(mags, ks, sizes, sampled):
        r, m = mag.shape
        if not on:
            out.append((None, min(m, math.ceil(CANDIDATES * k))))
            continue
        picks = jnp.minimum((u[at:at + r * s] * m).astype(jnp.int32), m - 1).reshape(r, s)
        at += r * s
        out.append((jnp.take_along_axis(mag, picks, axis=-1), min(s, max(1, round(CANDIDATES * k * s / m)))))
    return out


def _kth_of_samples_top_k(mags, samples):
    """Each row's threshold from `_samples`: the k-th largest of its sample (or of the row), by `lax.top_k`."""
    return [kth_largest(mag if sample is None else sample, kk) for mag, (sample, kk) in zip(mags, samples)]


def _kth_of_samples_radix(mags, samples):
    """The same thresholds as `_kth_of_samples_top_k`, with every sampled row's k-th largest found by one radix
    selection over all samples at once (`kth_largest_rows`) instead of a `lax.top_k` (a sort on a GPU) per tensor."""
    out = [kth_largest(mag, kk) if sample is None else None for mag, (sample, kk) in zip(mags, samples)]
    on = [(i, sample, kk) for i, (sample, kk) in enumerate(samples) if sample is not None]
    if not on:
        return out
    values = jnp.concatenate([sample.reshape(-1) for _, sample, _ in on])
    rows, ks, first = [], [], 0
    for _, sample, kk in on:
        r, s = sample.shape
        rows.append(first + jnp.arange(r * s, dtype=jnp.int32) // s)
        ks += [kk] * r
        first += r
    counts = jnp.asarray([sample.shape[1] for _, sample, _ in on for _ in range(sample.shape[0])], jnp.int32)
    kth = kth_largest_rows(values, jnp.concatenate(rows), jnp.asarray(ks, jnp.int32), counts)
    first = 0
    for i, sample, _ in on:
        out[i] = kth[first:first + sample.shape[0]].astype(mags[i].dtype)
        first += sample.shape[0]
    return out


def sampled_thresholds(mags, ks, key, fraction: float):
    """DGC's estimate: the threshold admitting ~1.5k entries of each row, from a random sample of it."""
    return _kth_of_samples_radix(mags, _samples(mags, ks, key, fraction))


def _thresholds(mags, ks, method, thresholds, step, key, fraction, refresh_every, kth_of_samples):
    if method == "exact":
        return [kth_largest(mag, k) for mag, k in zip(mags, ks)]
    if method == "sampled":
        return kth_of_samples(mags, _samples(mags, ks, key, fraction))
    if method != "reused":
        raise ValueError(f"selection={method!r} is unknown")
    stale = jnp.any(jnp.stack([jnp.any(t <= 0) for t in thresholds]))
    return jax.lax.cond((step % refresh_every == 0) | stale,
                        lambda: [kth_largest(mag, min(mag.shape[1], math.ceil(CANDIDATES * k)))
                                 for mag, k in zip(mags, ks)],
                        lambda: list(thresholds))


# ----------------------------------------------------------------------------------------------- bitmap selection
WORD = 32  # entries per word of the admission bitmap
RADIX_DIGITS = (11, 11, 10)  # kth_largest_rows: bits of the 32-bit sort key per pass, most significant first


class _Rows(NamedTuple):
    """Static per-row tables (numpy) of the rows of `mags` laid end to end: each row's first flat index, first
    bitmap word and number of words."""
    flat: np.ndarray
    word: np.ndarray
    words: np.ndarray

    @classmethod
    def of(cls, mags) -> "_Rows":
        cols = np.asarray([m.shape[1] for m in mags for _ in range(m.shape[0])], np.int64)
        words = -(-cols // WORD)
        start = lambda x: np.concatenate([[0], np.cumsum(x)[:-1]]).astype(np.int64)  # noqa: E731
        return cls(start(cols), start(words), words)


def _bitmap(mag, t):
    """(R, ceil(M / 32)) uint32 of one (R, M) array: bit b of word w of row r says whether entry 32 w + b of the row
    is admitted (at or above t[r], and not 0). One pass over the entries: a 32-wide reduction XLA fuses with the
    comparison, whose output is 1/32 of the entries' bytes."""
    r, m = mag.shape
    full = m - m % WORD

    def pack(x, lanes):
        admit = (x >= t[:, None, None]) & (x > 0)
        return jnp.sum(admit.astype(jnp.uint32) << jnp.arange(lanes, dtype=jnp.uint32), axis=-1, dtype=jnp.uint32)

    parts = []
    if full:
        parts.append(pack(mag[:, :full].reshape(r, full // WORD, WORD), WORD))
    if m % WORD:  # a row's last, partial word
        parts.append(pack(mag[:, full:].reshape(r, 1, m % WORD), m % WORD))
    return parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=1)


def _nth_bit(word, q):
    """The position in each uint32 `word` of its set bit of rank q (0-based, q < popcount(word)): halve the window
    five times, stepping up past the lower half's set bits where q lies above them."""
    pos = jnp.zeros(q.shape, jnp.int32)
    for width in (16, 8, 4, 2, 1):
        low = jax.lax.population_count(word & jnp.uint32((1 << width) - 1)).astype(jnp.int32)
        up = q >= low
        q = jnp.where(up, q - low, q)
        word = jnp.where(up, word >> jnp.uint32(width), word)
        pos = pos + jnp.where(up, width, 0)
    return pos


def _sort_key(x):
    """float32 -> uint32 with the same order (negatives below positives, -1 padding below every magnitude)."""
    bits = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
    return jnp.where(bits >> 31 == 1, ~bits, bits | jnp.uint32(1 << 31))


def _from_sort_key(key):
    bits = jnp.where(key >> 31 == 1, key & jnp.uint32((1 << 31) - 1), ~key)
    return jax.lax.bitcast_convert_type(bits, jnp.float32)


def kth_largest_rows(values, rows, ks, counts, valid=None):
    """Each row's k-th largest value, -1 where it has fewer than k: `values` (n,) belong to rows `rows` (n,) (in
    any order), `ks` and `counts` (R,) are each row's k and number of (valid) values; entries where `valid` is
    False take no part. The value `lax.top_k(row, k)[0][-1]` gives, by radix selection on the bits of the values:
    three passes over them, each a histogram per row of the next 11 bits among the values that match the digits
    found so far (one scatter-add for all rows), then a cumulative count that picks the digit holding the k-th.
    Exact, with no sort of the values (three scatter-adds and scans over R x 2048 counts)."""
    n_rows = ks.shape[0]
    key = _sort_key(values)
    valid = jnp.ones(values.shape, bool) if valid is None else valid
    need = ks.astype(jnp.int32)  # the rank still sought among the values that match `prefix`
    prefix = jnp.zeros(n_rows, jnp.uint32)
    shift = 32
    for width in RADIX_DIGITS:
        shift -= width
        bins = 1 << width
        active = valid if shift + width == 32 else valid & ((key >> (shift + width)) == _get(prefix, rows))
        digit = ((key >> shift) & jnp.uint32(bins - 1)).astype(jnp.int32)
        slot = jnp.where(active, rows * bins + digit, n_rows * bins)  # inactive: out of range, dropped
        hist = jnp.zeros(n_rows * bins, jnp.int32).at[slot].add(1, mode="drop").reshape(n_rows, bins)
        at_or_above = jnp.cumsum(hist[:, ::-1], axis=1)[:, ::-1]
        d = jnp.maximum(jnp.sum(at_or_above >= need[:, None], axis=1) - 1, 0)  # the digit holding rank `need`
        need = need - jnp.take_along_axis(at_or_above - hist, d[:, None], axis=1)[:, 0]
        prefix = (prefix << width) | d.astype(jnp.uint32)
    return jnp.where((counts >= ks) & (ks > 0), _from_sort_key(prefix), -1.0)


def _locate(bits, ends, g, table: _Rows, row=None):
    """The flat index of the admitted entry of global rank g (0-based, below the number admitted): its word (a
    binary search of the words' running counts `ends`), its bit (`_nth_bit`), its row's place (`table`; `row`: the
    rows, where the caller knows them)."""
    w = count_le(ends, g)
    w_in = jnp.minimum(w, ends.shape[0] - 1)
    word = _get(bits, w_in)
    before = _get(ends, w_in) - jax.lax.population_count(word).astype(jnp.int32)
    bit = _nth_bit(word, g - before)
    if row is None:
        row = count_le(jnp.asarray(table.word[1:], jnp.int32), w)
    first_word = _get(jnp.asarray(table.word, jnp.int32), row)
    return _get(jnp.asarray(table.flat, jnp.int32), row) + WORD * (w - first_word) + bit


def admission(mags, t):
    """The admission bitmap of all rows of `mags` at per-row thresholds `t` (one (R,) array per tensor), words laid
    end to end (uint32 (W,)), and the running count of admitted entries up to each word, inclusive (int32 (W,))."""
    bits = jnp.concatenate([_bitmap(mag, ti).reshape(-1) for mag, ti in zip(mags, t)])
    return bits, jnp.cumsum(jax.lax.population_count(bits).astype(jnp.int32))


def _adapted(t, admitted, mags, ks):
    """"reused"'s next thresholds: each row's, times (admitted / 1.5k)^(1/4) clipped to [1/2, 2]."""
    n_rows = [m.shape[0] for m in mags]
    target = jnp.asarray([min(m.shape[1], math.ceil(CANDIDATES * k)) for m, k in zip(mags, ks)
                          for _ in range(m.shape[0])], jnp.float32)
    factor = jnp.clip((admitted.astype(jnp.float32) / target) ** ADAPT_POWER, 0.5, 2.0)
    return [ti * f for ti, f in zip(t, jnp.split(factor, list(itertools.accumulate(n_rows))[:-1]))]


def select(mags: Sequence[jax.Array], ks: Sequence[int], method: str, thresholds: Sequence[jax.Array], *,
           step, key, sample_fraction: float = 0.01, refresh_every: int = 128):
    """The chosen entries of the rows of `mags` ((R, M) arrays, k entries per row of each): (flat indices (sum R
    k,) ascending and padded with the flat size, their number, the new per-row thresholds (the state of "reused";
    the others pass theirs through)). The same outputs as `select_reference`, with no pass over the entries but
    the admission bitmap's (module docstring)."""
    if not mags:
        return jnp.zeros(0, jnp.int32), jnp.int32(0), []
    size = sum(m.size for m in mags)
    total = sum(m.shape[0] * k for m, k in zip(mags, ks))
    t = _thresholds(mags, ks, method, thresholds, step, key, sample_fraction, refresh_every, _kth_of_samples_radix)
    table = _Rows.of(mags)
    bits, ends = admission(mags, t)
    at = lambda words: jnp.where(words > 0, _get(ends, jnp.asarray(np.maximum(words - 1, 0), jnp.int32)), 0)  # noqa
    before = at(table.word)  # admitted before each row
    admitted = at(table.word + table.words) - before
    if method == "exact":  # k per row, or more on exact ties (cut at the end, by index)
        g = jnp.arange(total, dtype=jnp.int32)
        n = ends[-1]
        return jnp.where(g < n, _locate(bits, ends, g, table), size), jnp.minimum(n, total), list(thresholds)
    # A row's candidates: its first `cap` admitted entries, in a segment of `cap` slots of its own.
    caps = np.asarray([min(m.shape[1], math.ceil(CANDIDATE_CAP * k)) for m, k in zip(mags, ks)
                       for _ in range(m.shape[0])], np.int64)
    seg = np.concatenate([[0], np.cumsum(caps)])
    n_cand = int(seg[-1])
    # Behind a barrier: every slot's row and rank follow from static tables, and XLA would otherwise fold the
    # searches over millions of slots into constants at compile time (seconds, and the tables in the program).
    slot = jax.lax.optimization_barrier(jnp.arange(n_cand, dtype=jnp.int32))
    row = count_le(jnp.asarray(seg[1:-1], jnp.int32), slot)
    rank = slot - _get(jnp.asarray(seg[:-1], jnp.int32), row)
    valid = rank < _get(admitted, row)
    cand = jnp.where(valid, _locate(bits, ends, _get(before, row) + rank, table, row), size)
    new = list(thresholds)
    if method == "reused":
        new = _adapted(t, admitted, mags, ks)
    # The candidates' magnitudes, gathered from each tensor (its rows' segments are consecutive).
    cmag, r0 = [], 0
    for start, mag in zip(_starts(mags), mags):
        lo, hi = int(seg[r0]), int(seg[r0 + mag.shape[0]])
        r0 += mag.shape[0]
        if hi > lo:
            local = jnp.clip(cand[lo:hi] - start, 0, mag.size - 1)
            cmag.append(jnp.where(valid[lo:hi], _get(mag.reshape(-1), local), -1.0))
    cmag = jnp.concatenate(cmag) if cmag else jnp.zeros(0, jnp.float32)
    # Refine: each row keeps its k largest candidates (all that tie with the k-th).
    k_row = jnp.asarray([k for m, k in zip(mags, ks) for _ in range(m.shape[0])], jnp.int32)
    kth = kth_largest_rows(cmag, row, k_row, jnp.minimum(admitted, jnp.asarray(caps, jnp.int32)), valid)
    thr = jnp.maximum(jnp.concatenate(t), kth)
    keep = valid & (cmag >= _get(thr, row)) & (cmag > 0)
    # The kept candidates, ascending (segments in row order, each ascending), into the first `total` slots.
    place = jnp.cumsum(keep.astype(jnp.int32))
    n = place[-1] if n_cand else jnp.int32(0)
    dest = jnp.where(keep, place - 1, total + slot)  # not kept, or past `total`: dropped
    chosen = jnp.full(total, size, jnp.int32).at[dest].set(cand, mode="drop", unique_indices=True)
    return chosen, jnp.minimum(n, total), new


def select_reference(mags: Sequence[jax.Array], ks: Sequence[int], method: str, thresholds: Sequence[jax.Array], *,
                     step, key, sample_fraction: float = 0.01, refresh_every: int = 128):
    """`select` as first built, kept as the reference its tests and benchmarks/grad_compression.py compare with:
    running counts over the whole flat space (two cumulative sums of every entry, a binary search of each candidate
    into them) and one sort of the candidates by (row, -magnitude). The same outputs, bit for bit."""
    if not mags:
        return jnp.zeros(0, jnp.int32), jnp.int32(0), []
    size = sum(m.size for m in mags)
    total = sum(m.shape[0] * k for m, k in zip(mags, ks))
    t = _thresholds(mags, ks, method, thresholds, step, key, sample_fraction, refresh_every, _kth_of_samples_top_k)
    # Zero entries are never sent (they change nothing), so a row of zeros admits nothing at threshold 0.
    admits = [((mag >= ti[:, None]) & (mag > 0)) for mag, ti in zip(mags, t)]
    if method == "exact":  # k per row, or more on exact ties (cut at the end, by index)
        chosen, n = compact(jnp.concatenate([a.reshape(-1) for a in admits]), total)
        return chosen, jnp.minimum(n, total), list(thresholds)
    # A row's candidates: its first `cap` admitted entries, ranked by one running count over all rows.
    caps = [min(m.shape[1], math.ceil(CANDIDATE_CAP * k)) for m, k in zip(mags, ks)]
    rows = [(s + r * m.shape[1], m.shape[1]) for s, m in zip(_starts(mags), mags) for r in range(m.shape[0])]
    row_starts = jnp.asarray([start for start, _ in rows], jnp.int32)
    csum = jnp.cumsum(jnp.concatenate([a.reshape(-1) for a in admits]).astype(jnp.int32))
    before = jnp.where(row_starts > 0, csum[jnp.maximum(row_starts - 1, 0)], 0)  # admitted before each row
    admitted = csum[row_starts + jnp.asarray([m for _, m in rows], jnp.int32) - 1] - before
    cands, r0 = [], 0
    for s, mag, a, cap in zip(_starts(mags), mags, admits, caps):
        rank = csum[s:s + mag.size].reshape(mag.shape) - before[r0:r0 + mag.shape[0], None]
        cands.append((a & (rank <= cap)).reshape(-1))
        r0 += mag.shape[0]
    new = list(thresholds)
    if method == "reused":
        new = _adapted(t, admitted, mags, ks)
    n_cand = sum(m.shape[0] * c for m, c in zip(mags, caps))
    cand, _ = compact(jnp.concatenate(cands), n_cand)
    # Refine: each row keeps its k largest candidates. Sorting the candidates by (row, -magnitude) puts row r's
    # k-th largest at its first candidate's position + k - 1.
    flat = jnp.concatenate([m.reshape(-1) for m in mags])
    valid = cand < size
    cmag = jnp.where(valid, flat[jnp.minimum(cand, size - 1)], -1.0)
    k_row = jnp.asarray([k for m, k in zip(mags, ks) for _ in range(m.shape[0])], jnp.int32)
    n_row = row_starts.shape[0]
    row = jnp.where(valid, jnp.searchsorted(row_starts, cand, side="right") - 1, n_row)
    srow, sneg = jax.lax.sort((row, -cmag), num_keys=2)
    first = jnp.searchsorted(srow, jnp.arange(n_row), side="left")
    count = jnp.searchsorted(srow, jnp.arange(n_row), side="right") - first
    kth = jnp.where(count >= k_row, -sneg[jnp.minimum(first + k_row - 1, n_cand - 1)], -1.0)
    thr = jnp.maximum(jnp.concatenate(t), kth)
    keep = valid & (cmag >= thr[jnp.minimum(row, n_row - 1)]) & (cmag > 0)
    chosen, n = compact(keep, total)
    return jnp.where(chosen < n_cand, cand[jnp.minimum(chosen, n_cand - 1)], size), jnp.minimum(n, total), new


def _starts(mags):
    return [0] + list(itertools.accumulate(m.size for m in mags))[:-1]
