"""Prepare pre-training data once: read and tokenize a corpus on all cores, build the NSP pairs, write shards.

    python -m jaxformer.prepare --data corpus/ --vocab vocab.txt --seq-len 128 --out prepared/

Stages (each resumable: an interrupted run picks up where it stopped, a finished one is verified and skipped):

1. tokenize: the corpus is cut into byte ranges at document boundaries (``chunk_bytes`` each) and worker processes
   read and tokenize them in parallel into ``.prepare/piece-*.npz`` (token ids, sentence and document sizes).
2. concatenate: the pieces, in corpus order, into one flat token array ``.prepare/tokens.npy``.
3. pairs: the held-out split and the NSP pairs of both splits (``examples.make_pairs``: one random stream over the
   documents in order, so this stage is sequential and the pairs depend on ``seed``, recorded as ``pair_seed``);
   with ``pack`` = K, which pairs share a row (``packing.pack``: up to K a row, best-fit decreasing).
4. shards: worker processes assemble the rows and write ``train-*.npy`` / ``eval-*.npy`` (prepared.py) with a
   checksum each; last, ``manifest.json`` is written and ``.prepare/`` removed.

The result depends only on the corpus, the tokenizer, seq_len, seed and pack (and the chunk and shard sizes, which
only cut it differently): masking is applied at batch time (``jaxformer.loader``). ``train.py`` prepares raw text this way
on the fly, into a cache (jaxformer/run_data.py).
"""
from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import multiprocessing
import os
import random
import shutil
import sys
import time
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from .corpus import (MAX_LINE_BYTES, CorpusStats, DataError, PathLike, builtin_corpus, iter_file_documents,
                     load_or_train_tokenizer, resolve_paths, special_token_ids)
from .data import DataConfig, pack_ok
from .examples import Pairs, assemble_rows, eval_documents, make_pairs, row_dtype, token_dtype
from .packing import PACK_WINDOW, assemble_packed_rows, default_samples_per_row, pack, packed_pairs
from .prepared import (FORMAT, MANIFEST, SPLITS, TOKENIZER, VERSION, read_manifest, savez, sha256_file,
                       shard_name, tokenizer_digest, write_atomic, write_json, write_shard)

WORK = ".prepare"
CHUNK_BYTES = 32 << 20  # text per tokenize task: large enough to amortise a task, small enough to balance cores
SHARD_BYTES = 128 << 20  # rows per shard file (default): ~500k rows at seq_len 128


# ----------------------------------------------------------------------------- reading byte ranges
def _to_next_line(f) -> None:
    while (part := f.readline(1 << 20)) and not part.endswith(b"\n"):
        pass


def _is_blank(raw: bytes) -> bool:
    """Whether the reader (corpus.iter_file_documents) sees ``raw`` as a blank line, i.e. a document break."""
    try:
        return not raw.decode("utf-8").lstrip("\ufeff").strip()
    except UnicodeDecodeError:
        return False


def byte_ranges(path: Path, chunk_bytes: int) -> list[tuple[int, int]]:
    """[start, end) ranges covering ``path``, each cut right after a document boundary (a blank line; for .jsonl any
    line end), so reading the ranges one by one (``corpus.iter_file_documents(path, stats, start, end)``) yields
    the file's documents exactly. Lines are read in bounded pieces: a file without line ends is not loaded whole."""
    size, jsonl, cuts = path.stat().st_size, path.suffix == ".jsonl", [0]
    with open(path, "rb") as f:
        while cuts[-1] + chunk_bytes < size:
            f.seek(cuts[-1] + chunk_bytes)
            _to_next_line(f)
            while not jsonl and (line := f.readline(MAX_LINE_BYTES + 1)):
                if not line.endswith(b"\n") and len(line) > MAX_LINE_BYTES:
                    _to_next_line(f)  # an overlong line: skipped by the reader, never a break
                elif _is_blank(line):
                    break  # just after the next blank line
            if f.tell() >= size:
                break
            cuts.append(f.tell())
    return list(zip(cuts, cuts[1:] + [size]))


# ----------------------------------------------------------------------------- worker processes
_worker: dict = {}


def _init_worker(tokenizer_json: str, tokens_path: str, own_process: bool = True) -> None:
    if own_process:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core per worker process, no nested thread pools
    from tokenizers import Tokenizer
    tok = Tokenizer.from_str(tokenizer_json)
    tok.encode_special_tokens = True  # literal "[SEP]" etc. in the text is plain text, not structure tokens
    _worker.update(tokenizer=tok, dtype=token_dtype(tok.get_vocab_size(with_added_tokens=True)),
                   tokens_path=tokens_path)


def _tokenize_piece(task) -> int:
    """Tokenize one byte range into ``out``: sentences that normalize to nothing are dropped, and documents left
    empty."""
    path, start, end, out = task
    stats, digest = CorpusStats(), hashlib.sha256()
    docs = list(iter_file_documents(Path(path), stats, start, end, digest))
    sentences = [s for doc in docs for s in doc]
    tokens, lens = [], []
    for i in range(0, len(sentences), 8192):  # to numpy batch by batch: Python lists of ids take ~36 bytes a token
        ids = [e.ids for e in _worker["tokenizer"].encode_batch_fast(sentences[i:i + 8192], add_special_tokens=False)]
        lens.append(np.array([len(x) for x in ids], np.int64))
        tokens.append(np.fromiter(itertools.chain.from_iterable(ids), _worker["dtype"], int(lens[-1].sum())))
    lens = np.concatenate(lens) if lens else np.zeros(0, np.int64)
    doc_of = np.repeat(np.arange(len(docs)), [len(d) for d in docs])
    doc_sizes = np.bincount(doc_of[lens > 0], minlength=len(docs))
    meta = dict(undecodable_lines=stats.undecodable_lines, malformed_lines=stats.malformed_lines,
                overlong_lines=stats.overlong_lines, documents=len(docs), sentences=len(sentences),
                tokens=int(lens.sum()), bytes=end - start, sha256=digest.hexdigest())
    savez(Path(out), tokens=np.concatenate(tokens) if tokens else np.zeros(0, _worker["dtype"]),
          sent_lens=lens[lens > 0], doc_sizes=doc_sizes[doc_sizes > 0], meta=json.dumps(meta))
    return end - start


def _write_rows(task) -> tuple[str, str]:
    """Assemble and write one shard from its slice of the pairs (packed: (rows, K) arrays, ``packing.packed_pairs``)."""
    name, out, pairs, seq_len, special, dtype = task
    tokens = np.load(_worker["tokens_path"], mmap_mode="r")
    assemble = assemble_packed_rows if pairs.nsp.ndim == 2 else assemble_rows
    rows = np.concatenate([assemble(tokens, Pairs(*(c[i:i + 65536] for c in pairs)), seq_len, special, dtype)
                           for i in range(0, len(pairs.nsp), 65536)])
    return name, write_shard(Path(out), rows)


class _InProcess:
    """The pool's interface, running every task here (``workers=0``: tests, debugging)."""

    def __init__(self, *init_args):
        _init_worker(*init_args, own_process=False)

    imap_unordered = staticmethod(map)  # lazy: each result is recorded before the next task runs
    map = staticmethod(lambda fn, tasks: [fn(t) for t in tasks])

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _worker.clear()


# ----------------------------------------------------------------------------- the stages
def _plan(config: DataConfig, files: list[Path], tokenizer, chunk_bytes: int, rows_per_shard: int) -> dict:
    """Everything the output depends on; a resumed or repeated run must match it."""
    plan = dict(seq_len=config.seq_len, pair_seed=config.seed, short_seq_prob=config.short_seq_prob,
                eval_fraction=config.eval_fraction, tokenizer_sha256=tokenizer_digest(tokenizer),
                files=[[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns] for f in files],
                chunk_bytes=chunk_bytes, rows_per_shard=rows_per_shard)
    # Unpacked: the plan of earlier versions (a directory they prepared is recognised as finished).
    return dict(plan, pack=config.pack, pack_window=PACK_WINDOW) if config.pack else plan


def _mismatch(old: dict, new: dict) -> str:
    return ", ".join("the input files (names, sizes or times)" if k == "files" else f"{k} {old.get(k)!r} (now "
                     f"{new.get(k)!r})" for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k))


def _tokenize(pool, work: Path, files: list[Path], chunk_bytes: int, dtype: np.dtype, progress: bool) -> dict:
    """Stages 1 and 2: ``work/tokens.npy`` (all token ids in corpus order) and ``work/corpus.npz`` (sentence and
    document sizes, counts); returns the counts."""
    if (work / "corpus.npz").exists():
        with np.load(work / "corpus.npz") as z:
            return json.loads(str(z["counts"]))
    ranges = [(f, a, b) for f in files for a, b in byte_ranges(f, chunk_bytes)]
    pieces = [work / f"piece-{i:06d}.npz" for i in range(len(ranges))]
    todo = [(str(f), a, b, str(pieces[i])) for i, (f, a, b) in enumerate(ranges) if not pieces[i].exists()]
    with tqdm(total=sum(b - a for _, a, b, _ in todo), unit="B", unit_scale=True, desc="tokenize",
              disable=not progress or not todo) as bar:
        for n in pool.imap_unordered(_tokenize_piece, todo):
            bar.update(n)
    metas, sent_lens, doc_sizes = [], [], []
    for p in pieces:
        with np.load(p) as z:
            metas.append(json.loads(str(z["meta"])))
            sent_lens.append(z["sent_lens"])
            doc_sizes.append(z["doc_sizes"])
    counts = {k: sum(m.get(k, 0) for m in metas) for k in ("bytes", "documents", "sentences", "tokens",
                                                           "undecodable_lines", "malformed_lines", "overlong_lines")}
    counts.update(files=len(files), sha256=hashlib.sha256(b"".join(bytes.fromhex(m["sha256"]) for m in metas))
                  .hexdigest())
    if counts["sentences"] == 0:
        raise DataError(f"corpus {', '.join(map(str, files))} contains no sentences")

    def write_tokens(tmp: Path) -> None:  # plain writes: a writable memory map would count as this process's memory
        with open(tmp, "wb") as f:
            np.lib.format.write_array_header_2_0(f, dict(descr=np.lib.format.dtype_to_descr(dtype),
                                                         fortran_order=False, shape=(counts["tokens"],)))
            for p in pieces:
                with np.load(p) as z:
                    f.write(z["tokens"].tobytes())
    write_atomic(work / "tokens.npy", write_tokens)
    savez(work / "corpus.npz", sent_lens=np.concatenate(sent_lens), doc_sizes=np.concatenate(doc_sizes),
        counts=json.dumps(counts))
    for p in pieces:
        p.unlink()
    return counts


def _pairs(work: Path, config: DataConfig, where: str) -> tuple[dict[str, Pairs], int]:
    """Stage 3: the eval split and the NSP pairs of both splits (sequential: one random stream); the pairs and
    the number of eval documents. Packed (``config.pack`` = K): each split's pairs as (rows, K) arrays, zeros in
    unused slots (``packing.packed_pairs``)."""
    if (work / "pairs.npz").exists():
        with np.load(work / "pairs.npz") as z:
            return {s: Pairs(*(z[f"{s}_{k}"] for k in Pairs._fields)) for s in SPLITS}, int(z["eval_documents"])
    with np.load(work / "corpus.npz") as z:
        sent_starts = np.concatenate([[0], np.cumsum(z["sent_lens"])])
        doc_starts = np.concatenate([[0], np.cumsum(z["doc_sizes"])])
    is_eval = eval_documents(len(doc_starts) - 1, config.eval_fraction, where)
    rng = random.Random(config.seed)  # one stream: the training split's pairs first, then the held-out split's
    pairs = {s: make_pairs(sent_starts, doc_starts, np.flatnonzero(docs), rng, config.seq_len,
                           config.short_seq_prob) for s, docs in (("train", ~is_eval), ("eval", is_eval))}
    if config.pack:
        pairs = {s: packed_pairs(p, pack(p.la.astype(np.int64) + p.lb + 3, config.seq_len, config.pack,
                                         config.seed)) for s, p in pairs.items()}
    savez(work / "pairs.npz", eval_documents=int(is_eval.sum()),
          **{f"{s}_{k}": v for s, p in pairs.items() for k, v in p._asdict().items()})
    return pairs, int(is_eval.sum())


def _shards(pool, out: Path, work: Path, pairs: dict[str, Pairs], done: dict[str, str], rows_per_shard: int,
            seq_len: int, special, rdtype: np.dtype, progress: bool) -> tuple[dict[str, list[str]], int]:
    """Stage 4: write the shards not in ``done`` (file -> sha256, updated and logged in ``work/shards.json`` as each
    finishes); the shard names of each split and how many were written."""
    names, tasks = {s: [] for s in SPLITS}, []
    for split, p in pairs.items():
        for j, a in enumerate(range(0, len(p.nsp), rows_per_shard)):
            names[split].append(name := shard_name(split, j))
            if name not in done:
                tasks.append((name, str(out / name), Pairs(*(c[a:a + rows_per_shard] for c in p)), seq_len,
                              special, rdtype))
    with tqdm(total=len(tasks), unit="shard", desc="shards", disable=not progress or not tasks) as bar:
        for name, digest in pool.imap_unordered(_write_rows, tasks):
            done[name] = digest
            write_json(work / "shards.json", done)
            bar.update(1)
    return names, len(tasks)


def prepare(config: DataConfig, out: PathLike, workers: int | None = None, rows_per_shard: int | None = None,
            chunk_bytes: int = CHUNK_BYTES, progress: bool = True, log=print, restart: bool = False) -> dict:
    """Prepare ``config``'s corpus (paths None: the built-in corpus) with its tokenizer (``config.vocab``, or one
    trained with ``config.vocab_size`` and kept in ``out``) into ``out``; returns the manifest. ``workers``: worker
    processes (default: all cores; 0: everything in this process). DataError for bad input, or when ``out`` holds
    another preparation; with ``restart``, an unfinished one with other settings is discarded instead (a cache entry,
    whose name already fixes what its result holds)."""
    t_start = time.perf_counter()
    out = Path(out).expanduser()
    if config.seq_len > 65535:
        raise DataError(f"seq_len={config.seq_len}: prepared rows store segment lengths as uint16 (at most 65535)")
    for name, value, low in (("workers", workers, 0), ("rows_per_shard", rows_per_shard, 1),
                             ("chunk_bytes", chunk_bytes, 1)):
        if value is not None and (not isinstance(value, int) or value < low):
            raise DataError(f"{name}={value!r} must be an integer >= {low}")
    workers = (os.cpu_count() or 1) if workers is None else workers
    files = resolve_paths(config.paths if config.paths is not None else builtin_corpus(config.cache_dir))
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"out={str(out)!r} cannot be created: {e.strerror or e}") from e
    tokenizer = load_or_train_tokenizer(config.vocab, files, config.vocab_size, config.lowercase, save_dir=out)
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    dtype = token_dtype(vocab_size)
    rdtype = row_dtype(config.seq_len, dtype, config.pack or 1)
    rows_per_shard = rows_per_shard or max(1, SHARD_BYTES // rdtype.itemsize)
    plan = _plan(config, files, tokenizer, chunk_bytes, rows_per_shard)

    # What earlier runs finished: shard file -> sha256, from a manifest or an unfinished run's log.
    work, old, expected = out / WORK, None, {}
    if restart:  # what is there with other settings goes
        if (out / MANIFEST).exists() and read_manifest(out).get("plan") != plan:
            (out / MANIFEST).unlink()
        if (work / "plan.json").exists() and json.loads((work / "plan.json").read_text()) != plan:
            shutil.rmtree(work)
    if (out / MANIFEST).exists():
        old = read_manifest(out)
        if old["plan"] != plan:
            raise DataError(f"{out} already holds data prepared differently: {_mismatch(old['plan'], plan)}; "
                            "use another --out or delete it")
        expected = {s["file"]: s["sha256"] for split in SPLITS for s in old["shards"][split]}
    if (work / "plan.json").exists():
        if (unfinished := json.loads((work / "plan.json").read_text())) != plan:
            raise DataError(f"{work} holds an unfinished preparation with other settings: "
                            f"{_mismatch(unfinished, plan)}; delete {work} to start over")
        if (work / "shards.json").exists():
            expected.update(json.loads((work / "shards.json").read_text()))

    init_args = (tokenizer.to_str(), str(work / "tokens.npy"))
    # spawn: no fork of a process whose tokenizer may run threads
    pool = multiprocessing.get_context("spawn").Pool(workers, _init_worker, init_args) if workers else \
        _InProcess(*init_args)
    with pool:
        present = [n for n in expected if (out / n).is_file()]
        done = {n: d for n, d in zip(present, pool.map(sha256_file, [str(out / n) for n in present]))
                if d == expected[n]}
        if old is not None and len(done) == len(expected):
            log(f"{out} is already prepared: all {len(done)} shards verified")
            return old
        (out / MANIFEST).unlink(missing_ok=True)  # a shard is bad: the directory is unfinished until rebuilt
        work.mkdir(exist_ok=True)
        write_json(work / "plan.json", plan)
        write_json(work / "shards.json", done)
        seconds = {}
        t = time.perf_counter()
        counts = _tokenize(pool, work, files, chunk_bytes, dtype, progress)
        seconds["tokenize"], t = time.perf_counter() - t, time.perf_counter()
        pairs, counts["eval_documents"] = _pairs(work, config, f"corpus {', '.join(map(str, files))}")
        seconds["pairs"], t = time.perf_counter() - t, time.perf_counter()

        names, written = _shards(pool, out, work, pairs, done, rows_per_shard, config.seq_len,
                                 special_token_ids(tokenizer), rdtype, progress)
        seconds["shards"] = time.perf_counter() - t

    shards = {split: [dict(file=n, rows=min(rows_per_shard, len(pairs[split].nsp) - j * rows_per_shard),
                           bytes=(out / n).stat().st_size, sha256=done[n]) for j, n in enumerate(names[split])]
              for split in SPLITS}
    # Rows, samples (NSP pairs) and the fill: real (non-padding) tokens over the rows' token slots.
    counts.update(train_examples=len(pairs["train"].nsp), eval_examples=len(pairs["eval"].nsp))
    samples = {s: int((p.la > 0).sum()) for s, p in pairs.items()}
    fill = {s: round(float((np.where(p.la > 0, p.la.astype(np.int64) + p.lb + 3, 0)).sum())
                     / max(1, config.seq_len * len(p.nsp)), 4) for s, p in pairs.items()}
    counts.update(fill=fill)
    packing = dict(samples_per_row=config.pack, window=PACK_WINDOW, algorithm="best-fit decreasing",
                   train_samples=samples["train"], eval_samples=samples["eval"]) if config.pack else None
    inputs = dict(files=[dict(path=f, bytes=b) for f, b, _ in plan["files"]], sha256=counts.pop("sha256"))
    manifest = dict(format=FORMAT, version=VERSION, seq_len=config.seq_len, segments_per_row=config.pack or 1,
                    packing=packing,
                    token_dtype=dtype.name, row_bytes=rdtype.itemsize, vocab_size=vocab_size,
                    tokenizer=dict(file=TOKENIZER, sha256=plan["tokenizer_sha256"]), pair_seed=config.seed,
                    short_seq_prob=config.short_seq_prob, eval_fraction=config.eval_fraction, inputs=inputs,
                    counts=counts, rows_per_shard=rows_per_shard, shards=shards, plan=plan,
                    created=time.strftime("%Y-%m-%dT%H:%M:%S%z"), workers=workers,
                    seconds={k: round(v, 2) for k, v in seconds.items()})
    write_json(out / MANIFEST, manifest)
    listed = {n for s in SPLITS for n in names[s]}
    for split in SPLITS:  # shards of an earlier, larger attempt
        for stale in out.glob(f"{split}-[0-9][0-9][0-9][0-9][0-9].npy"):
            if stale.name not in listed:
                stale.unlink()
    shutil.rmtree(work)
    rows = f"{counts['train_examples']} training / {counts['eval_examples']} eval examples"
    if packing:
        rows = (f"{samples['train']} training / {samples['eval']} eval examples packed into {counts['train_examples']}"
                f" / {counts['eval_examples']} rows of up to {config.pack}")
    log(f"prepared {rows} from {counts['bytes'] / 1e6:.1f} MB of text ({counts['documents']} documents, "
        f"{counts['tokens']} tokens) into {out} in {time.perf_counter() - t_start:.1f}s ({written} of {len(listed)} "
        f"shards written); fill {fill['train']:.1%} of the training rows' tokens")
    return manifest


# ----------------------------------------------------------------------------- command line
def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m jaxformer.prepare", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", nargs="+", default=None,
                   help="corpus: file(s), directory or glob of BERT-format text or .jsonl; default: built-in corpus")
    p.add_argument("--vocab", default=None, help="BERT vocab.txt or tokenizer.json; default: train a WordPiece "
                                                 "tokenizer on the corpus (kept as <out>/tokenizer.json)")
    p.add_argument("--vocab-size", type=int, default=4096, help="size of the tokenizer to train")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per sequence")
    p.add_argument("--seed", type=int, default=0, help="seed of the NSP pairs and the packing (recorded as pair_seed)")
    p.add_argument("--pack", action="store_true", help="pack several samples into each row (train.py --pack)")
    p.add_argument("--pack-samples", type=int, default=None, metavar="K",
                   help="with --pack: at most K samples per row (default --seq-len / 16)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--workers", type=int, default=None,
                   help="worker processes (default: all cores; 0: all work in this process)")
    p.add_argument("--rows-per-shard", type=int, default=None,
                   help=f"rows per shard file (default: {SHARD_BYTES >> 20} MiB of rows)")
    p.add_argument("--verify", action="store_true",
                   help="only check the prepared directory --out: every shard's size and checksum")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    a = p.parse_args(argv)
    try:
        if a.verify:
            from .prepared import PreparedSet
            data = PreparedSet(a.out, verify="checksum")
            print(f"{a.out}: {data.num_train_examples} training / {data.num_eval_examples} eval examples, "
                  f"all shards verified")
            return 0
        if a.pack_samples is not None and not a.pack:
            raise ValueError(f"pack_samples={a.pack_samples} needs --pack")
        if a.pack_samples is not None and not pack_ok(a.pack_samples, a.seq_len):
            raise ValueError(f"pack_samples={a.pack_samples} must be an integer in [1, seq_len // 5 = "
                             f"{a.seq_len // 5}]")
        samples = (a.pack_samples or default_samples_per_row(a.seq_len)) if a.pack else 0
        config = DataConfig(paths=a.data, seq_len=a.seq_len, seed=a.seed, vocab=a.vocab, vocab_size=a.vocab_size,
                            pack=samples)
        prepare(config, a.out, workers=a.workers, rows_per_shard=a.rows_per_shard, progress=not a.no_progress)
    except ValueError as e:  # DataError and bad settings
        print(f"prepare: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
