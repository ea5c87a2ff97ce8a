"""A run's data: the prepared set that train.py reads (`load`), and the batches of its steps (`train_batches`).

There is one data path, prepared shards streamed by `jaxformer.loader`:

* `--data DIR` naming a prepared directory (`python -m jaxformer.prepare`: it holds a manifest.json) is opened as it
  is: its manifest, tokenizer and shard sizes are read, no text, so a run starts in the same time whatever its size.
  Its seq_len, tokenizer (`--vocab`, or the run's own on `--resume`) and packing (`--pack`, `--pack-samples`) must be
  the run's.
* Raw text (`--data` files, directories or globs, or the built-in corpus) is prepared on the fly, the same way, into
  the cache: `$JAXFORMER_CACHE_DIR/prepared/<key>/` (default ~/.cache/jaxformer), the key a digest of the text's
  contents, the tokenizer, seq_len, the seed (the NSP pairs' `pair_seed`) and the packing. A later run on the same text and
  settings (a new run, a `--resume`, another `--out`) opens it instead of tokenizing again. Entries are never deleted
  by jaxformer: delete the folder to reclaim the space.

Process 0 prepares (the others wait); a process that does not find the set afterwards (a cache that is not shared
between hosts) prepares its own copy, which is the same bytes. Every process then reads only its rows of each batch.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Callable

from . import distributed, loader
from .config import DEFAULT_VOCAB_SIZE, TrainConfig
from .corpus import (DataError, builtin_corpus, corpus_digest, default_cache_dir, load_or_train_tokenizer,
                     resolve_paths)
from .data import DataConfig
from .packing import PACK_WINDOW
from .prepare import CHUNK_BYTES, WORK, prepare
from .prepared import FORMAT, MANIFEST, TOKENIZER, VERSION, PreparedSet, read_manifest, tokenizer_digest

CACHE_SUBDIR = "prepared"


def prepared_dir(data: tuple[str, ...] | None) -> Path | None:
    """The prepared directory `--data` names (one directory holding a manifest.json, or an unfinished preparation),
    or None for raw text."""
    if data is None or len(data) != 1:
        return None
    path = Path(data[0]).expanduser()
    return path if path.is_dir() and ((path / MANIFEST).exists() or (path / WORK).is_dir()) else None


def identity(tc: TrainConfig) -> list[list]:
    """What run.json records of the run's input and `--resume` compares: each text file's path and size, or a
    prepared directory's path, the digest of the text it was prepared from and its pair seed."""
    root = prepared_dir(tc.data)
    if root is not None:
        manifest = read_manifest(root)
        return [[str(root.absolute()), manifest["inputs"]["sha256"], manifest["pair_seed"]]]
    files = resolve_paths(tc.data if tc.data is not None else builtin_corpus())
    return [[str(f.expanduser().absolute()), f.stat().st_size] for f in files]


def load(tc: TrainConfig, out: Path, log: Callable = print) -> PreparedSet:
    """The run's prepared set, checked against the run (seq_len, tokenizer, at least one batch), with its tokenizer in
    <out>/tokenizer.json: `--data DIR` if it is prepared, else the text prepared into the cache (see above)."""
    root = prepared_dir(tc.data)
    data = _open_given(tc, root, out) if root is not None else _prepare_text(tc, out, log)
    where = data.root / MANIFEST
    if root is not None:
        log(f"data: prepared set {root}")
    counts = data.manifest["counts"]
    skipped = {"lines with undecodable bytes": counts.get("undecodable_lines", 0),
               ".jsonl lines that are not JSON objects with a string \"text\"": counts.get("malformed_lines", 0),
               "lines over 8 MiB": counts.get("overlong_lines", 0)}
    for what, count in skipped.items():
        if count:
            log(f"data: skipped {count} {what}")
    if data.num_train_examples < tc.batch_size:
        raise DataError(f"corpus too small: {where} holds {data.num_train_examples} training examples, fewer than "
                        f"one batch of batch_size={tc.batch_size}")
    examples = f"{data.num_train_examples} training / {data.num_eval_examples} eval examples"
    if data.packing:
        packing = data.manifest["packing"]
        examples = (f"{packing['train_samples']} training / {packing['eval_samples']} eval examples packed into "
                    f"{data.num_train_examples} / {data.num_eval_examples} rows of up to {data.packing}")
    fill = counts.get("fill", {}).get("train")
    log(f"data: {examples} ({loader.steps_per_epoch(data, tc.batch_size)} steps per epoch), vocab "
        f"{data.vocab_size}, seq_len {data.seq_len}" + ("" if fill is None else f", fill {fill:.1%}")
        + f"; NSP pairs made with seed {data.pair_seed} (pair_seed), order and masking from --seed {tc.seed}")
    return data


def _open_given(tc: TrainConfig, root: Path, out: Path) -> PreparedSet:
    """`--data DIR`: checked against the run's tokenizer (`--vocab`, or the run's own on `--resume`), or its own
    tokenizer copied to <out>/tokenizer.json."""
    given = out / TOKENIZER if tc.resume else tc.vocab
    data = PreparedSet(root, seq_len=tc.seq_len,
                       tokenizer=load_or_train_tokenizer(given) if given is not None else None, pack=tc.packing)
    if tc.vocab_size is not None and tc.vocab_size != data.vocab_size:
        raise DataError(f"vocab_size={tc.vocab_size} was given, but {root / MANIFEST} holds the ids of a "
                        f"{data.vocab_size}-token tokenizer (leave --vocab-size out with a prepared set)")
    if distributed.is_main() and not tc.resume:
        _write_atomic(out / TOKENIZER, (root / TOKENIZER).read_bytes())
    return data


def _prepare_text(tc: TrainConfig, out: Path, log: Callable) -> PreparedSet:
    """Raw text: the tokenizer (`--vocab`, the run's own on `--resume`, or trained on the text) in <out>, then the
    text prepared with it into the cache, or found there. Process 0 first; an error there stops every process."""
    paths = tc.data if tc.data is not None else builtin_corpus()
    if tc.data is None:
        log(f"data: built-in corpus (Python standard library docs) at {paths}")
    main, failed, data = distributed.is_main(), None, None
    if main:
        try:
            vocab = out / TOKENIZER if tc.resume else tc.vocab
            load_or_train_tokenizer(vocab, paths, tc.vocab_size or DEFAULT_VOCAB_SIZE, save_dir=out)
            data = _cached(tc, resolve_paths(paths), out / TOKENIZER, log)
        except Exception as e:  # noqa: BLE001 - re-raised below, after the other processes have heard of it
            failed = e
    if distributed.any_process(failed is not None):  # WordPiece training is not reproducible: process 0 trains
        raise failed if failed is not None else DataError("process 0 could not prepare the data (its message "
                                                          "says why)")
    if not main:
        data = _cached(tc, resolve_paths(paths), out / TOKENIZER, log)
    return data


def _cached(tc: TrainConfig, files: list[Path], tokenizer_file: Path, log: Callable) -> PreparedSet:
    """The prepared set of `files` with the tokenizer in `tokenizer_file` in the cache: opened if it is there and
    whole, else prepared (again) under a lock, so concurrent runs on one machine prepare it once."""
    tokenizer = load_or_train_tokenizer(tokenizer_file)
    if tc.vocab is not None and tc.vocab_size is not None and tokenizer.get_vocab_size(True) != tc.vocab_size:
        raise ValueError(f"--vocab {tc.vocab} has {tokenizer.get_vocab_size(True)} tokens but vocab_size="
                         f"{tc.vocab_size} was fixed")
    config = DataConfig(paths=tuple(str(f) for f in files), seq_len=tc.seq_len, seed=tc.seed,
                        vocab=str(tokenizer_file), pack=tc.packing)
    key = dict(format=FORMAT, version=VERSION, corpus_sha256=corpus_digest(files),
               tokenizer_sha256=tokenizer_digest(tokenizer), seq_len=config.seq_len, pair_seed=config.seed,
               short_seq_prob=config.short_seq_prob, eval_fraction=config.eval_fraction, chunk_bytes=CHUNK_BYTES)
    if config.pack:  # unpacked: the key (and cache entry) of earlier versions
        key.update(pack=config.pack, pack_window=PACK_WINDOW)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    root = default_cache_dir() / CACHE_SUBDIR / digest[:32]
    with _locked(root.with_name(root.name + ".lock")):
        if (root / MANIFEST).is_file():
            try:
                data = PreparedSet(root, seq_len=tc.seq_len, tokenizer=tokenizer, pack=tc.packing)
                log(f"data: prepared before, opened from the cache: {root}")
                return data
            except DataError as e:
                log(f"data: the cached set is damaged ({e}): preparing it again")
        log(f"data: preparing the text into {root} (once: later runs on the same text, tokenizer, seq_len and seed "
            "open it)")
        small = sum(f.stat().st_size for f in files) <= CHUNK_BYTES  # one range to tokenize: no worker processes
        prepare(config, root, workers=0 if small else None, progress=tc.progress and distributed.is_main(),
                log=log, restart=True)
    return PreparedSet(root, seq_len=tc.seq_len, tokenizer=tokenizer, pack=tc.packing)


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock on `path` (created) while the block runs."""
    import fcntl
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        f = open(path, "a")
    except OSError as e:
        raise DataError(f"the prepared-data cache {path.parent} cannot be written ({e.strerror or e}): set "
                        "$JAXFORMER_CACHE_DIR to a writable directory, or prepare the corpus with python -m "
                        "jaxformer.prepare and pass --data DIR") from e
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def train_batches(tc: TrainConfig, data: PreparedSet, block: tuple[int, int], ckpt=None, step: int = 0,
                  log: Callable = print) -> loader.TrainBatches:
    """This process's rows (`block` = (i, k), `distributed.batch_block`) of the run's batches from `step` on: with a
    checkpoint at `step` (`ckpt`), from the loader state saved with it, which must be of this run's data stream
    (DataError naming what differs). Grain's `tc.data_workers` worker processes start at once."""
    state = None
    if ckpt is not None and step:
        try:
            meta = ckpt.read_meta(step)
        except Exception:  # noqa: BLE001 - a damaged checkpoint: the restore falls back to an older one (reopened)
            meta = None
        if meta is not None and "data_state" in meta:
            state = json.dumps(meta["data_state"]).encode()
        elif meta is not None:
            log(f"checkpoint {step} holds no data-loader state (an earlier version of jaxformer): the batches go on "
                f"from step {step} in this version's order")
    return loader.train_batches(data, tc.batch_size, tc.seed, start_step=step, block=block[0], n_blocks=block[1],
                                max_predictions=tc.max_predictions, workers=tc.data_workers, state=state)


def checkpoint_meta(batches: loader.TrainBatches, step: int) -> dict:
    """What a checkpoint at `step` stores of the data: the loader state to continue from."""
    return dict(data_state=json.loads(batches.state(step)))

