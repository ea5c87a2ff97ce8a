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
largest. Everything after the thresholds works on all rows at once (running counts, one sort), so the compiled step
grows little with the number of tensors. A row that admits fewer than k entries sends fewer; the rest stays in the
residual.
"""

from __future__ import annotations

import itertools
import math
from typing import Sequence

import jax
import jax.numpy as jnp

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


def sampled_thresholds(mags, ks, key, fraction: float):
    """DGC's estimate: the threshold admitting ~1.5k entries of each row, from a random sample of it (one random
    draw for all rows)."""
    sizes = [sample_size(m.shape[1], k, fraction) for m, k in zip(mags, ks)]
    # Sampled only where it saves work and does not need every entry: else the exact threshold (at 1.5k >= a row,
    # the row's minimum: everything admitted).
    sampled = [2 * s < m.shape[1] and CANDIDATES * k < m.shape[1] for m, s, k in zip(mags, sizes, ks)]
    n = sum(m.shape[0] * s for m, s, on in zip(mags, sizes, sampled) if on)
    u = jax.random.uniform(key, (n,)) if n else None
    out, at = [], 0
    for mag, k, s, on in zip(mags, ks, sizes, sampled):
        r, m = mag.shape
        if not on:
            out.append(kth_largest(mag, min(m, math.ceil(CANDIDATES * k))))
            continue
        picks = jnp.minimum((u[at:at + r * s] * m).astype(jnp.int32), m - 1).reshape(r, s)
        at += r * s
        sample = jnp.take_along_axis(mag, picks, axis=-1)
        out.append(kth_largest(sample, min(s, max(1, round(CANDIDATES * k * s / m)))))
    return out


def _thresholds(mags, ks, method, thresholds, step, key, fraction, refresh_every):
    if method == "exact":
        return [kth_largest(mag, k) for mag, k in zip(mags, ks)]
    if method == "sampled":
        return sampled_thresholds(mags, ks, key, fraction)
    if method != "reused":
        raise ValueError(f"selection={method!r} is unknown")
    stale = jnp.any(jnp.stack([jnp.any(t <= 0) for t in thresholds]))
    return jax.lax.cond((step % refresh_every == 0) | stale,
                        lambda: [kth_largest(mag, min(mag.shape[1], math.ceil(CANDIDATES * k)))
                                 for mag, k in zip(mags, ks)],
                        lambda: list(thresholds))


def select(mags: Sequence[jax.Array], ks: Sequence[int], method: str, thresholds: Sequence[jax.Array], *,
           step, key, sample_fraction: float = 0.01, refresh_every: int = 128):
    """The chosen entries of the rows of `mags` ((R, M) arrays, k entries per row of each): (flat indices (sum R
    k,) ascending and padded with the flat size, their number, the new per-row thresholds (the state of "reused";
    the others pass theirs through))."""
    if not mags:
        return jnp.zeros(0, jnp.int32), jnp.int32(0), []
    size = sum(m.size for m in mags)
    total = sum(m.shape[0] * k for m, k in zip(mags, ks))
    t = _thresholds(mags, ks, method, thresholds, step, key, sample_fraction, refresh_every)
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
        n_rows = [m.shape[0] for m in mags]
        target = jnp.asarray([min(m.shape[1], math.ceil(CANDIDATES * k)) for m, k in zip(mags, ks)
                              for _ in range(m.shape[0])], jnp.float32)
        factor = jnp.clip((admitted.astype(jnp.float32) / target) ** ADAPT_POWER, 0.5, 2.0)
        new = [ti * f for ti, f in zip(t, jnp.split(factor, list(itertools.accumulate(n_rows))[:-1]))]
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
