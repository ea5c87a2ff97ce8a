"""Training and eval batches from a prepared directory (``jaxformer.prepare``) through a Grain pipeline.

Global batch ``step`` is a pure function of (prepared set, seed, batch size, step): epoch e = step // steps_per_epoch
visits the training rows in Grain's shuffled order for (seed, e) (``MapDataset.range(n).shuffle().repeat()``; the
last partial batch of an epoch is dropped), and each row is masked afresh with randomness keyed by (seed, e, row)
(``examples.masked_batch``; packed rows: ``packing.masked_packed_batch``, each sample of a row masked on its own). A process reads only its block of rows of each global batch (``block`` of
``n_blocks``: ``distributed.batch_block``). Grain runs the batches in worker processes ahead of the consumer
(``MultiprocessingOptions``), or in threads of this process with ``workers=0``.

Because the stream is a function of the step, the iterator's state is its step: ``TrainBatches.state()`` gives it
as JSON bytes (with what the stream depends on, checked when restoring), and ``train_batches(..., state=...)``
continues exactly there, whatever the number of processes, blocks or workers of the resumed run.
"""
from __future__ import annotations

import json
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from .corpus import DataError
from .data import default_max_predictions
from .examples import EVAL_EPOCH, hash64, masked_batch
from .packing import masked_packed_batch
from .prepared import PreparedSet

STATE_FORMAT = "jaxformer-loader-state"


def grain_seed(seed: int) -> int:
    """Grain's shuffle seeds epoch e with seed + e, so runs with seeds s and s + 1 would see the same orders one
    epoch apart; a hash of the run's seed keeps those far apart."""
    return int(hash64(0x5EED, seed) % np.uint64(2**32))


def _max_predictions(data: PreparedSet, mask_prob: float, max_predictions: int | None) -> int:
    if not (isinstance(mask_prob, (int, float)) and 0 < mask_prob < 1):
        raise DataError(f"mask_prob={mask_prob!r} must be in (0, 1)")
    if max_predictions is None:
        return default_max_predictions(data.seq_len, mask_prob, data.packing)
    if not isinstance(max_predictions, int) or not 1 <= max_predictions <= data.seq_len - 3:
        raise DataError(f"max_predictions={max_predictions!r} must be an integer in [1, seq_len - 3 = "
                        f"{data.seq_len - 3}]")
    return max_predictions


def _check_blocks(batch_size: int, block: int, n_blocks: int) -> None:
    if not isinstance(batch_size, int) or batch_size < 1:
        raise DataError(f"batch_size={batch_size!r} must be an integer >= 1")
    if n_blocks < 1 or not 0 <= block < n_blocks or batch_size % n_blocks:
        raise DataError(f"bad sharding: block={block}, n_blocks={n_blocks}, batch_size={batch_size} "
                        "(0 <= block < n_blocks, and n_blocks must divide batch_size)")


def _stream(data: PreparedSet, seed: int, batch_size: int, mask_prob: float, max_predictions: int) -> dict:
    """What the global batch stream depends on (not the process blocks or workers that read it); `pack` only for
    packed rows, so that unpacked states keep their earlier form."""
    stream = dict(data=data.manifest["inputs"]["sha256"], tokenizer=data.manifest["tokenizer"]["sha256"],
                  seq_len=data.seq_len, pair_seed=data.pair_seed, seed=seed, batch_size=batch_size,
                  mask_prob=mask_prob, max_predictions=max_predictions)
    return dict(stream, pack=data.packing) if data.packing else stream


def masking(data: PreparedSet):
    """The masking function of `data`'s rows: `examples.masked_batch`, or `packing.masked_packed_batch` for packed
    rows (same signature)."""
    return masked_packed_batch if data.packing else masked_batch


class _TrainBatch:
    """step -> this process's rows of global batch ``step``, masked. Grain's worker processes run it (pickled)."""

    def __init__(self, data: PreparedSet, batch_size: int, seed: int, block: int, n_blocks: int,
                 mask_prob: float, max_predictions: int):
        import grain

        self.rows, self.n = data.rows["train"], data.num_train_examples
        self.order = grain.MapDataset.range(self.n).shuffle(seed=grain_seed(seed)).repeat()
        self.steps_per_epoch, self.batch_size = self.n // batch_size, batch_size
        self.local = batch_size // n_blocks
        self.offset = block * self.local
        self.seed, self.special, self.random_ids = seed, data.special, data.random_ids
        self.mask_prob, self.max_predictions, self.mask = mask_prob, max_predictions, masking(data)

    def __call__(self, step) -> dict[str, np.ndarray]:
        epoch, k = divmod(int(step), self.steps_per_epoch)
        first = epoch * self.n + k * self.batch_size + self.offset  # position in the repeated, shuffled order
        rows = np.fromiter((self.order[first + r] for r in range(self.local)), np.int64, self.local)
        return self.mask(self.rows.read(rows), rows, (self.seed, epoch), self.special, self.random_ids,
                         self.mask_prob, self.max_predictions)


def _init_worker(index: int, count: int) -> None:
    """In each of Grain's worker processes: Ctrl-C is the training process's to handle (a terminal sends it to the
    whole process group), and the worker ends when that process is gone (killed with SIGKILL, it cannot close
    them; they would wait for it forever)."""
    import os
    import signal
    import threading

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)
    threading.Thread(target=watch, name="jaxformer-loader-parent", daemon=True).start()


class TrainBatches:
    """Iterator of this process's rows of global batches ``start_step, start_step + 1, ...`` (endless).

    ``step`` is the global step of the next batch; ``state()`` saves it; ``wait_seconds`` / ``last_wait_seconds``
    count the time ``next`` blocked. Close it (or use ``with``) to stop Grain's worker processes.
    """

    def __init__(self, data: PreparedSet, batch_size: int, seed: int, start_step: int, block: int, n_blocks: int,
                 mask_prob: float, max_predictions: int, workers: int, prefetch: int):
        import grain

        if workers > 0:
            # grain 0.2.18's worker start reads an absl flag, which fails unless flags count as parsed (programs
            # not started by absl.app never parse them; fixed in later grain releases).
            from absl import flags
            if not flags.FLAGS.is_parsed():
                flags.FLAGS.mark_as_parsed()
        self.step, self.wait_seconds, self.last_wait_seconds = start_step, 0.0, 0.0
        self._stream = _stream(data, seed, batch_size, mask_prob, max_predictions)
        fn = _TrainBatch(data, batch_size, seed, block, n_blocks, mask_prob, max_predictions)
        ds = grain.MapDataset.range(start_step, sys.maxsize).map(fn)
        # With workers, each runs one batch at a time (they are the parallelism); without, threads of this process.
        it = ds.to_iter_dataset(grain.ReadOptions(num_threads=1 if workers else 2, prefetch_buffer_size=prefetch))
        if workers:
            # Arrays under 1 MiB travel pickled, not through a new shared-memory block each: 1.6x the batches/s at
            # B=64, S=128 (benchmarks/results/data.md, Loader).
            it = grain.experimental.WithOptionsIterDataset(it, grain.experimental.DatasetOptions(min_shm_size=1 << 20))
            it = it.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers, per_worker_buffer_size=prefetch),
                                worker_init_fn=_init_worker)
        self._it = iter(it)
        # The first batch is asked for now, in a thread, so that the workers start (seconds: each imports grain and
        # jax) while the caller does other work, e.g. compiles the model. Grain 0.2.18's start_prefetch() does not
        # reach the workers of an interleaved mp_prefetch.
        pool = ThreadPoolExecutor(1, thread_name_prefix="jaxformer-loader-start")
        self._first: Future | None = pool.submit(next, self._it)
        pool.shutdown(wait=False)

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        start = time.perf_counter()
        if self._first is not None:
            first, self._first = self._first, None
            raw = first.result()
        else:
            raw = next(self._it)
        # Plain arrays: Grain's workers hand large arrays over in shared memory, released once the copy is made.
        batch = {k: np.array(v) for k, v in raw.items()}
        self.last_wait_seconds = time.perf_counter() - start
        self.wait_seconds += self.last_wait_seconds
        self.step += 1
        return batch

    def state(self, step: int | None = None) -> bytes:
        """JSON bytes: the step to continue from (default: that of the next batch this iterator yields; a consumer
        that prefetches passes the step it has trained) and what the stream depends on."""
        step = self.step if step is None else step
        if not isinstance(step, int) or step < 0:
            raise DataError(f"step={step!r} must be an integer >= 0")
        return json.dumps(dict(format=STATE_FORMAT, **self._stream, step=step)).encode()

    def close(self) -> None:
        if self._first is not None:  # the iterator is not thread-safe: let the first request finish
            self._first.exception()
            self._first = None
        if self._it is not None:
            self._it.close()
            self._it = None  # collected now, not at interpreter exit (where Grain's __del__ fails noisily)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def steps_per_epoch(data: PreparedSet, batch_size: int) -> int:
    """Full global batches per epoch (the last partial batch of an epoch is dropped)."""
    _check_blocks(batch_size, 0, 1)
    return data.num_train_examples // batch_size


def train_batches(data: PreparedSet, batch_size: int, seed: int = 0, start_step: int = 0, block: int = 0,
                  n_blocks: int = 1, mask_prob: float = 0.15, max_predictions: int | None = None,
                  workers: int = 2, prefetch: int = 2, state: bytes | None = None) -> TrainBatches:
    """This process's rows (block ``block`` of ``n_blocks``) of global batches from ``start_step`` on, or from the
    step saved in ``state`` (``TrainBatches.state()``; DataError if it was saved for another stream: other data,
    seed, batch size or masking). Batches hold ``input_ids``, ``token_type_ids``, ``attention_mask`` (b, S) int32,
    ``masked_positions``, ``masked_labels`` (b, P) int32, ``masked_weights`` (b, P) float32 and ``nsp_labels``
    (b,) int32 (0: B continues A, 1: B is random), with b = batch_size / n_blocks. Packed rows (up to K samples):
    ``nsp_labels`` is (b, K), with ``segment_ids``, ``position_ids``, ``nsp_positions`` and ``nsp_weights``
    (``packing.masked_packed_batch``)."""
    _check_blocks(batch_size, block, n_blocks)
    if data.num_train_examples < batch_size:
        raise DataError(f"{data.root} has {data.num_train_examples} training examples, fewer than one batch of "
                        f"batch_size={batch_size}")
    if not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise DataError(f"seed={seed!r} must be a non-negative integer")
    for name, value in (("workers", workers), ("prefetch", prefetch)):
        if not isinstance(value, int) or value < (0 if name == "workers" else 1):
            raise DataError(f"{name}={value!r} must be an integer >= {0 if name == 'workers' else 1}")
    n_pred = _max_predictions(data, mask_prob, max_predictions)
    if state is not None:
        start_step = restore_step(state, data, batch_size, seed, mask_prob, n_pred)
    if not isinstance(start_step, int) or start_step < 0:
        raise DataError(f"start_step={start_step!r} must be an integer >= 0")
    return TrainBatches(data, batch_size, seed, start_step, block, n_blocks, mask_prob, n_pred, workers, prefetch)


def restore_step(state: bytes, data: PreparedSet, batch_size: int, seed: int, mask_prob: float,
                 max_predictions: int) -> int:
    """The step saved in ``state``; DataError naming each field that differs from this run's stream."""
    try:
        saved = json.loads(state)
        if saved.get("format") != STATE_FORMAT or not isinstance(saved.get("step"), int):
            raise ValueError("not a loader state")
    except (ValueError, AttributeError, TypeError) as e:
        raise DataError(f"the data iterator state is unreadable ({e}): {bytes(state)[:80]!r}") from e
    now = _stream(data, seed, batch_size, mask_prob, max_predictions)
    keys = [k for k in {**now, **saved} if k not in ("format", "step")]
    if diff := [f"{k}: saved {saved.get(k)!r}, now {now.get(k)!r}" for k in keys if saved.get(k) != now.get(k)]:
        raise DataError("the data iterator state was saved for another data stream: " + "; ".join(diff))
    return saved["step"]


# ----------------------------------------------------------------------------- eval
def _eval_rows(data: PreparedSet, rows: np.ndarray, seed: int, mask_prob: float, n_pred: int) -> dict:
    return masking(data)(data.rows["eval"].read(rows), rows, (seed, EVAL_EPOCH), data.special, data.random_ids,
                         mask_prob, n_pred)


def eval_batches(data: PreparedSet, batch_size: int, seed: int = 0, limit: int | None = None, block: int = 0,
                 n_blocks: int = 1, mask_prob: float = 0.15,
                 max_predictions: int | None = None) -> list[dict[str, np.ndarray]]:
    """The first ``limit`` (None: all) held-out batches in order with fixed masking, this process's block of rows
    of each; the last batch is topped up by wrapping around to the first examples, so every batch has the same
    static shape."""
    _check_blocks(batch_size, block, n_blocks)
    n_pred = _max_predictions(data, mask_prob, max_predictions)
    n = data.num_eval_examples
    count = -(-n // batch_size) if limit is None else min(limit, -(-n // batch_size))
    local = batch_size // n_blocks
    return [_eval_rows(data, (np.arange(local) + i * batch_size + block * local) % n, seed, mask_prob, n_pred)
            for i in range(count)]


def most_frequent_token_baseline(data: PreparedSet, seed: int = 0, mask_prob: float = 0.15,
                                 max_predictions: int | None = None, limit: int | None = None,
                                 chunk: int = 4096) -> float:
    """MLM accuracy on the eval split (its first ``limit`` examples; None: all, ~20 us an example) of always
    predicting its most frequent masked label."""
    n_pred = _max_predictions(data, mask_prob, max_predictions)
    n = data.num_eval_examples if limit is None else min(limit, data.num_eval_examples)
    counts = np.zeros(data.vocab_size, np.int64)
    for a in range(0, n, chunk):
        batch = _eval_rows(data, np.arange(a, min(a + chunk, n)), seed, mask_prob, n_pred)
        counts += np.bincount(batch["masked_labels"][batch["masked_weights"] > 0], minlength=data.vocab_size)
    return float(counts.max() / counts.sum())
