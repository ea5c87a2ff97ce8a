"""A prepared pre-training set on disk (written by ``jaxformer.prepare``, read by ``jaxformer.loader``).

Layout of a prepared directory::

    manifest.json        what was prepared: settings, tokenizer digest, input digest, counts, shards + checksums
    tokenizer.json       the tokenizer whose ids the shards hold
    train-00000.npy ...  rows of the training split, ``rows_per_shard`` per file (the last may hold fewer)
    eval-00000.npy ...   rows of the held-out split

Each shard is a plain ``.npy`` file of fixed-size structured rows (``examples.row_dtype``: the assembled ``[CLS] A
[SEP] B [SEP]`` ids padded to ``seq_len``, then per segment the lengths of A and B and the NSP label): row i is at a
fixed offset, so a batch is one positioned read per row with no decoding (ArrayRecord's per-record reader was ~60x
slower per batch, benchmarks/results/data.md, Format), and the page cache is shared by every process and worker
of a machine. Row i of a split is NSP pair i of ``examples.make_pairs`` over that split's documents.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from .corpus import DataError, PathLike, SpecialIds, special_token_ids
from .examples import random_replacement_ids, row_dtype

FORMAT, VERSION = "jaxformer-prepared", 1
MANIFEST, TOKENIZER = "manifest.json", "tokenizer.json"
SPLITS = ("train", "eval")


def shard_name(split: str, index: int) -> str:
    return f"{split}-{index:05d}.npy"


def sha256_file(path: PathLike, block: int = 1 << 24) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):  # hashlib releases the GIL on large blocks: threads hash in parallel
            h.update(chunk)
    return h.hexdigest()


def tokenizer_digest(tokenizer: Tokenizer) -> str:
    """sha256 of the tokenizer's serialized form (its vocabulary, normalizer and pre-tokenizer)."""
    return hashlib.sha256(tokenizer.to_str().encode()).hexdigest()


def write_atomic(path: Path, write) -> None:
    """``write(tmp_path)``, then rename into place: a reader never sees a half-written file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_json(path: Path, obj) -> None:
    write_atomic(path, lambda tmp: tmp.write_text(json.dumps(obj, indent=1) + "\n", encoding="utf-8"))


def _write_with(path: Path, save) -> None:
    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:  # a file object: numpy would append .npy/.npz to the temporary name
            save(f)
    write_atomic(path, write)


def write_shard(path: Path, rows: np.ndarray) -> str:
    """Write one shard atomically; returns its sha256."""
    _write_with(path, lambda f: np.save(f, rows, allow_pickle=False))
    return sha256_file(path)


def savez(path: Path, **arrays) -> None:
    _write_with(path, lambda f: np.savez(f, **arrays))


def read_manifest(root: PathLike) -> dict:
    path = Path(root).expanduser() / MANIFEST
    if not path.is_file():
        hint = " (an unfinished preparation: run jaxformer.prepare again to finish it)" \
            if (path.parent / ".prepare").is_dir() else ""
        raise DataError(f"{path} does not exist: {path.parent} is not a prepared data directory{hint}")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise DataError(f"{path} is not a readable manifest: {e}") from e
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise DataError(f"{path} is not a {FORMAT} manifest")
    if manifest.get("version") != VERSION:
        raise DataError(f"{path} has format version {manifest.get('version')!r}; this code reads version {VERSION}")
    return manifest


def verify_shards(root: Path, manifest: dict, checksums: bool, threads: int = 8) -> None:
    """Every shard the manifest lists exists with its size (and, with ``checksums``, its sha256); DataError naming
    the first shard that does not."""
    shards = [s for split in SPLITS for s in manifest["shards"][split]]
    for s in shards:
        path = root / s["file"]
        if not path.is_file():
            raise DataError(f"shard {path} listed in {root / MANIFEST} is missing")
        if path.stat().st_size != s["bytes"]:
            raise DataError(f"shard {path} has {path.stat().st_size} bytes, {root / MANIFEST} says {s['bytes']} "
                            "(truncated or replaced)")
    if checksums:
        with ThreadPoolExecutor(threads) as pool:
            digests = list(pool.map(lambda s: sha256_file(root / s["file"]), shards))
        for s, digest in zip(shards, digests):
            if digest != s["sha256"]:
                raise DataError(f"shard {root / s['file']} is corrupt: its sha256 {digest[:16]}... differs from "
                                f"{s['sha256'][:16]}... in {root / MANIFEST}")


class ShardedRows:
    """Random access to the rows of one split (Grain's ``RandomAccessDataSource`` protocol: ``len`` and
    ``[index]``; ``read(indices)`` gathers many at once). Rows are read with ``pread``, not a memory map: a map of
    randomly read rows makes the process's resident size grow with the shard pages the kernel maps around each read
    (page cache either way, but counted as the process's memory). Shards are opened on first use in each process;
    pickling (to Grain's worker processes) carries the file list only."""

    def __init__(self, root: Path, shards: list[dict], rows_per_shard: int, dtype: np.dtype):
        self.root, self.files, self.rows = root, [s["file"] for s in shards], [s["rows"] for s in shards]
        self.rows_per_shard, self.dtype = rows_per_shard, dtype
        self._len = sum(self.rows)
        self._open_files: list[tuple[io.FileIO, int]] | None = None  # (file, offset of row 0) per shard

    def __len__(self) -> int:
        return self._len

    def __getstate__(self):
        return {**self.__dict__, "_open_files": None}

    def _open(self) -> list[tuple[io.FileIO, int]]:
        if self._open_files is None:
            opened = []
            for name, rows in zip(self.files, self.rows):
                path = self.root / name
                try:
                    with open(path, "rb") as f:
                        version = np.lib.format.read_magic(f)
                        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                            np.lib.format.read_array_header_2_0
                        shape, _, dtype = read_header(f)
                        start = f.tell()
                    size = path.stat().st_size
                except (OSError, ValueError) as e:
                    raise DataError(f"shard {path} cannot be read: {e}") from e
                if dtype != self.dtype or shape != (rows,) or size != start + rows * dtype.itemsize:
                    raise DataError(f"shard {path} holds {shape} rows of {dtype} in {size} bytes; the manifest "
                                    f"says ({rows},) of {self.dtype}")
                opened.append((open(path, "rb", buffering=0), start))  # closed when collected
            self._open_files = opened
        return self._open_files

    def read(self, indices) -> np.ndarray:
        indices = np.asarray(indices, np.int64)
        if indices.size and (indices.min() < 0 or indices.max() >= self._len):
            raise IndexError(f"row index out of range 0..{self._len - 1}")
        files, size = self._open(), self.dtype.itemsize
        shard, offset = np.divmod(indices, self.rows_per_shard)
        raw = b"".join(os.pread(files[s][0].fileno(), size, files[s][1] + o * size)
                       for s, o in zip(shard.tolist(), offset.tolist()))
        if len(raw) != size * len(indices):
            raise DataError(f"a shard under {self.root} is shorter than its manifest entry (truncated after opening)")
        return np.frombuffer(raw, self.dtype)

    def __getitem__(self, index: int) -> np.ndarray:
        return self.read([index])[0]


class PreparedSet:
    """An opened prepared directory: its manifest (checked against the run), tokenizer and rows.

    ``seq_len``, ``tokenizer`` (a ``tokenizers.Tokenizer``) and ``pack`` (0: rows of one sample; K: packed rows of up
    to K, jaxformer/packing.py) given: DataError unless the manifest agrees.
    ``verify``: "size" checks that every shard exists with its recorded size (instant; catches missing and
    truncated files), "checksum" also hashes every shard (seconds per GB), "none" checks nothing.
    """

    def __init__(self, root: PathLike, seq_len: int | None = None, tokenizer: Tokenizer | None = None,
                 verify: str = "size", pack: int | None = None):
        if verify not in ("none", "size", "checksum"):
            raise DataError(f"verify={verify!r}: expected 'none', 'size' or 'checksum'")
        self.root = Path(root).expanduser()
        self.manifest = m = read_manifest(self.root)
        where = self.root / MANIFEST
        if seq_len is not None and m["seq_len"] != seq_len:
            raise DataError(f"{where} was prepared with seq_len {m['seq_len']}; the run asks for seq_len {seq_len}")
        tok_path = self.root / TOKENIZER
        try:
            self.tokenizer = Tokenizer.from_file(str(tok_path))
        except Exception as e:  # tokenizers raises a plain Exception on a missing or bad file
            raise DataError(f"cannot load the prepared tokenizer {tok_path}: {e}") from e
        if tokenizer_digest(self.tokenizer) != m["tokenizer"]["sha256"]:
            raise DataError(f"{tok_path} differs from the tokenizer recorded in {where} (sha256 mismatch)")
        if tokenizer is not None and tokenizer_digest(tokenizer) != m["tokenizer"]["sha256"]:
            raise DataError(f"{where} was prepared with a different tokenizer ({m['vocab_size']} tokens, sha256 "
                            f"{m['tokenizer']['sha256'][:16]}...) than the run's ({tokenizer.get_vocab_size(True)} "
                            f"tokens, sha256 {tokenizer_digest(tokenizer)[:16]}...)")
        self.packing = (m.get("packing") or {}).get("samples_per_row", 0)  # 0: one sample a row
        if m["segments_per_row"] != (self.packing or 1):
            raise DataError(f"{where} has {m['segments_per_row']} segments per row and packing {m.get('packing')}")
        if pack is not None and pack != self.packing:
            def setting(k):
                return f"pack_samples={k} (--pack)" if k else "pack=False (one sample a row)"
            raise DataError(f"{where} was prepared with {setting(self.packing)}; the run asks for {setting(pack)}: "
                            "prepare the data with the run's packing setting, or use the data's")
        if verify != "none":
            verify_shards(self.root, m, checksums=verify == "checksum")
        self.seq_len, self.vocab_size = m["seq_len"], m["vocab_size"]
        self.special: SpecialIds = special_token_ids(self.tokenizer)
        self.random_ids = random_replacement_ids(self.vocab_size, self.special,
                                                 self.tokenizer.get_added_tokens_decoder())
        dtype = row_dtype(m["seq_len"], np.dtype(m["token_dtype"]), m["segments_per_row"])
        self.rows = {split: ShardedRows(self.root, m["shards"][split], m["rows_per_shard"], dtype)
                     for split in SPLITS}
        for split in SPLITS:
            if len(self.rows[split]) == 0:
                raise DataError(f"{where} lists no {split} examples: the prepared set is empty")

    num_train_examples = property(lambda self: len(self.rows["train"]))  # rows (packed: of several samples)
    num_eval_examples = property(lambda self: len(self.rows["eval"]))
    pair_seed = property(lambda self: self.manifest["pair_seed"])
