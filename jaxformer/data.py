"""BERT pre-training data: MLM + NSP examples and batching (corpus reading and the tokenizer: corpus.py).

Pipeline: ``iter_documents`` streams documents (lists of sentences) from disk; ``PretrainingData``
tokenizes them in chunks, splits documents into train/eval by a hash of the document index, builds
NSP sentence pairs once (Google's ``create_pretraining_data`` logic) and masks tokens afresh each
time a batch is drawn. Text is streamed and never held; what *is* held in memory is one flat numpy
array of all token ids (2 bytes per token when the vocabulary has < 65536 entries, about half the
size of the UTF-8 text) plus a few offset integers per sentence and per example. Corpora whose ids
do not fit in RAM would need a sharded, on-disk variant of this (not provided).
"""
from __future__ import annotations

import array
import collections
import dataclasses
import functools
import itertools
import math
import queue
import random
import threading
import time
from pathlib import Path
from typing import Iterator

import numpy as np
from tokenizers import Tokenizer

from .corpus import (  # noqa: F401  (re-exported: data.py is the public entry point)
    DEFAULT_CACHE_DIR, SPECIAL_TOKENS, CorpusStats, DataError, PathLike, SpecialIds, builtin_corpus,
    iter_documents, load_or_train_tokenizer, resolve_paths, special_token_ids, split_sentences,
)


# ----------------------------------------------------------------------------- examples
def max_predictions_ok(value, seq_len: int) -> bool:
    """None (the default: mask_prob of seq_len) or an integer in [1, seq_len - 3]: [CLS] and two [SEP] are never
    masked. DataConfig's rule; TrainConfig checks it too, before any data work."""
    return value is None or (isinstance(value, int) and 1 <= value <= seq_len - 3)


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """What to read and how to turn it into MLM + NSP examples. ``paths=None``: built-in corpus."""

    paths: PathLike | tuple[PathLike, ...] | None = None
    seq_len: int = 128
    max_predictions_per_seq: int | None = None  # None: ceil(mask_prob * seq_len), e.g. 20 for 128
    mask_prob: float = 0.15
    short_seq_prob: float = 0.1
    eval_fraction: float = 0.02
    seed: int = 0
    lowercase: bool = True
    vocab: PathLike | None = None  # vocab.txt or tokenizer.json; None: train one
    vocab_size: int = 8192
    cache_dir: PathLike | None = None  # built-in corpus cache; None: ~/.cache/jaxformer

    def __post_init__(self):
        if isinstance(self.paths, list):
            object.__setattr__(self, "paths", tuple(self.paths))
        def prob(v, low_ok=False):
            return isinstance(v, (int, float)) and (0.0 <= v if low_ok else 0.0 < v) and v < 1.0
        checks = {"seq_len": isinstance(self.seq_len, int) and self.seq_len >= 8,
                  "mask_prob": prob(self.mask_prob),
                  "short_seq_prob": prob(self.short_seq_prob, low_ok=True) or self.short_seq_prob == 1,
                  "eval_fraction": prob(self.eval_fraction),
                  "seed": isinstance(self.seed, int) and self.seed >= 0,
                  "vocab_size": isinstance(self.vocab_size, int) and self.vocab_size >= 16,
                  "max_predictions_per_seq": max_predictions_ok(self.max_predictions_per_seq, self.seq_len)}
        for field, ok in checks.items():
            if not ok:
                raise DataError(f"DataConfig.{field} has a nonsense value {getattr(self, field)!r} "
                                "(seq_len >= 8; probabilities in range; 1 <= max_predictions <= seq_len-3)")

    @property
    def max_predictions(self) -> int:
        return self.max_predictions_per_seq or min(self.seq_len - 3, math.ceil(self.mask_prob * self.seq_len))


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _hash(*parts) -> np.ndarray:
    """Counter-based hash (splitmix64) of broadcast non-negative integer arrays -> uint64.

    Randomness for masking comes from this, keyed by (seed, epoch, example, position), so an
    example's masking is a pure function of those and independent of batch layout or history.
    """
    h = np.uint64(0x2545F4914F6CDD1D)
    with np.errstate(over="ignore"):
        for part in parts:
            h = h ^ (np.asarray(part, dtype=np.uint64) + _GOLDEN)
            h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            h = h ^ (h >> np.uint64(31))
    return h


def _uniform(*parts) -> np.ndarray:
    return (_hash(*parts) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def _check_int(name: str, value, minimum: int) -> None:
    if not isinstance(value, (int, np.integer)) or value < minimum:
        raise DataError(f"{name} must be an integer >= {minimum}, got {value!r}")


# NSP examples as offsets into the flat token array: A = tokens[a0:a0 + la], B likewise.
_Split = collections.namedtuple("_Split", "a0 la b0 lb nsp")


class PretrainingData:
    """MLM + NSP batches for BERT pre-training.

    Streamed: the corpus text (tokenized ``chunk_sentences`` at a time). Held: all token ids as
    one numpy array (uint16 if the vocab has < 65536 entries, else int32), sentence/document
    offsets, and 4 offsets + a label per example. Pairs are made once (deterministic given the
    seed); masking is redone for every batch drawn, keyed by (seed, epoch, example index).
    Batches hold ``input_ids``, ``token_type_ids``, ``attention_mask`` (B, S) int32,
    ``masked_positions``, ``masked_labels`` (B, P) int32, ``masked_weights`` (B, P) float32 and
    ``nsp_labels`` (B,) int32 where 0 = B continues A (IsNext) and 1 = B is random.
    """

    def __init__(self, config: DataConfig, tokenizer: Tokenizer, chunk_sentences: int = 8192):
        self.config, self.tokenizer = config, tokenizer
        self.special = special_token_ids(tokenizer)
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.paths = config.paths if config.paths is not None else builtin_corpus(config.cache_dir)
        self.stats = CorpusStats()
        self._tokenize(iter_documents(self.paths, self.stats), chunk_sentences)
        n_docs = len(self._doc_starts) - 1
        if n_docs < 4:
            raise DataError(f"corpus {', '.join(map(str, resolve_paths(self.paths)))} has {n_docs} non-empty "
                            "documents; need at least 4 "
                            "(2 for training and 2 for the held-out eval split, for random NSP pairs)")
        # Eval split: a pure function of the document index (not of the seed), so eval documents
        # stay the same across runs and seeds; at least two documents so random-next pairs exist.
        u = _uniform(0xE7A1, np.arange(n_docs))
        is_eval = u < config.eval_fraction
        if is_eval.sum() < 2:
            is_eval[np.argsort(u)[:2]] = True
        if (~is_eval).sum() < 2:
            raise DataError(f"eval_fraction={config.eval_fraction} leaves {(~is_eval).sum()} of "
                            f"{n_docs} documents for training; need at least 2")
        rng = random.Random(config.seed)
        self._train = self._make_pairs(np.flatnonzero(~is_eval), rng)
        self._eval = self._make_pairs(np.flatnonzero(is_eval), rng)
        special = np.array([*self.special, *tokenizer.get_added_tokens_decoder()])
        self._random_ids = np.setdiff1d(np.arange(self.vocab_size), special)  # 10% replacements
        self._perm_cache: tuple[int, np.ndarray] | None = None

    @classmethod
    def from_config(cls, config: DataConfig, tokenizer_dir: PathLike | None = None) -> "PretrainingData":
        """Load ``config.vocab`` or train a tokenizer, then build.

        A trained tokenizer is kept in ``tokenizer_dir`` (default ``<cache_dir>/tokenizer``) and
        reused while corpus and settings are unchanged, so reruns see the same token ids.
        """
        paths = config.paths if config.paths is not None else builtin_corpus(config.cache_dir)
        if tokenizer_dir is None:
            tokenizer_dir = Path(config.cache_dir or DEFAULT_CACHE_DIR).expanduser() / "tokenizer"
        tok = load_or_train_tokenizer(config.vocab, paths, config.vocab_size, config.lowercase, tokenizer_dir)
        return cls(dataclasses.replace(config, paths=paths), tok)

    num_train_examples = property(lambda self: len(self._train.nsp))
    num_eval_examples = property(lambda self: len(self._eval.nsp))

    def _tokenize(self, docs: Iterator[list[str]], chunk_sentences: int) -> None:
        dtype = np.uint16 if self.vocab_size <= 65536 else np.int32
        chunks, sent_lens, doc_sizes, pending, pending_docs = [], [], [], [], []
        encode_special = self.tokenizer.encode_special_tokens
        # Literal "[SEP]" etc. in the text must be plain text, not structure tokens.
        self.tokenizer.encode_special_tokens = True
        try:
            for doc in itertools.chain(docs, [None]):  # None: flush the last chunk
                if doc is not None:
                    pending.extend(doc)
                    pending_docs.append(len(doc))
                if pending and (doc is None or len(pending) >= chunk_sentences):
                    ids = [e.ids for e in self.tokenizer.encode_batch_fast(pending, add_special_tokens=False)]
                    it, lens, sizes = iter(ids), [], []
                    for n in pending_docs:  # sentences that normalize to nothing are dropped
                        doc_lens = [len(x) for x in itertools.islice(it, n) if x]
                        lens.extend(doc_lens)
                        sizes.extend([len(doc_lens)] if doc_lens else [])
                    chunks.append(np.fromiter(itertools.chain.from_iterable(ids), dtype))
                    sent_lens.append(np.array(lens, np.int64))
                    doc_sizes.append(np.array(sizes, np.int64))
                    pending, pending_docs = [], []
        finally:
            self.tokenizer.encode_special_tokens = encode_special
        self._tokens = np.concatenate(chunks)
        # Offsets: sentence s is tokens[_sent_starts[s]:_sent_starts[s + 1]]; document d is
        # sentences _doc_starts[d] to _doc_starts[d + 1].
        self._sent_starts = np.concatenate([[0], np.cumsum(np.concatenate(sent_lens))])
        self._doc_starts = np.concatenate([[0], np.cumsum(np.concatenate(doc_sizes))])
        self.stats.tokens = len(self._tokens)

    def _make_pairs(self, docs: np.ndarray, rng: random.Random) -> _Split:
        """Google BERT's ``create_instances_from_document`` over ``docs``, as token offsets.

        Differences: random B segments come from the same split only (eval stays held out); when
        a chunk is one sentence, BERT forces a random B, which skews NSP labels on corpora of
        short documents, so we cut that sentence at a random token instead (B still continues
        A); truncation removes the excess from the longer segment, split randomly front/back.
        """
        cfg, max_tokens = self.config, self.config.seq_len - 3
        cols = [array.array("q") for _ in range(5)]  # a0, la, b0, lb, nsp: compact while growing

        def offsets(doc: int) -> list[int]:  # token offsets of the document's sentence starts + end
            return self._sent_starts[self._doc_starts[doc]:self._doc_starts[doc + 1] + 1].tolist()

        for d in docs.tolist():
            starts, n = offsets(d), self._doc_starts[d + 1] - self._doc_starts[d]
            target = rng.randint(2, max_tokens) if rng.random() < cfg.short_seq_prob else max_tokens
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
                    other_starts = offsets(docs[-1] if other == d else other)  # never the same doc
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
        return _Split(*(np.frombuffer(c, np.int64) for c in cols))

    # -------------------------------------------------------------------------- batches
    def _batch(self, split: _Split, rows: np.ndarray, key: tuple[int, ...]) -> dict[str, np.ndarray]:
        """Assemble ``[CLS] A [SEP] B [SEP]`` rows and mask them with randomness keyed by ``key``."""
        cfg, sp, n_pred = self.config, self.special, self.config.max_predictions
        la, lb = split.la[rows][:, None], split.lb[rows][:, None]
        pos = np.arange(cfg.seq_len)[None, :]
        in_a, in_b = (pos >= 1) & (pos <= la), (pos >= la + 2) & (pos < la + 2 + lb)
        src = np.where(in_a, split.a0[rows][:, None] + pos - 1, split.b0[rows][:, None] + pos - la - 2)
        ids = np.where(in_a | in_b, self._tokens[np.where(in_a | in_b, src, 0)], sp.pad).astype(np.int32)
        ids[:, 0] = sp.cls
        ids[pos == la + 1] = sp.sep
        ids[pos == la + lb + 2] = sp.sep
        attention = pos < la + lb + 3
        # MLM: the n lowest hash scores among real A/B tokens are masked (BERT's shuffle + take n).
        example = np.asarray(rows, np.int64)[:, None]
        score = np.where(in_a | in_b, _uniform(*key, 0, example, pos), 2.0)
        n_mask = np.clip(np.rint((in_a | in_b).sum(1) * cfg.mask_prob), 1, n_pred)[:, None]
        picked = np.argsort(score, axis=1, kind="stable")[:, :n_pred]
        picked = np.sort(np.where(np.arange(n_pred)[None, :] < n_mask, picked, cfg.seq_len), axis=1)
        weights = picked < cfg.seq_len
        positions = np.where(weights, picked, 0)
        r = np.arange(len(rows))[:, None]
        labels = np.where(weights, ids[r, positions], 0)
        # 80% [MASK], 10% a random non-special token, 10% unchanged.
        action = _uniform(*key, 1, example, positions)
        random_tok = self._random_ids[_hash(*key, 2, example, positions) % np.uint64(len(self._random_ids))]
        new = np.where(action < 0.8, sp.mask, np.where(action < 0.9, random_tok, labels))
        ids[r, positions] = np.where(weights, new, ids[r, positions])
        return {"input_ids": ids, "token_type_ids": ((pos >= la + 2) & attention).astype(np.int32),
                "attention_mask": attention.astype(np.int32), "masked_positions": positions.astype(np.int32),
                "masked_labels": labels.astype(np.int32), "masked_weights": weights.astype(np.float32),
                "nsp_labels": split.nsp[rows].astype(np.int32)}

    def steps_per_epoch(self, batch_size: int) -> int:
        """Full batches per epoch; ``DataError`` if the corpus cannot fill a single one."""
        _check_int("batch_size", batch_size, 1)
        if self.num_train_examples < batch_size:
            raise DataError(f"corpus too small: made {self.num_train_examples} training examples, "
                            f"fewer than one batch of batch_size={batch_size}")
        return self.num_train_examples // batch_size

    def train_batch(self, step: int, batch_size: int, process_index: int = 0,
                    process_count: int = 1) -> dict[str, np.ndarray]:
        """Global batch ``step`` (a pure function of seed and step), or this process's rows of it.

        Epoch e = step // steps_per_epoch uses permutation (seed, e) of the training examples
        (the last partial batch of each epoch is dropped) and masking keyed by (seed, e).
        """
        _check_int("step", step, 0)
        spe = self.steps_per_epoch(batch_size)
        if process_count < 1 or not 0 <= process_index < process_count or batch_size % process_count:
            raise DataError(f"bad sharding: process_index={process_index}, process_count="
                            f"{process_count}, batch_size={batch_size} (must divide evenly)")
        epoch, k = divmod(step, spe)
        if self._perm_cache is None or self._perm_cache[0] != epoch:
            perm = np.random.default_rng([self.config.seed, epoch]).permutation(self.num_train_examples)
            self._perm_cache = (epoch, perm)
        local = batch_size // process_count
        start = k * batch_size + process_index * local
        return self._batch(self._train, self._perm_cache[1][start:start + local], (self.config.seed, epoch))

    def train_batches(self, batch_size: int, start_step: int = 0, process_index: int = 0,
                      process_count: int = 1) -> Iterator[dict[str, np.ndarray]]:
        """Infinite batches ``start_step, start_step + 1, ...`` (see ``train_batch``)."""
        _check_int("start_step", start_step, 0)
        self.train_batch(start_step, batch_size, process_index, process_count)  # validate eagerly

        def generate() -> Iterator[dict[str, np.ndarray]]:
            step = start_step
            while True:
                yield self.train_batch(step, batch_size, process_index, process_count)
                step += 1
        return generate()

    def eval_batches(self, batch_size: int) -> list[dict[str, np.ndarray]]:
        """All held-out examples in order with fixed masking; the last batch is topped up by
        wrapping around to the first examples so every batch has the same static shape."""
        _check_int("batch_size", batch_size, 1)
        n = self.num_eval_examples
        rows = np.arange(-(-n // batch_size) * batch_size) % n
        return [self._batch(self._eval, rows[i:i + batch_size], (self.config.seed, 2**32))
                for i in range(0, len(rows), batch_size)]

    @functools.cached_property
    def most_frequent_token_baseline(self) -> float:
        """MLM accuracy on the eval split of always predicting its most frequent masked label."""
        batch = self._batch(self._eval, np.arange(self.num_eval_examples), (self.config.seed, 2**32))
        labels = batch["masked_labels"][batch["masked_weights"] > 0]
        return float(np.bincount(labels).max() / len(labels))


# ----------------------------------------------------------------------------- prefetching
class Prefetcher:
    """Iterate ``iterator`` in a daemon thread, ``depth`` items ahead.

    ``wait_seconds`` is the total time the consumer blocked waiting for items, ``last_wait_seconds``
    the wait for the latest one. Producer exceptions are re-raised in the consumer. Call
    ``close()`` (or use ``with``) to stop the thread; being a daemon it never blocks exit.
    """

    def __init__(self, iterator, depth: int = 2):
        if depth < 1:
            raise DataError(f"Prefetcher depth must be >= 1, got {depth!r}")
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        self.wait_seconds = self.last_wait_seconds = 0.0
        self.num_items = 0
        self._thread = threading.Thread(target=self._produce, args=(iter(iterator),),
                                        name="jaxformer-prefetch", daemon=True)
        self._thread.start()

    def _produce(self, iterator) -> None:
        try:
            for item in iterator:
                if not self._put(("item", item)):
                    return
            self._put(("end", None))
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            self._put(("error", e))
        finally:
            getattr(iterator, "close", lambda: None)()

    def _put(self, message) -> bool:
        while not self._stop.is_set():  # poll so close() can stop a producer blocked on a full queue
            try:
                self._queue.put(message, timeout=0.05)
                return True
            except queue.Full:
                pass
        return False

    def __iter__(self):
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        start = time.perf_counter()
        kind, value = self._queue.get()  # the producer always ends with "end" or "error"
        self.last_wait_seconds = time.perf_counter() - start
        self.wait_seconds += self.last_wait_seconds
        if kind == "item":
            self.num_items += 1
            return value
        self._done = True
        if kind == "error":
            raise value
        raise StopIteration

    def close(self) -> None:
        self._stop.set()  # the producer notices within 50 ms, or after its current item
        self._done = True
        self._thread.join(timeout=5.0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def synthetic_batch(vocab: int, b: int, s: int, p: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A random pre-training batch in the trainer's layout (numpy; benchmarks and the HLO report use it)."""
    rng = np.random.RandomState(seed)
    return dict(input_ids=rng.randint(5, vocab, (b, s)).astype(np.int32),
                token_type_ids=((np.arange(s) >= s // 2) * np.ones((b, 1))).astype(np.int32),
                attention_mask=np.ones((b, s), np.int32),
                masked_positions=np.sort(rng.choice(s, (b, p)), axis=1).astype(np.int32),
                masked_labels=rng.randint(5, vocab, (b, p)).astype(np.int32),
                masked_weights=np.ones((b, p), np.float32),
                nsp_labels=rng.randint(0, 2, (b,)).astype(np.int32))
