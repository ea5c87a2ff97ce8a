"""Prepared pre-training data (jaxformer.prepare, jaxformer.prepared, jaxformer.loader) against a plain sequential
reading of the corpus: same examples, order and resume, process blocks, resumable preparation, errors."""
import json
import random
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from tokenizers import Tokenizer

import jaxformer.corpus as corpus_module
import jaxformer.prepare as prep
from jaxformer import examples, loader
from jaxformer.data import (SPECIAL_TOKENS, CorpusStats, DataConfig, DataError, iter_documents,
                            load_or_train_tokenizer, special_token_ids)
from jaxformer.prepared import MANIFEST, PreparedSet

SEQ_LEN, SEED = 32, 7
WORDS = ("the cat dog bird sees likes finds a red blue small big house tree river stone walks runs over under near "
         "quickly slowly and but then green old new").split()


def write_numbered(path: Path, n_docs: int = 240, seed: int = 1234) -> tuple[Path, int]:
    """A corpus whose every word ``w<n>`` is unique (a word-level vocab.txt gives every token its own id)."""
    rng, docs, n = random.Random(seed), [], 0
    for _ in range(n_docs):
        doc = []
        for _ in range(rng.randint(1, 8)):
            k = rng.randint(2, 12)
            doc.append(" ".join(f"w{n + i}" for i in range(k)))
            n += k
        docs.append("\n".join(doc))
    path.write_text("\n\n".join(docs) + "\n")
    return path, n


def write_prose(root: Path, seed: int = 0) -> list[Path]:
    """Two text files and a .jsonl with what the readers must get right: a BOM, CRLF line ends, whitespace-only
    lines as document breaks, undecodable lines, malformed JSON lines, literal special tokens."""
    rng = np.random.RandomState(seed)

    def sentence():
        return " ".join(rng.choice(WORDS, rng.randint(3, 14))).capitalize() + "."
    lines = ["\ufeff" + sentence()]
    for d in range(70):
        lines += [sentence() for _ in range(rng.randint(1, 9))]
        lines.append(["", "   ", "\t"][d % 3])
    a = root / "a.txt"
    a.write_bytes("\r\n".join(lines).encode()[:-1] + b"\xff broken\n\nlast [SEP] doc [MASK] here.\n")
    b = root / "b.txt"
    b.write_text("\n".join(sentence() if i % 7 else "" for i in range(400)))  # no trailing newline
    c = root / "c.jsonl"
    c.write_text("\n".join(json.dumps({"text": " ".join(sentence() for _ in range(rng.randint(1, 6)))})
                           if i % 11 else "not json" for i in range(90)) + "\n")
    return [a, b, c]


@pytest.fixture(scope="module")
def numbered(tmp_path_factory):
    root = tmp_path_factory.mktemp("numbered")
    path, n = write_numbered(root / "corpus.txt")
    vocab = root / "vocab.txt"
    vocab.write_text("\n".join(list(SPECIAL_TOKENS) + [f"w{i}" for i in range(n)]) + "\n")
    config = DataConfig(paths=str(path), seq_len=SEQ_LEN, eval_fraction=0.1, seed=SEED, vocab=str(vocab))
    tok = load_or_train_tokenizer(vocab=vocab)
    out = root / "prepared"
    manifest = prep.prepare(config, out, workers=0, rows_per_shard=150, chunk_bytes=2000, progress=False,
                            log=lambda *a: None)
    return SimpleNamespace(config=config, tok=tok, out=out, manifest=manifest, data=PreparedSet(out, SEQ_LEN, tok))


def sequential(config: DataConfig, tok: Tokenizer) -> SimpleNamespace:
    """Both splits' rows from a plain sequential reading of the corpus (``iter_documents``, each document's sentences
    tokenized together) and the shared example logic (jaxformer/examples.py): what the chunked, parallel
    preparation must equal, row for row."""
    tok = Tokenizer.from_str(tok.to_str())
    tok.encode_special_tokens = True  # literal "[SEP]" in the text is text
    stats, tokens, sent_lens, doc_sizes = CorpusStats(), [], [], []
    for doc in iter_documents(config.paths, stats):
        ids = [x for x in (e.ids for e in tok.encode_batch(doc, add_special_tokens=False)) if x]
        if ids:
            sent_lens += map(len, ids)
            doc_sizes.append(len(ids))
            tokens += [t for x in ids for t in x]
    vocab = tok.get_vocab_size(with_added_tokens=True)
    tokens = np.array(tokens, examples.token_dtype(vocab))
    sent_starts, doc_starts = np.cumsum([0, *sent_lens]), np.cumsum([0, *doc_sizes])
    is_eval = examples.eval_documents(len(doc_sizes), config.eval_fraction)
    rng, rows, special = random.Random(config.seed), {}, special_token_ids(tok)
    for split, docs in (("train", ~is_eval), ("eval", is_eval)):
        pairs = examples.make_pairs(sent_starts, doc_starts, np.flatnonzero(docs), rng, config.seq_len,
                                    config.short_seq_prob)
        rows[split] = examples.assemble_rows(tokens, pairs, config.seq_len, special,
                                             examples.row_dtype(config.seq_len, tokens.dtype))
    random_ids = examples.random_replacement_ids(vocab, special, tok.get_added_tokens_decoder())

    def masked(split: str, index, epoch: int) -> dict:  # the loader's masking of rows `index` of `split`
        index = np.asarray(index)
        return examples.masked_batch(rows[split][index], index, (config.seed, epoch), special, random_ids, 0.15,
                                     config.max_predictions)
    return SimpleNamespace(rows=rows, stats=stats, tokens=len(tokens), masked=masked)


def assert_same_rows(data: PreparedSet, reference: SimpleNamespace) -> None:
    for split in ("train", "eval"):
        got = data.rows[split].read(np.arange(len(data.rows[split])))
        assert got.tobytes() == reference.rows[split].tobytes(), split


def assert_same_batch(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def rows_of(batch) -> list[bytes]:
    """Each example of a batch as bytes (all of its fields), to compare batches as multisets of examples."""
    return [b"".join(np.ascontiguousarray(batch[k][i]).tobytes() for k in sorted(batch))
            for i in range(len(batch["nsp_labels"]))]


def take(it, n):
    return [next(it) for _ in range(n)]


def quiet(*args, **kwargs):
    pass


# ----------------------------------------------------------------------------- reading and preparing
@pytest.mark.parametrize("chunk_bytes", [1, 37, 500, 10**9])
def test_byte_ranges_read_the_documents_of_the_whole_file(tmp_path, monkeypatch, chunk_bytes):
    monkeypatch.setattr(corpus_module, "MAX_LINE_BYTES", 64)  # lines over it are skipped (and counted)
    monkeypatch.setattr(prep, "MAX_LINE_BYTES", 64)
    long = tmp_path / "long.txt"
    long.write_text("First doc.\n" + "x" * 64 + "\n" + "y" * 200 + "\nstill first.\n\n" + "z" * 150 + "\n\nLast doc.\n"
                    + "w" * 100)
    for path in [*write_prose(tmp_path), long]:
        want_stats = CorpusStats()
        want = list(iter_documents(path, want_stats))
        stats = CorpusStats()
        got, ranges = [], prep.byte_ranges(path, chunk_bytes)
        assert ranges[0][0] == 0 and ranges[-1][1] == path.stat().st_size
        assert all(a < b and b == c for (a, b), (c, _) in zip(ranges, ranges[1:] + [(ranges[-1][1], 0)]))
        for a, b in ranges:
            got += corpus_module.iter_file_documents(path, stats, a, b)
        assert got == want
        assert (stats.undecodable_lines, stats.malformed_lines, stats.overlong_lines) == \
            (want_stats.undecodable_lines, want_stats.malformed_lines, want_stats.overlong_lines)
        if chunk_bytes == 37:
            assert len(ranges) > (2 if path == long else 5)
        if path == long:
            assert want == [["First doc.", "x" * 64, "still first."], ["Last doc."]]
            assert want_stats.overlong_lines == 3


def test_prepared_rows_equal_a_sequential_reading(numbered):
    data, reference = numbered.data, sequential(numbered.config, numbered.tok)
    assert len(numbered.manifest["shards"]["train"]) > 2  # several shards were read
    assert_same_rows(data, reference)
    # With batch size 1 an epoch visits every example once, masked with (seed, epoch, example): the loader's epoch
    # holds the reference rows masked so (in Grain's shuffled order).
    n = data.num_train_examples
    with loader.train_batches(data, 1, seed=SEED, workers=0) as it:
        prepared = sorted(r for b in take(it, n) for r in rows_of(b))
    assert prepared == sorted(rows_of(reference.masked("train", np.arange(n), 0)))
    n_eval = data.num_eval_examples
    wrapped = np.arange(-(-n_eval // 16) * 16) % n_eval  # the last batch topped up from the first examples
    for i, batch in enumerate(loader.eval_batches(data, 16, seed=SEED)):
        assert_same_batch(batch, reference.masked("eval", wrapped[16 * i:16 * (i + 1)], examples.EVAL_EPOCH))
    labels = reference.masked("eval", np.arange(n_eval), examples.EVAL_EPOCH)
    labels = labels["masked_labels"][labels["masked_weights"] > 0]
    assert loader.most_frequent_token_baseline(data, seed=SEED) == np.bincount(labels).max() / len(labels)


def test_prepared_with_a_trained_tokenizer_in_worker_processes_equals_a_sequential_reading(tmp_path):
    files = write_prose(tmp_path)
    config = DataConfig(paths=[str(f) for f in files], seq_len=24, eval_fraction=0.1, seed=3, vocab_size=120)
    manifest = prep.prepare(config, tmp_path / "p", workers=2, rows_per_shard=64, chunk_bytes=300, progress=False,
                            log=quiet)
    data = PreparedSet(tmp_path / "p")
    reference = sequential(config, data.tokenizer)
    counts, stats = manifest["counts"], reference.stats
    assert (counts["files"], counts["documents"], counts["sentences"], counts["tokens"]) == \
        (stats.files, stats.documents, stats.sentences, reference.tokens)
    assert (counts["undecodable_lines"], counts["malformed_lines"]) == (1, 9)
    assert counts["undecodable_lines"] == stats.undecodable_lines and counts["malformed_lines"] == stats.malformed_lines
    assert_same_rows(data, reference)


# ----------------------------------------------------------------------------- the loader
def test_batches_format_seed_and_epochs(numbered):
    data, p = numbered.data, numbered.config.max_predictions
    with loader.train_batches(data, 16, seed=SEED, workers=0) as it:
        first = take(it, 3)
    for batch in first:
        assert {k: (v.dtype, v.shape) for k, v in batch.items()} == {
            "input_ids": (np.int32, (16, SEQ_LEN)), "token_type_ids": (np.int32, (16, SEQ_LEN)),
            "attention_mask": (np.int32, (16, SEQ_LEN)), "masked_positions": (np.int32, (16, p)),
            "masked_labels": (np.int32, (16, p)), "masked_weights": (np.float32, (16, p)),
            "nsp_labels": (np.int32, (16,))}
    with loader.train_batches(data, 16, seed=SEED, workers=0) as it:
        for a, b in zip(first, take(it, 3)):
            assert_same_batch(a, b)
    with loader.train_batches(data, 16, seed=SEED + 1, workers=0) as it:
        other = next(it)
    assert not set(rows_of(first[0])) & set(rows_of(other))
    # Each epoch is a permutation (last partial batch dropped), different from the next one.
    spe = data.num_train_examples // 16
    with loader.train_batches(data, 16, seed=SEED, workers=0) as it:
        epochs = [take(it, spe) for _ in range(2)]
    labels = [np.concatenate([b["masked_labels"][:, 0] for b in e]) for e in epochs]
    assert not np.array_equal(labels[0], labels[1])
    fn = loader._TrainBatch(data, 16, SEED, 0, 1, 0.15, 6)
    for epoch in range(2):
        order = [fn.order[epoch * fn.n + i] for i in range(fn.n)]
        assert sorted(order) == list(range(fn.n))


def test_resume_from_the_iterator_state_is_exact(numbered):
    data = numbered.data
    spe = data.num_train_examples // 8
    with loader.train_batches(data, 8, seed=SEED, workers=0) as it:
        straight = take(it, spe + 6)  # across an epoch boundary
    with loader.train_batches(data, 8, seed=SEED, workers=2) as it:  # Grain's worker processes
        head = take(it, spe - 2)
        state = it.state()
    assert json.loads(state)["step"] == spe - 2 and loader.steps_per_epoch(data, 8) == spe
    for a, b in zip(head, straight):
        assert_same_batch(a, b)
    with loader.train_batches(data, 8, seed=SEED, workers=0, state=state) as it:
        for a, b in zip(take(it, 8), straight[spe - 2:]):
            assert_same_batch(a, b)
    with loader.train_batches(data, 8, seed=SEED, workers=0, state=it.state(spe + 1)) as again:
        assert_same_batch(next(again), straight[spe + 1])
    with pytest.raises(DataError, match="seed: saved 7, now 8"):
        loader.train_batches(data, 8, seed=SEED + 1, workers=0, state=state)
    with pytest.raises(DataError, match="batch_size: saved 8, now 16"):
        loader.train_batches(data, 16, seed=SEED, workers=0, state=state)
    with pytest.raises(DataError, match="unreadable"):
        loader.train_batches(data, 8, seed=SEED, workers=0, state=b"{}")


def test_process_blocks_partition_the_global_batch(numbered):
    data = numbered.data
    with loader.train_batches(data, 16, seed=SEED, workers=0) as it:
        whole = take(it, 4)
    with loader.train_batches(data, 16, seed=SEED, block=0, n_blocks=2, workers=0) as it0, \
            loader.train_batches(data, 16, seed=SEED, block=1, n_blocks=2, workers=0) as it1:
        for batch, b0, b1 in zip(whole, take(it0, 4), take(it1, 4)):
            assert len(b0["nsp_labels"]) == len(b1["nsp_labels"]) == 8
            assert not set(rows_of(b0)) & set(rows_of(b1))
            assert_same_batch({k: np.concatenate([b0[k], b1[k]]) for k in batch}, batch)
    global_eval = loader.eval_batches(data, 16, seed=SEED, limit=2)
    halves = [loader.eval_batches(data, 16, seed=SEED, limit=2, block=i, n_blocks=2) for i in range(2)]
    for batch, b0, b1 in zip(global_eval, *halves, strict=True):
        assert_same_batch({k: np.concatenate([b0[k], b1[k]]) for k in batch}, batch)


def test_a_shard_lost_after_opening_fails_the_batch_that_reads_it(numbered, tmp_path):
    out = tmp_path / "p"
    shutil.copytree(numbered.out, out)
    loader.train_batches(PreparedSet(out), 8, workers=0).close()  # closing before the first batch
    data = PreparedSet(out)
    lost = out / numbered.manifest["shards"]["train"][-1]["file"]
    lost.unlink()
    with pytest.raises(DataError, match=re.escape(f"shard {lost} cannot be read")):
        with loader.train_batches(data, 8, workers=0) as it:
            take(it, 20)


def test_loader_argument_errors(numbered):
    data = numbered.data
    with pytest.raises(DataError, match="bad sharding"):
        loader.train_batches(data, 16, block=2, n_blocks=2)
    with pytest.raises(DataError, match="bad sharding"):
        loader.train_batches(data, 15, n_blocks=2)
    with pytest.raises(DataError, match="fewer than one batch of batch_size=100000"):
        loader.train_batches(data, 100000)
    with pytest.raises(DataError, match="max_predictions=30"):
        loader.eval_batches(data, 8, max_predictions=30)


# ----------------------------------------------------------------------------- re-running and resuming prepare
def shard_times(out: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in sorted(out.glob("*-[0-9]*.npy"))}


def test_rerun_skips_finished_shards_and_rebuilds_a_bad_one(numbered, tmp_path):
    out = tmp_path / "p"
    kwargs = dict(workers=0, rows_per_shard=150, chunk_bytes=2000, progress=False)
    first = prep.prepare(numbered.config, out, log=quiet, **kwargs)
    assert first["shards"] == numbered.manifest["shards"]  # deterministic
    before = shard_times(out)
    logged = []
    assert prep.prepare(numbered.config, out, log=logged.append, **kwargs) == first
    assert shard_times(out) == before and "already prepared" in logged[0]
    victim = out / first["shards"]["train"][1]["file"]
    raw = bytearray(victim.read_bytes())
    raw[-5] ^= 0xFF  # same size, different bytes
    victim.write_bytes(bytes(raw))
    PreparedSet(out, verify="size")  # the cheap check cannot see it
    with pytest.raises(DataError, match=re.escape(f"shard {victim} is corrupt")):
        PreparedSet(out, verify="checksum")
    before = shard_times(out)
    again = prep.prepare(numbered.config, out, log=quiet, **kwargs)
    assert again["shards"] == first["shards"]
    after = shard_times(out)
    assert [n for n in before if before[n] != after[n]] == [victim.name]
    PreparedSet(out, verify="checksum")


@pytest.mark.parametrize("stage", ["tokenize", "shards"])
def test_interrupted_preparation_resumes(numbered, tmp_path, monkeypatch, stage):
    out = tmp_path / "p"
    kwargs = dict(workers=0, rows_per_shard=150, chunk_bytes=2000, progress=False, log=quiet)
    calls = {"n": 0}
    if stage == "tokenize":
        real = prep._tokenize_piece

        def task(t):  # the process dies after three pieces
            calls["n"] += 1
            if calls["n"] > 3:
                raise KeyboardInterrupt
            return real(t)
        monkeypatch.setattr(prep, "_tokenize_piece", task)
    else:
        real = prep._write_rows

        def task(t):  # the process dies after two shards
            calls["n"] += 1
            if calls["n"] > 2:
                raise KeyboardInterrupt
            return real(t)
        monkeypatch.setattr(prep, "_write_rows", task)
    with pytest.raises(KeyboardInterrupt):
        prep.prepare(numbered.config, out, **kwargs)
    assert not (out / MANIFEST).exists()
    with pytest.raises(DataError, match="unfinished preparation"):
        PreparedSet(out)
    work = out / prep.WORK
    if stage == "tokenize":
        assert len(list(work.glob("piece-*.npz"))) == 3
    else:
        written = json.loads((work / "shards.json").read_text())
        assert len(written) == 2
        kept, truncated = sorted(written)
        (out / truncated).write_bytes((out / truncated).read_bytes()[:100])
        before = (out / kept).stat().st_mtime_ns
    monkeypatch.setattr(prep, "_tokenize_piece" if stage == "tokenize" else "_write_rows", real)
    resumed = prep.prepare(numbered.config, out, **kwargs)
    assert resumed["shards"] == numbered.manifest["shards"] and resumed["counts"] == numbered.manifest["counts"]
    assert not work.exists()
    if stage == "shards":
        assert (out / kept).stat().st_mtime_ns == before  # verified, not rewritten
    PreparedSet(out, verify="checksum")


def test_a_directory_prepared_differently_is_not_overwritten(numbered, tmp_path):
    out = tmp_path / "p"
    kwargs = dict(workers=0, rows_per_shard=150, chunk_bytes=2000, progress=False, log=quiet)
    prep.prepare(numbered.config, out, **kwargs)
    with pytest.raises(DataError, match="prepared differently: pair_seed 7 .now 8.*another --out"):
        prep.prepare(DataConfig(**{**numbered.config.__dict__, "seed": 8}), out, **kwargs)


# ----------------------------------------------------------------------------- errors
def test_opening_errors_name_the_file_and_the_disagreement(numbered, tmp_path):
    out = tmp_path / "p"
    shutil.copytree(numbered.out, out)
    with pytest.raises(DataError, match=re.escape(f"{out / MANIFEST} was prepared with seq_len 32; the run asks "
                                                  "for seq_len 64")):
        PreparedSet(out, seq_len=64)
    other = load_or_train_tokenizer(None, numbered.config.paths, 64)
    with pytest.raises(DataError, match=re.escape(f"{out / MANIFEST} was prepared with a different tokenizer")):
        PreparedSet(out, tokenizer=other)
    shard = out / numbered.manifest["shards"]["eval"][0]["file"]
    shard.write_bytes(shard.read_bytes()[:-7])
    with pytest.raises(DataError, match=re.escape(f"shard {shard} has ") + ".* bytes.*truncated"):
        PreparedSet(out)
    shard.unlink()
    with pytest.raises(DataError, match=re.escape(f"shard {shard} listed in ") + ".* is missing"):
        PreparedSet(out)
    manifest = json.loads((out / MANIFEST).read_text())
    manifest["shards"]["train"] = []
    manifest["shards"]["eval"] = manifest["shards"]["eval"][1:]
    (out / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(DataError, match="lists no train examples: the prepared set is empty"):
        PreparedSet(out)
    (out / MANIFEST).unlink()
    with pytest.raises(DataError, match=re.escape(f"{out / MANIFEST} does not exist")):
        PreparedSet(out)


def test_prepare_input_errors(tmp_path, numbered):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n   \n")
    with pytest.raises(DataError, match="contains no sentences"):
        prep.prepare(DataConfig(paths=str(empty), vocab=numbered.config.vocab), tmp_path / "a", workers=0,
                     progress=False, log=quiet)
    few = tmp_path / "few.txt"
    few.write_text("w1 w2 w3.\n\nw4 w5.\n")
    with pytest.raises(DataError, match="2 non-empty documents; need at least 4"):
        prep.prepare(DataConfig(paths=str(few), vocab=numbered.config.vocab), tmp_path / "b", workers=0,
                     progress=False, log=quiet)
    with pytest.raises(DataError, match="does not exist"):
        prep.prepare(DataConfig(paths=str(tmp_path / "nope.txt")), tmp_path / "c", workers=0, progress=False)
    with pytest.raises(DataError, match="workers=-1"):
        prep.prepare(numbered.config, tmp_path / "d", workers=-1)


def test_command_line(numbered, tmp_path, capsys):
    out = tmp_path / "p"
    args = ["--data", numbered.config.paths, "--vocab", numbered.config.vocab, "--seed", "7", "--workers", "0",
            "--no-progress"]
    assert prep.main([*args, "--seq-len", "32", "--out", str(out)]) == 0
    assert PreparedSet(out, seq_len=32, tokenizer=numbered.tok).num_train_examples > 0
    assert prep.main(["--out", str(out), "--verify"]) == 0
    assert "all shards verified" in capsys.readouterr().out
    assert prep.main([*args, "--seq-len", "4", "--out", str(tmp_path / "q")]) == 2
    assert "prepare: error: DataConfig.seq_len" in capsys.readouterr().err
