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
