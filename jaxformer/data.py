"""BERT pre-training data: the settings (``DataConfig``), a prefetching thread and synthetic batches.

The data path: ``python -m jaxformer.prepare`` (or ``train.py`` on the fly, jaxformer/run_data.py) reads and
tokenizes a corpus once (corpus.py: reading, the built-in corpus, the tokenizer) into shards of MLM + NSP examples
(prepared.py; the example logic: examples.py), and ``jaxformer.loader`` streams masked batches from them.
"""
from __future__ import annotations

import dataclasses
import math
import queue
import threading
import time

import numpy as np

from .corpus import (  # noqa: F401  (re-exported: data.py is the public entry point)
    DEFAULT_CACHE_DIR, SPECIAL_TOKENS, CorpusStats, DataError, PathLike, SpecialIds, builtin_corpus,
    iter_documents, load_or_train_tokenizer, resolve_paths, special_token_ids, split_sentences,
)


# ----------------------------------------------------------------------------- settings
def pack_ok(value, seq_len: int, allow_zero: bool = False) -> bool:
    """Samples per packed row: an integer in [1, seq_len // 5] (the shortest sample, [CLS] a [SEP] b [SEP], takes 5
    tokens); 0 (unpacked) where ``allow_zero``."""
    return isinstance(value, int) and not isinstance(value, bool) and (
        (allow_zero and value == 0) or 1 <= value <= seq_len // 5)


def default_max_predictions(seq_len: int, mask_prob: float, pack: int = 0) -> int:
    """Masked positions per row when none are given: mask_prob of seq_len, or for rows packed with up to `pack`
    samples enough for every sample of a row (``packing.max_predictions``)."""
    if pack:
        from .packing import max_predictions
        return max_predictions(seq_len, mask_prob, pack)
    return min(seq_len - 3, math.ceil(mask_prob * seq_len))


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
    pack: int = 0  # 0: one sample a row; K >= 1: rows packed with up to K samples (jaxformer/packing.py)

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
                  "max_predictions_per_seq": max_predictions_ok(self.max_predictions_per_seq, self.seq_len),
                  "pack": pack_ok(self.pack, self.seq_len, allow_zero=True)}
        for field, ok in checks.items():
            if not ok:
                raise DataError(f"DataConfig.{field} has a nonsense value {getattr(self, field)!r} "
                                "(seq_len >= 8; probabilities in range; 1 <= max_predictions <= seq_len-3; "
                                "0 <= pack <= seq_len // 5)")

    @property
    def max_predictions(self) -> int:
        """Masked positions per row: given, or mask_prob of seq_len (packed: enough for every sample of a row,
        ``packing.max_predictions``)."""
        return self.max_predictions_per_seq or default_max_predictions(self.seq_len, self.mask_prob, self.pack)


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


def synthetic_packed_batch(vocab: int, b: int, s: int, samples_per_row: int, p: int | None = None, seed: int = 0,
                           full: float = 0.1) -> dict[str, np.ndarray]:
    """A random packed pre-training batch (jaxformer/packing.py's keys) of ``b`` rows of up to ``samples_per_row``
    samples. Sample lengths are BERT-like: a fraction ``full`` fills the row (chunks that reached the target
    length), the rest are uniform from 5 tokens to the row's length (documents that end first, BERT's short
    targets): about half a row of padding one sample a row, as Wikipedia at 512 (Krell et al. 2021, "Efficient
    Sequence Packing without Cross-contamination"). The rows are packed as the data preparation packs them and
    masked by the loader's masking (``p``: masked positions per row, default ``packing.max_predictions``)."""
    from .examples import Pairs, row_dtype
    from .packing import MIN_SAMPLE, assemble_packed_rows, masked_packed_batch, max_predictions, pack
    rng = np.random.RandomState(seed)
    lengths = np.zeros(0, np.int64)
    rows = np.zeros((0, samples_per_row), np.int64)
    while len(rows) < 2 * b:  # twice the rows needed: the rows taken are a random half, not the best-filled
        more = np.where(rng.rand(4 * b) < full, s, rng.randint(MIN_SAMPLE, s + 1, 4 * b))
        lengths = np.concatenate([lengths, more])
        rows = pack(lengths, s, samples_per_row, seed)
    rows = rows[rng.permutation(len(rows))[:b]]
    used = rows >= 0
    length = np.where(used, lengths[np.where(used, rows, 0)], 0)
    la = np.where(used, 1 + (rng.rand(*rows.shape) * (length - 4)).astype(np.int64), 0)  # A: 1 .. length - 4
    tokens = rng.randint(5, vocab, 4 * s).astype(np.int32)  # A and B are random stretches of random tokens
    pairs = Pairs(a0=rng.randint(0, 3 * s, rows.shape), la=la, b0=rng.randint(0, 3 * s, rows.shape),
                  lb=np.where(used, length - 3 - la, 0), nsp=np.where(used, rng.randint(0, 2, rows.shape), 0))
    special = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)
    stored = assemble_packed_rows(tokens, pairs, s, special, row_dtype(s, np.dtype(np.int32), samples_per_row))
    p = max_predictions(s, 0.15, samples_per_row) if p is None else p
    return masked_packed_batch(stored, np.arange(b), (seed, 0), special, np.arange(5, vocab), 0.15, p)
