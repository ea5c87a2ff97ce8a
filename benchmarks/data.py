"""Prepared pre-training data: preparation throughput, loader start-up and memory, data wait in training.

    PYTHONPATH=. python benchmarks/data.py --generate-corpus 5 --corpus /tmp/corpus5g.txt
    PYTHONPATH=. python benchmarks/data.py --prepare /tmp/corpus5g.txt --out /tmp/prep5g --workers 2
    PYTHONPATH=. python benchmarks/data.py --load /tmp/prep5g --workers 2 --batch-size 64 --batches 200
    PYTHONPATH=. python benchmarks/data.py --train /tmp/prep5g --config large --batch-size 64 --steps 200  # GPU
    PYTHONPATH=. python benchmarks/data.py --compare-formats /tmp/prep5g --batch-size 64
    PYTHONPATH=. python benchmarks/data.py --tile /tmp/prep --copies 64 --out /tmp/prep-tiled
    PYTHONPATH=. python benchmarks/data.py --startup /tmp/prep-tiled   # or builtin: train.py's default run

--generate-corpus writes GB gigabytes of BERT-format text made from the built-in corpus (64 variants of it, each with
its documents shuffled, its sentences' words rotated and one word replaced by a number, in a random order).
--prepare runs
jaxformer.prepare with a vocabulary trained on the built-in corpus (kept in --vocab-dir) and prints MB of text per
second. --load opens the prepared set and times the first batch (no compile: the loader alone) and then --batches
more, with the resident memory (private and file-backed) of this process and of Grain's workers, then times a full
checksum verification. --train feeds the loader's batches to the
real train step (one process, all local devices with --mesh) and prints ms/step against pre-placed synthetic
batches and the time each step waited for data. --tile makes a large prepared set from a small one (its rows
repeated, hard-linked shards) and --startup times train.py from its start to its first step (the compile not waited
for). Each mode prints one JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import sys
import threading
import time
from pathlib import Path


def generate_corpus(gigabytes: float, out: Path, seed: int = 0, variants: int = 64) -> dict:
    """``variants`` different copies of the built-in corpus (documents shuffled; each sentence's words rotated and
    one replaced by a number), written in a random order until the file holds ``gigabytes``."""
    from jaxformer.corpus import builtin_corpus, iter_documents

    docs = list(iter_documents(builtin_corpus()))
    start = time.perf_counter()

    def variant(k: int) -> bytes:
        rng = random.Random(seed * 100003 + k)
        order = list(range(len(docs)))
        rng.shuffle(order)
        parts = []
        for d in order:
            lines = []
            for sentence in docs[d]:
                words = sentence.split()
                k = rng.randrange(len(words))
                words = words[k:] + words[:k]
                words[rng.randrange(len(words))] = str(rng.randrange(100000))
                lines.append(" ".join(words).capitalize())
            parts.append("\n".join(lines) + "\n\n")
        return "".join(parts).encode()

    blocks, target, written, rng = [], int(gigabytes * 1e9), 0, random.Random(seed)
    with open(out, "wb") as f:
        while written < target:
            block = variant(len(blocks)) if len(blocks) < variants else rng.choice(blocks)
            if len(blocks) < variants:
                blocks.append(block)
            f.write(block)
            written += len(block)
    return dict(mode="generate", file=str(out), bytes=written, variants=len(blocks),
                seconds=round(time.perf_counter() - start, 1))


def vocabulary(vocab_dir: Path) -> Path:
    """A 4096-token WordPiece vocabulary trained on the built-in corpus (train.py's default tokenizer)."""
    from jaxformer.corpus import builtin_corpus, load_or_train_tokenizer

    load_or_train_tokenizer(None, builtin_corpus(), 4096, save_dir=vocab_dir)
    return vocab_dir / "tokenizer.json"


def run_prepare(corpus: str, out: str, workers: int, seq_len: int, vocab_dir: Path) -> dict:
    from jaxformer.data import DataConfig
    from jaxformer.prepare import prepare

    vocab = vocabulary(vocab_dir)

    def cpu_seconds() -> float:  # this process and its (finished) workers: the work, whatever else the machine runs
        return sum(r.ru_utime + r.ru_stime for r in map(resource.getrusage, (resource.RUSAGE_SELF,
                                                                              resource.RUSAGE_CHILDREN)))
    peaks, stop = {"main": 0.0, "worker": 0.0, "total": 0.0}, threading.Event()

    def sample() -> None:  # private resident memory (RssAnon) every 0.2 s: ru_maxrss counts mapped file pages too
        while not stop.wait(0.2):
            try:
                memory = _memory_gib()["rss_anon_gib"]
            except Exception:  # noqa: BLE001 - a worker exited between listing and reading
                continue
            peaks.update(main=max(peaks["main"], memory[0]), worker=max([peaks["worker"], *memory[1:]]),
                         total=max(peaks["total"], sum(memory)))
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start, cpu0 = time.perf_counter(), cpu_seconds()
    m = prepare(DataConfig(paths=corpus, seq_len=seq_len, vocab=str(vocab)), out, workers=workers, progress=False)
    seconds, cpu = time.perf_counter() - start, cpu_seconds() - cpu0
    stop.set()
    sampler.join()
    mb = m["counts"]["bytes"] / 1e6
    shard_bytes = sum(s["bytes"] for split in m["shards"].values() for s in split)
    rss = lambda who: resource.getrusage(who).ru_maxrss / 2**20  # noqa: E731 (GiB; ru_maxrss is in KiB)
    return dict(mode="prepare", corpus_mb=round(mb, 1), workers=workers, cpus=os.cpu_count(), seconds=round(seconds, 1),
                stage_seconds=m["seconds"], cpu_seconds=round(cpu, 1), mb_per_cpu_s=round(mb / cpu, 3),
                mb_per_s=round(mb / seconds, 2), mb_per_s_per_worker=round(mb / seconds
                / max(1, workers), 2), tokenize_mb_per_s=round(mb / m["seconds"]["tokenize"], 2),
                tokens=m["counts"]["tokens"], train_examples=m["counts"]["train_examples"],
                eval_examples=m["counts"]["eval_examples"], shard_gb=round(shard_bytes / 1e9, 3),
                bytes_per_corpus_token=round(shard_bytes / m["counts"]["tokens"], 3), row_bytes=m["row_bytes"],
                peak_rss_gib_main=round(rss(resource.RUSAGE_SELF), 3),
                peak_rss_gib_largest_worker=round(rss(resource.RUSAGE_CHILDREN), 3),
                peak_private_gib=dict((k, round(v, 3)) for k, v in peaks.items()),
                load_average=os.getloadavg())


def _memory_gib() -> dict:
    """Resident memory of this process and of its children (Grain's workers): private (RssAnon: what the process
    itself holds) and file-backed (RssFile: mapped shard pages, shared page cache that the kernel can drop)."""
    import psutil

    def status(pid: int) -> dict:
        fields = {}
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("RssAnon", "RssFile"):
                fields[key] = int(value.split()[0]) / 2**20  # kB -> GiB
        return fields
    me = psutil.Process()
    procs = [status(me.pid)] + [status(c.pid) for c in me.children(recursive=True)]
    return dict(rss_anon_gib=[round(p["RssAnon"], 3) for p in procs],
                rss_file_gib=[round(p["RssFile"], 3) for p in procs],
                rss_anon_gib_total=round(sum(p["RssAnon"] for p in procs), 3))


def run_load(root: str, workers: int, batch_size: int, batches: int, step_ms: float) -> dict:
    from jaxformer import loader
    from jaxformer.prepared import PreparedSet

    start = time.perf_counter()
    data = PreparedSet(root)
    opened = time.perf_counter() - start
    it = loader.train_batches(data, batch_size, workers=workers)
    next(it)
    first = time.perf_counter() - start
    waits, t = [], time.perf_counter()
    for _ in range(batches):
        if step_ms:
            time.sleep(step_ms / 1e3)  # a consumer busy for one step
        next(it)
        waits.append(it.last_wait_seconds)
    steady = time.perf_counter() - t
    memory = _memory_gib()
    it.close()
    t = time.perf_counter()
    PreparedSet(root, verify="checksum")
    verify_s = time.perf_counter() - t
    return dict(mode="load", root=root, train_examples=data.num_train_examples,
                shard_gb=round(sum(s["bytes"] for v in data.manifest["shards"].values() for s in v) / 1e9, 3),
                workers=workers, batch_size=batch_size, open_s=round(opened, 3), first_batch_s=round(first, 2),
                batches_per_s=round(batches / steady, 1) if not step_ms else None, step_ms=step_ms,
                wait_ms_per_step=round(1e3 * statistics.mean(waits), 3), max_wait_ms=round(1e3 * max(waits), 2),
                **memory, checksum_verify_s=round(verify_s, 1),
                load_average=os.getloadavg())


def compare_formats(root: str, batch_size: int, batches: int) -> dict:
    """Random batches of rows from the first train shard read from the .npy file (positioned reads, as the loader
    does, or a memory map) and from the same rows in an ArrayRecord file (one record per row, group_size:1 for
    random access, read through Grain's ArrayRecordDataSource)."""
    import numpy as np
    from array_record.python.array_record_module import ArrayRecordWriter
    from grain.sources import ArrayRecordDataSource

    from jaxformer.prepared import PreparedSet, ShardedRows

    data = PreparedSet(root)
    first = data.manifest["shards"]["train"][0]
    rows = ShardedRows(data.root, [first], data.manifest["rows_per_shard"], data.rows["train"].dtype)
    path = Path(f"/tmp/jaxformer-formats-{os.getpid()}.array_record")
    writer = ArrayRecordWriter(str(path), "group_size:1")
    for row in np.load(data.root / first["file"], mmap_mode="r"):
        writer.write(row.tobytes())
    writer.close()
    source = ArrayRecordDataSource([str(path)])
    rng = np.random.default_rng(0)
    picks = [rng.integers(0, len(rows), batch_size) for _ in range(batches)]
    times = {}
    shard = np.load(data.root / first["file"], mmap_mode="r")
    for name, read in (("npy_pread", rows.read), ("npy_mmap", lambda ids: shard[ids]),
                       ("array_record", lambda ids: np.frombuffer(b"".join(source.__getitems__(ids.tolist())),
                                                                  rows.dtype))):
        for ids in picks[:5]:
            read(ids)  # first touch of the pages / readers
        t = time.perf_counter()
        for ids in picks:
            read(ids)
        times[name] = round(1e6 * (time.perf_counter() - t) / batches, 1)
    assert all(np.array_equal(rows.read(ids), np.frombuffer(b"".join(source.__getitems__(ids.tolist())),
                                                            rows.dtype)) for ids in picks[:3])
    sizes = dict(npy=first["bytes"], array_record=path.stat().st_size)
    path.unlink()
    return dict(mode="formats", rows=len(rows), batch_size=batch_size, us_per_batch=times, file_bytes=sizes)


def run_train(root: str, args) -> dict:
    import jax

    from jaxformer import loader, sharding
    from jaxformer.config import TrainConfig
    from jaxformer.data import synthetic_batch
    from jaxformer.prepared import PreparedSet
    from jaxformer.steps import Steps, build_model, make_optimizer

    data = PreparedSet(root)
    tc = TrainConfig(config=args.config, seq_len=data.seq_len, batch_size=args.batch_size, kernels=args.kernels,
                     steps=10**6, warmup_steps=10, mesh=args.mesh or "data=-1")
    cfg = tc.model_config(data.vocab_size)
    mesh = sharding.make_mesh(sharding.validate(tc.mesh, cfg, tc)) if args.mesh else None
    model = build_model(cfg, 0)
    steps = Steps(model, make_optimizer(tc), tc, mesh)
    state = steps.place(steps.init_state(model, 0))
    del model
    block, n_blocks = steps.batch_block
    it = loader.train_batches(data, args.batch_size, block=block, n_blocks=n_blocks, workers=args.workers)
    p = next(it)["masked_positions"].shape[1]
    synthetic = [steps.place_batch(steps.local_rows(synthetic_batch(cfg.vocab_size, args.batch_size, data.seq_len,
                                                                    p, seed))) for seed in range(4)]
    state, m = steps.train_step(state, synthetic[0])  # compile
    jax.block_until_ready(m)

    def timed(get_batch) -> tuple[float, float]:
        waits, t = 0.0, time.perf_counter()
        for i in range(args.steps):
            w = time.perf_counter()
            batch = get_batch(i)
            waits += time.perf_counter() - w
            nonlocal state
            state, metrics = steps.train_step(state, batch)
        jax.block_until_ready((state, metrics))
        return (time.perf_counter() - t) / args.steps, waits / args.steps

    for i in range(5):  # workers started, buffers full
        state, m = steps.train_step(state, steps.place_batch(next(it)))
    jax.block_until_ready(m)
    synthetic_s, _ = timed(lambda i: synthetic[i % 4])
    loader_s, wait_s = timed(lambda i: steps.place_batch(next(it)))
    it.close()
    return dict(mode="train", device=jax.devices()[0].device_kind, devices=mesh.size if mesh else 1,
                config=args.config, seq_len=data.seq_len, batch_size=args.batch_size, workers=args.workers,
                ms_per_step_synthetic=round(synthetic_s * 1e3, 2), ms_per_step_loader=round(loader_s * 1e3, 2),
                overhead_pct=round(100 * (loader_s - synthetic_s) / synthetic_s, 2),
                data_wait_ms_per_step=round(wait_s * 1e3, 3), data_wait_pct=round(100 * wait_s / loader_s, 2))


def tile(root: str, copies: int, out: str) -> dict:
    """A large prepared set made from the one in ``root`` without tokenizing: its training rows repeated into one
    shard of the default shard size, listed ``copies`` times (hard links of one file), its eval rows in one shard.
    What opening the set and starting the loader cost depends on the number of shards and rows, not on the rows'
    contents (which repeat: the set is for start-up measurements, not for training)."""
    import hashlib
    import shutil

    import numpy as np

    from jaxformer.prepare import SHARD_BYTES
    from jaxformer.prepared import MANIFEST, TOKENIZER, PreparedSet, shard_name, write_json, write_shard

    data, target = PreparedSet(root), Path(out)
    target.mkdir(parents=True, exist_ok=True)
    rows = data.rows["train"].read(np.arange(data.num_train_examples))
    per = max(1, SHARD_BYTES // rows.dtype.itemsize)
    first = target / shard_name("train", 0)
    digest = write_shard(first, np.resize(rows, per))
    for i in range(1, copies):
        (target / shard_name("train", i)).unlink(missing_ok=True)
        os.link(first, target / shard_name("train", i))
    held_out = data.rows["eval"].read(np.arange(data.num_eval_examples))
    eval_digest = write_shard(target / shard_name("eval", 0), held_out)
    shutil.copy(data.root / TOKENIZER, target / TOKENIZER)
    m = data.manifest
    inputs = dict(m["inputs"], sha256=hashlib.sha256(f"{m['inputs']['sha256']} tiled {copies}".encode()).hexdigest())
    shards = dict(train=[dict(file=shard_name("train", i), rows=per, bytes=first.stat().st_size, sha256=digest)
                         for i in range(copies)],
                  eval=[dict(file=shard_name("eval", 0), rows=len(held_out),
                             bytes=(target / shard_name("eval", 0)).stat().st_size, sha256=eval_digest)])
    write_json(target / MANIFEST, dict(m, rows_per_shard=per, shards=shards, inputs=inputs,
                                       counts=dict(m["counts"], train_examples=per * copies)))
    return dict(mode="tile", out=str(target), train_examples=per * copies, shards=copies,
                shard_gb=round(copies * first.stat().st_size / 1e9, 2))


def startup(data: str, root: str, train_args: str) -> dict:
    """`train.py` (of the repository `root`) from its start to its first step, not waiting for the compile: the
    seconds at which its log shows the data ready, the model built and the first step dispatched, and the start-up
    it logs itself (this version). ``data``: a prepared directory or text for --data, or "builtin"."""
    import re
    import shlex
    import shutil
    import subprocess
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="jaxformer-startup-"))
    cmd = [sys.executable, str(Path(root) / "train.py"), "--steps", "1", "--no-progress", "--out", str(tmp / "run"),
           *([] if data == "builtin" else ["--data", data]), *shlex.split(train_args)]
    marks, logged, lines = {}, None, []
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=root, env=dict(os.environ, PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        for line in proc.stdout:
            now, lines = time.perf_counter() - start, lines + [line.rstrip()]
            if line.startswith("data: ") and " training / " in line:
                marks["data_ready_s"] = round(now, 2)
            elif line.startswith("model: "):
                marks["model_built_s"] = round(now, 2)
            elif line.startswith("step 1: compiling"):
                marks["first_step_s"] = round(now, 2)
                if found := re.search(r"([\d.]+)s after the start", line):
                    logged = float(found.group(1))
                break
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    if "first_step_s" not in marks:
        raise RuntimeError("train.py stopped before its first step:\n" + "\n".join(lines[-20:]))
    return dict(mode="startup", data=data, root=root, train_args=train_args, **marks, logged_start_up_s=logged,
                load_average=os.getloadavg())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--generate-corpus", type=float, metavar="GB")
    mode.add_argument("--prepare", metavar="CORPUS")
    mode.add_argument("--load", metavar="DIR")
    mode.add_argument("--train", metavar="DIR")
    mode.add_argument("--compare-formats", metavar="DIR")
    mode.add_argument("--tile", metavar="DIR", help="a large prepared set in --out from DIR's rows (--copies shards)")
    mode.add_argument("--startup", metavar="DATA", help="train.py's start-up on DATA (a prepared directory, text, "
                      "or 'builtin')")
    ap.add_argument("--corpus", default="/tmp/jaxformer-corpus.txt", help="--generate-corpus: the file to write")
    ap.add_argument("--out", help="--prepare: the prepared directory")
    ap.add_argument("--vocab-dir", default="/tmp/jaxformer-bench-vocab")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--step-ms", type=float, default=0.0, help="--load: sleep this long per batch (a busy consumer)")
    ap.add_argument("--config", default="large")
    ap.add_argument("--kernels", default="auto")
    ap.add_argument("--mesh", default=None)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--copies", type=int, default=64, help="--tile: shards of the large set")
    ap.add_argument("--root", default=str(Path(__file__).resolve().parents[1]),
                    help="--startup: the repository whose train.py runs (default: this one)")
    ap.add_argument("--train-args", default="", help="--startup: more train.py flags, e.g. '--data-workers 0'")
    a = ap.parse_args()
    if a.generate_corpus:
        result = generate_corpus(a.generate_corpus, Path(a.corpus))
    elif a.prepare:
        result = run_prepare(a.prepare, a.out, a.workers, a.seq_len, Path(a.vocab_dir))
    elif a.load:
        result = run_load(a.load, a.workers, a.batch_size, a.batches, a.step_ms)
    elif a.compare_formats:
        result = compare_formats(a.compare_formats, a.batch_size, a.batches)
    elif a.tile:
        result = tile(a.tile, a.copies, a.out)
    elif a.startup:
        result = startup(a.startup, a.root, a.train_args)
    else:
        result = run_train(a.train, a)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
