"""MLM + NSP examples, independent of where they are stored: NSP pairs (made once, when data is prepared), rows
(``[CLS] A [SEP] B [SEP]`` padded to the sequence length) and the dynamic MLM masking (redone at batch time).

The one copy of the example logic: ``jaxformer.prepare`` makes the pairs and rows, ``jaxformer.loader`` masks them.
"""
from __future__ import annotations

import array
import collections
import random

import numpy as np

from .corpus import DataError, SpecialIds

# NSP examples as offsets into the flat token array of the corpus: A = tokens[a0:a0 + la], B likewise.
Pairs = collections.namedtuple("Pairs", "a0 la b0 lb nsp")

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
EVAL_EPOCH = 2**32  # the masking key's epoch for eval batches: fixed masking, never a training epoch


def hash64(*parts) -> np.ndarray:
    """Counter-based hash (splitmix64) of broadcast non-negative integer arrays -> uint64: masking randomness is a
    pure function of (seed, epoch, example, position), independent of batch layout or history."""
    h = np.uint64(0x2545F4914F6CDD1D)
    with np.errstate(over="ignore"):
        for part in parts:
            h = h ^ (np.asarray(part, dtype=np.uint64) + _GOLDEN)
            h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            h = h ^ (h >> np.uint64(31))
    return h


def uniform(*parts) -> np.ndarray:
    return (hash64(*parts) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def eval_documents(n_docs: int, eval_fraction: float, where: str = "the corpus") -> np.ndarray:
    """Which documents are held out: a pure function of the document index (not of the seed), at least two per split
    so that random-next pairs exist in both. `where`: the corpus, as error messages name it."""
    if n_docs < 4:
        raise DataError(f"{where} has {n_docs} non-empty documents; need at least 4 "
                        "(2 for training and 2 for the held-out eval split, for random NSP pairs)")
    u = uniform(0xE7A1, np.arange(n_docs))
    is_eval = u < eval_fraction
    if is_eval.sum() < 2:
        is_eval[np.argsort(u)[:2]] = True
    if (~is_eval).sum() < 2:
        raise DataError(f"eval_fraction={eval_fraction} leaves {(~is_eval).sum()} of {n_docs} documents for "
                        "training; need at least 2")
    return is_eval


def make_pairs(sent_starts: np.ndarray, doc_starts: np.ndarray, docs: np.ndarray, rng: random.Random,
               seq_len: int, short_seq_prob: float) -> Pairs:
    """Google BERT's ``create_instances_from_document`` over ``docs``, as token offsets.

    Sentence s is tokens[sent_starts[s]:sent_starts[s + 1]]; document d is sentences doc_starts[d] to
    doc_starts[d + 1]. Differences from BERT: random B segments come from the same split only (eval stays held
    out); a one-sentence chunk is cut at a random token (B still continues A) instead of forcing a random B, which
    skews NSP labels on corpora of short documents; truncation removes the excess from the longer segment, split
    randomly front/back. One ``rng`` stream over all documents in order: pairs depend on the seed.
    """
    max_tokens = seq_len - 3
    cols = [array.array(t) for t in "qHqHB"]  # a0, la, b0, lb, nsp: 21 bytes an example while growing

    def offsets(doc: int) -> list[int]:  # token offsets of the document's sentence starts + end
        return sent_starts[doc_starts[doc]:doc_starts[doc + 1] + 1].tolist()

    for d in docs.tolist():
        starts, n = offsets(d), doc_starts[d + 1] - doc_starts[d]
        target = rng.randint(2, max_tokens) if rng.random() < short_seq_prob else max_tokens
        chunk = i = 0
        while i < n:
            if i + 1 < n and starts[i + 1] - starts[chunk] < target:
                i += 1  # grow the chunk by whole sentences up to the target length
                continue
            n_seg = i + 1 - chunk
            a_end = chunk + (rng.randint(1, n_seg - 1) if n_seg >= 2 else 1)
            a0, a1 = starts[chunk], starts[a_end]
            random_next = rng.random() < 0.5 or (n_seg == 1 and a1 - a0 < 2)
            if random_next:
                other = docs[rng.randrange(len(docs) - 1)]
                other_starts = offsets(docs[-1] if other == d else other)  # never the same document
                j = rng.randrange(len(other_starts) - 1)
                b0, b1 = other_starts[j], other_starts[j + 1]
                while b1 - b0 < target - (a1 - a0) and j + 2 < len(other_starts):
                    j += 1
                    b1 = other_starts[j + 1]
                i = a_end - 1  # BERT puts the unused sentences back for the next chunk
            elif n_seg == 1:
                b1 = a1
                a1 = b0 = a0 + rng.randint(1, a1 - a0 - 1)
            else:
                b0, b1 = a1, starts[i + 1]
            la, lb = a1 - a0, b1 - b0
            if la + lb > max_tokens:
                new_la = min(la, max(max_tokens - lb, (max_tokens + 1) // 2))
                new_lb = max_tokens - new_la
                a0 += rng.randint(0, la - new_la)
                b0 += rng.randint(0, lb - new_lb)
                la, lb = new_la, new_lb
            for col, value in zip(cols, (a0, la, b0, lb, random_next)):
                col.append(value)
            i += 1
            chunk = i
    return Pairs(*(np.frombuffer(c, np.dtype(c.typecode)) for c in cols))


# ----------------------------------------------------------------------------- rows
def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 65536 else np.int32)


def row_dtype(seq_len: int, tokens: np.dtype, segments: int = 1) -> np.dtype:
    """One stored row: ``ids`` (the assembled sequence, specials and padding included) and, per segment (one
    ``[CLS] A [SEP] B [SEP]`` sample; a packed row would hold several, one after the other), the lengths of A and B
    and the NSP label. Unused segments have la = lb = 0."""
    return np.dtype([("ids", tokens, (seq_len,)), ("la", np.uint16, (segments,)), ("lb", np.uint16, (segments,)),
                     ("nsp", np.uint8, (segments,))])


def assemble_rows(tokens: np.ndarray, pairs: Pairs, seq_len: int, special: SpecialIds, dtype: np.dtype) -> np.ndarray:
    """The rows of ``pairs`` (one segment each) from the flat corpus ``tokens`` (an array or a memory map)."""
    la, lb = pairs.la[:, None], pairs.lb[:, None]
    pos = np.arange(seq_len)[None, :]
    in_a, in_b = (pos >= 1) & (pos <= la), (pos >= la + 2) & (pos < la + 2 + lb)
    src = np.where(in_a, pairs.a0[:, None] + pos - 1, pairs.b0[:, None] + pos - la - 2)
    ids = np.where(in_a | in_b, tokens[np.where(in_a | in_b, src, 0)], special.pad)
    ids[:, 0] = special.cls
    ids[pos == la + 1] = special.sep
    ids[pos == la + lb + 2] = special.sep
    out = np.zeros(len(la), dtype)
    out["ids"], out["la"][:, 0], out["lb"][:, 0], out["nsp"][:, 0] = ids, pairs.la, pairs.lb, pairs.nsp
    return out


# ----------------------------------------------------------------------------- masking
def random_replacement_ids(vocab_size: int, special: SpecialIds, added_ids) -> np.ndarray:
    """Ids a masked token may be replaced with (BERT's 10% random tokens): all but the special and added tokens."""
    return np.setdiff1d(np.arange(vocab_size), np.array([*special, *added_ids]))


def masked_batch(rows: np.ndarray, example: np.ndarray, key: tuple[int, int], special: SpecialIds,
                 random_ids: np.ndarray, mask_prob: float, max_predictions: int) -> dict[str, np.ndarray]:
    """The training batch of ``rows`` (single-segment rows of ``row_dtype``), masked with randomness keyed by
    ``key`` = (seed, epoch) and each row's ``example`` index: the n lowest hash scores among the real A/B tokens
    are masked (BERT's shuffle + take n), then 80% [MASK], 10% a random token, 10% unchanged."""
    seq_len, n_pred = rows["ids"].shape[1], max_predictions
    ids = rows["ids"].astype(np.int32)
    la, lb = rows["la"][:, :1].astype(np.int64), rows["lb"][:, :1].astype(np.int64)
    pos = np.arange(seq_len)[None, :]
    real = ((pos >= 1) & (pos <= la)) | ((pos >= la + 2) & (pos < la + 2 + lb))
    attention = pos < la + lb + 3
    example = np.asarray(example, np.int64)[:, None]
    score = np.where(real, uniform(*key, 0, example, pos), 2.0)
    n_mask = np.clip(np.rint(real.sum(1) * mask_prob), 1, n_pred)[:, None]
    picked = np.argsort(score, axis=1, kind="stable")[:, :n_pred]
    picked = np.sort(np.where(np.arange(n_pred)[None, :] < n_mask, picked, seq_len), axis=1)
    weights = picked < seq_len
    positions = np.where(weights, picked, 0)
    r = np.arange(len(ids))[:, None]
    labels = np.where(weights, ids[r, positions], 0)
    action = uniform(*key, 1, example, positions)
    random_tok = random_ids[hash64(*key, 2, example, positions) % np.uint64(len(random_ids))]
    new = np.where(action < 0.8, special.mask, np.where(action < 0.9, random_tok, labels))
    ids[r, positions] = np.where(weights, new, ids[r, positions])
    return {"input_ids": ids, "token_type_ids": ((pos >= la + 2) & attention).astype(np.int32),
            "attention_mask": attention.astype(np.int32), "masked_positions": positions.astype(np.int32),
            "masked_labels": labels.astype(np.int32), "masked_weights": weights.astype(np.float32),
            "nsp_labels": rows["nsp"][:, 0].astype(np.int32)}
