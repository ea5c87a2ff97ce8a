"""Sequence packing: several ``[CLS] A [SEP] B [SEP]`` samples one after the other in a row (as NVIDIA's MLPerf BERT).

Real text leaves much of a row as padding (the built-in corpus fills 41% of 128-token rows one sample a row); a packed
row holds up to K samples, each attending only to itself (the model's segment mask), with positions restarting at
each [CLS] and one NSP prediction per sample. Three pieces, used like examples.py's:

* ``pack``: which NSP pairs share a row, when data is prepared. Best-fit decreasing over windows of ``window`` pairs
  in a seeded random order: the longest sample of the window goes first, each into the open row it leaves least free
  space in (a row takes at most K samples), a new row when none has room. A sample is never split; the result is a
  pure function of the lengths, K, the window and the seed.
* ``assemble_packed_rows``: the stored rows (``examples.row_dtype`` with K segments: per segment A's and B's lengths
  and the NSP label; unused segments have la = lb = 0).
* ``masked_packed_batch``: the dynamic masking at batch time, per sample at BERT's rate (each sample's n = rint(15%
  of its A/B tokens), at least 1, lowest hash scores first, as ``examples.masked_batch``), within the row's
  ``max_predictions``, and the batch keys of a packed row.
"""
from __future__ import annotations

import math

import numpy as np

from .corpus import SpecialIds
from .examples import Pairs, hash64, uniform

PACK_WINDOW = 8192  # pairs packed together: the fill is within 0.1 point of packing a whole split at once
MIN_SAMPLE = 5  # [CLS] a [SEP] b [SEP]: the shortest sample (A and B hold at least one token each)


def default_samples_per_row(seq_len: int) -> int:
    """K when it is not given: one sample per 16 tokens of the row (8 at 128, 32 at 512), where the fill of the
    built-in corpus, whose documents are short, reaches 99% (docs/training.md, Packing). A slot costs little: a
    pooled [CLS] and a quarter of a masked position per row."""
    return max(1, seq_len // 16)


def max_predictions(seq_len: int, mask_prob: float, samples_per_row: int) -> int:
    """The default masked positions of a row: enough for every sample's own count, so none is ever cut. A sample of
    r A/B tokens asks for max(1, rint(p r)) <= p r + e, e = max(1 - 2p, 1/2) (r >= 2), and takes r + 3 of the row's
    S tokens: the samples of a row ask for at most p S + K (e - 3p), 20.2 at p = 0.15, S = 128, K = 4."""
    excess = max(0.0, max(1 - 2 * mask_prob, 0.5) - 3 * mask_prob)
    return min(seq_len - 3, math.ceil(mask_prob * seq_len + samples_per_row * excess - 1e-9))


def pack(lengths: np.ndarray, seq_len: int, samples_per_row: int, seed: int, window: int = PACK_WINDOW) -> np.ndarray:
    """Rows of sample indices (n_rows, samples_per_row) int64, -1 in unused slots, packing samples of ``lengths``
    (each at most ``seq_len``) best-fit decreasing (see the module's docstring). Each row's samples are in the order
    they were placed (longest first), the rows of a window in a seeded random order; every sample appears exactly
    once."""
    lengths = np.asarray(lengths, np.int64)
    if lengths.size and (lengths.min() < 1 or lengths.max() > seq_len):
        raise ValueError(f"sample lengths must be in [1, seq_len={seq_len}]")
    order = np.argsort(uniform(0x9ACC, seed, np.arange(len(lengths))), kind="stable")
    rows: list[list[int]] = []
    for w in range(0, len(order), window):
        part = order[w:w + window]
        part = part[np.argsort(-lengths[part], kind="stable")]
        # by_free[f]: rows of this window with f free tokens and room for another sample (most recent last)
        by_free: list[list[int]] = [[] for _ in range(seq_len + 1)]
        first = len(rows)
        for i, n in zip(part.tolist(), lengths[part].tolist()):
            free = next((f for f in range(n, seq_len + 1) if by_free[f]), None)
            if free is None:
                row, free = len(rows), seq_len
                rows.append([i])
            else:
                row = by_free[free].pop()
                rows[row].append(i)
            if len(rows[row]) < samples_per_row and free - n >= MIN_SAMPLE:
                by_free[free - n].append(row)
        # The window's rows in a seeded random order, not longest first: the first rows of a split (what a
        # limited evaluation reads) are then like any others.
        mine = rows[first:]
        rows[first:] = [mine[j] for j in np.argsort(uniform(0x9ACD, seed, w, np.arange(len(mine))), kind="stable")]
    out = np.full((len(rows), samples_per_row), -1, np.int64)
    for r, samples in enumerate(rows):
        out[r, :len(samples)] = samples
    return out


def packed_pairs(pairs: Pairs, rows: np.ndarray) -> Pairs:
    """The pairs of each row's slots as (n_rows, K) arrays (``rows`` from ``pack``), zeros in unused slots."""
    used = rows >= 0
    return Pairs(*(np.where(used, np.asarray(c)[np.where(used, rows, 0)], 0).astype(np.asarray(c).dtype)
                   for c in pairs))


def _layout(la: np.ndarray, lb: np.ndarray):
    """Where each segment of rows with lengths la, lb (n, K) starts, its length (0 if unused) and whether it is used."""
    la, lb = la.astype(np.int64), lb.astype(np.int64)
    used = la > 0
    length = np.where(used, la + lb + 3, 0)
    return np.cumsum(length, axis=1) - length, length, used, la, lb


def assemble_packed_rows(tokens: np.ndarray, pairs: Pairs, seq_len: int, special: SpecialIds,
                         dtype: np.dtype) -> np.ndarray:
    """Packed rows of ``dtype`` (``examples.row_dtype`` with K segments) from ``pairs`` of (n, K) arrays
    (``packed_pairs``; la = lb = 0 in unused slots) and the flat corpus ``tokens``: each sample's ``[CLS] A [SEP] B
    [SEP]`` right after the previous one, padding after the last."""
    start, length, used, la, lb = _layout(pairs.la, pairs.lb)
    if (length.sum(1) > seq_len).any():
        raise ValueError(f"a packed row holds more than seq_len={seq_len} tokens")
    pos = np.arange(seq_len)[None, :]
    ids = np.full((len(la), seq_len), special.pad, np.int64)
    for k in range(la.shape[1]):
        local, a, b = pos - start[:, k:k + 1], la[:, k:k + 1], lb[:, k:k + 1]
        in_a, in_b = (local >= 1) & (local <= a), (local >= a + 2) & (local < a + 2 + b)
        text = in_a | in_b
        src = np.where(in_a, pairs.a0[:, k:k + 1] + local - 1, pairs.b0[:, k:k + 1] + local - a - 2)
        ids = np.where(text, tokens[np.where(text, src, 0)], ids)
        ids = np.where(used[:, k:k + 1] & (local == 0), special.cls, ids)
        ids = np.where(used[:, k:k + 1] & ((local == a + 1) | (local == a + b + 2)), special.sep, ids)
    out = np.zeros(len(la), dtype)
    out["ids"], out["la"], out["lb"], out["nsp"] = ids, pairs.la, pairs.lb, pairs.nsp
    return out


def fill(rows: np.ndarray) -> float:
    """Real (non-padding) tokens over all token slots of ``rows`` (stored rows, packed or not)."""
    la, lb = rows["la"].astype(np.int64), rows["lb"].astype(np.int64)
    return float(np.where(la > 0, la + lb + 3, 0).sum() / max(rows["ids"].size, 1))


def masked_packed_batch(rows: np.ndarray, example: np.ndarray, key: tuple[int, int], special: SpecialIds,
                        random_ids: np.ndarray, mask_prob: float, max_predictions: int) -> dict[str, np.ndarray]:
    """The training batch of packed ``rows``, masked with randomness keyed by ``key`` = (seed, epoch), each row's
    ``example`` index and the position in the row (``examples.masked_batch``'s hashes): each sample's n lowest
    scores among its real A/B tokens are masked, n = rint(mask_prob * its A/B tokens) and at least 1; a row whose
    samples ask for more than ``max_predictions`` keeps each sample's first picks first (lowest rank within the
    sample, then score). A row of one sample is masked exactly as ``examples.masked_batch`` masks it.

    Keys: those of ``masked_batch`` plus ``segment_ids`` (B, S) int32 (k = 1..K on sample k's tokens, 0 at padding),
    ``position_ids`` (B, S) int32 (restarting at 0 at each [CLS]; 0 at padding), ``nsp_positions`` (B, K) int32 (each
    sample's [CLS]; 0 in unused slots), ``nsp_labels`` (B, K) int32 and ``nsp_weights`` (B, K) float32 (1 for a
    sample, 0 for an unused slot); ``attention_mask`` is segment_ids > 0."""
    seq_len, n_pred = rows["ids"].shape[1], max_predictions
    ids = rows["ids"].astype(np.int32)
    start, length, used, la, lb = _layout(rows["la"], rows["lb"])
    n, k_max = la.shape
    pos = np.arange(seq_len)[None, :]
    segment = np.zeros((n, seq_len), np.int64)
    position = np.zeros((n, seq_len), np.int64)
    token_type = np.zeros((n, seq_len), np.int64)
    maskable = np.zeros((n, seq_len), np.int64)  # k + 1 on sample k's A/B tokens, 0 elsewhere
    for k in range(k_max):
        local, a, b = pos - start[:, k:k + 1], la[:, k:k + 1], lb[:, k:k + 1]
        inside = (local >= 0) & (local < length[:, k:k + 1])
        segment = np.where(inside, k + 1, segment)
        position = np.where(inside, local, position)
        token_type = np.where(inside & (local >= a + 2), 1, token_type)
        real = ((local >= 1) & (local <= a)) | ((local >= a + 2) & (local < a + 2 + b))
        maskable = np.where(real, k + 1, maskable)
    example = np.asarray(example, np.int64)[:, None]
    score = np.where(maskable > 0, uniform(*key, 0, example, pos), 2.0)
    # Rank of each token within its sample by score: sort by (sample, score), count from each sample's first.
    order = np.lexsort((score, maskable), axis=-1)
    counts = np.stack([(maskable == k).sum(1) for k in range(k_max + 1)], axis=1)
    offsets = np.cumsum(counts, axis=1) - counts
    sorted_rank = np.arange(seq_len)[None, :] - np.take_along_axis(offsets, np.take_along_axis(maskable, order, 1), 1)
    rank = np.empty_like(sorted_rank)
    np.put_along_axis(rank, order, sorted_rank, axis=1)
    n_mask = np.where(used, np.clip(np.rint((la + lb) * mask_prob), 1, n_pred), 0).astype(np.int64)
    wanted = np.take_along_axis(np.concatenate([np.zeros((n, 1), np.int64), n_mask], 1), maskable, 1)
    priority = np.where((maskable > 0) & (rank < wanted), rank + score, np.inf)
    picked = np.argsort(priority, axis=1, kind="stable")[:, :n_pred]
    picked = np.sort(np.where(np.take_along_axis(priority, picked, 1) < np.inf, picked, seq_len), axis=1)
    weights = picked < seq_len
    positions = np.where(weights, picked, 0)
    r = np.arange(n)[:, None]
    labels = np.where(weights, ids[r, positions], 0)
    action = uniform(*key, 1, example, positions)
    random_tok = random_ids[hash64(*key, 2, example, positions) % np.uint64(len(random_ids))]
    new = np.where(action < 0.8, special.mask, np.where(action < 0.9, random_tok, labels))
    ids[r, positions] = np.where(weights, new, ids[r, positions])
    return {"input_ids": ids, "token_type_ids": token_type.astype(np.int32),
            "attention_mask": (segment > 0).astype(np.int32), "masked_positions": positions.astype(np.int32),
            "masked_labels": labels.astype(np.int32), "masked_weights": weights.astype(np.float32),
            "nsp_labels": np.where(used, rows["nsp"], 0).astype(np.int32),
            "segment_ids": segment.astype(np.int32), "position_ids": position.astype(np.int32),
            "nsp_positions": np.where(used, start, 0).astype(np.int32), "nsp_weights": used.astype(np.float32)}
