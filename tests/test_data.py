"""Tests for BERT MLM + NSP pre-training data: corpus reading, the tokenizer, and the examples that a prepared set
(jaxformer.prepare) and the loader (jaxformer.loader) make of a corpus."""
import json
import os
import random
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

import jaxformer.corpus as corpus_module
from jaxformer import loader
from jaxformer.data import (SPECIAL_TOKENS, CorpusStats, DataConfig, DataError, Prefetcher, builtin_corpus,
                            iter_documents, load_or_train_tokenizer, special_token_ids, split_sentences)
from jaxformer.prepare import prepare
from jaxformer.prepared import PreparedSet

SEQ_LEN = 32
N_SPECIAL = len(SPECIAL_TOKENS)


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A corpus whose every word ``w<n>`` is unique and numbered in reading order.

    With a word-level vocab.txt, token id = n + 5, so any stretch of consecutive text is a run
    of consecutive ids and every token tells which document it came from.
    """
    root = tmp_path_factory.mktemp("corpus")
    rng = random.Random(1234)
    docs, n = [], 0
    for _ in range(240):
        doc = []
        for _ in range(rng.randint(1, 8)):
            k = rng.randint(2, 12)
            doc.append([f"w{n + i}" for i in range(k)])
            n += k
        docs.append(doc)
    path = root / "corpus.txt"
    path.write_text("\n\n".join("\n".join(" ".join(s) for s in doc) for doc in docs) + "\n")
    vocab = root / "vocab.txt"
    vocab.write_text("\n".join(list(SPECIAL_TOKENS) + [f"w{i}" for i in range(n)]) + "\n")
    doc_of = np.concatenate([np.full(sum(map(len, doc)), d) for d, doc in enumerate(docs)])
    return SimpleNamespace(path=path, vocab=vocab, n_words=n, doc_of=doc_of, n_docs=len(docs))


@pytest.fixture(scope="module")
def tok(corpus):
    return load_or_train_tokenizer(vocab=corpus.vocab)


@pytest.fixture(scope="module")
def config(corpus):
    return DataConfig(paths=str(corpus.path), seq_len=SEQ_LEN, eval_fraction=0.1, seed=7, vocab=str(corpus.vocab))


def prepared(config, tok, out) -> PreparedSet:
    prepare(config, out, workers=0, progress=False, log=lambda *a: None)
    return PreparedSet(out, seq_len=config.seq_len, tokenizer=tok)


@pytest.fixture(scope="module")
def data(config, tok, tmp_path_factory):
    return prepared(config, tok, tmp_path_factory.mktemp("prepared"))


def train_batches(data, batch_size, n, start=0, seed=7):
    """Batches start .. start + n - 1 of the loader (seed 7: `config`'s, which made the pairs)."""
    with loader.train_batches(data, batch_size, seed, start_step=start, workers=0) as it:
        return [next(it) for _ in range(n)]


def unmask(batch):
    """Original token ids: put the masked labels back."""
    ids = batch["input_ids"].copy()
    rows, slots = np.nonzero(batch["masked_weights"])
    ids[rows, batch["masked_positions"][rows, slots]] = batch["masked_labels"][rows, slots]
    return ids


def segments(batch):
    """Per row: (word numbers of A, word numbers of B, nsp label) from the unmasked ids."""
    out = []
    for ids, length, types, nsp in zip(unmask(batch), batch["attention_mask"].sum(1),
                                       batch["token_type_ids"], batch["nsp_labels"]):
        la = int((types[:length] == 0).sum()) - 2  # [CLS] A [SEP] are type 0
        out.append((ids[1:la + 1] - N_SPECIAL, ids[la + 2:length - 1] - N_SPECIAL, int(nsp)))
    return out


def epoch_batches(data, batch_size, epoch=0):
    spe = loader.steps_per_epoch(data, batch_size)
    return train_batches(data, batch_size, spe, start=epoch * spe)


def assert_same_batch(a, b):
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


# ----------------------------------------------------------------------------- corpus reading
def test_split_sentences():
    text = 'See e.g. the docs.  Then go!\n3 items? "Quoted" start. Version 3.11 is fine. lower. Up'
    assert split_sentences(text) == ["See e.g. the docs.", "Then go!", "3 items?",
                                     '"Quoted" start.', "Version 3.11 is fine. lower.", "Up"]


def test_text_format_documents_and_stats(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("First one.\nSecond one.\n\n\n  \nThird one.\n")
    stats = CorpusStats()
    assert list(iter_documents(path, stats)) == [["First one.", "Second one."], ["Third one."]]
    assert (stats.files, stats.documents, stats.sentences) == (1, 2, 3)


def test_undecodable_lines_skipped_and_counted(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"good line\nbad \xff\xfe line\nalso good\n\nnext \xc3\xa9 doc\n\xff\n")
    stats = CorpusStats()
    assert list(iter_documents(path, stats)) == [["good line", "also good"], ["next \u00e9 doc"]]
    assert stats.undecodable_lines == 2
    assert "skipped 2 undecodable lines" in stats.summary()


def test_jsonl_input(tmp_path):
    path = tmp_path / "c.jsonl"
    lines = [json.dumps({"text": "The first sentence. Then a second one! Is it 3? 4 is a digit."}),
             "not json at all", json.dumps({"body": "no text field"}), "",
             json.dumps({"text": "Dr. Smith wrote e.g. this. \u201cQuoted\u201d start."})]
    path.write_text("\n".join(lines) + "\n")
    stats = CorpusStats()
    docs = list(iter_documents(path, stats))
    assert docs == [["The first sentence.", "Then a second one!", "Is it 3?", "4 is a digit."],
                    ["Dr. Smith wrote e.g. this.", "\u201cQuoted\u201d start."]]
    assert stats.malformed_lines == 2 and stats.documents == 2


def test_directory_and_glob_input(tmp_path):
    (tmp_path / "sub" / ".git").mkdir(parents=True)
    (tmp_path / "b.txt").write_text("from b\n")
    (tmp_path / "a.txt").write_text("from a\n")
    (tmp_path / "sub" / "c.jsonl").write_text(json.dumps({"text": "From c."}) + "\n")
    (tmp_path / ".hidden.txt").write_text("hidden\n")
    (tmp_path / "sub" / ".git" / "x").write_text("hidden too\n")
    assert list(iter_documents(tmp_path)) == [["from a"], ["from b"], ["From c."]]
    assert list(iter_documents(str(tmp_path / "*.txt"))) == [["from a"], ["from b"]]
    assert list(iter_documents(str(tmp_path / "**" / "*.jsonl"))) == [["From c."]]
    assert list(iter_documents([tmp_path / "b.txt", tmp_path / "a.txt"])) == [["from b"], ["from a"]]


def test_corpus_errors(tmp_path):
    with pytest.raises(DataError, match="nope.txt does not exist"):
        iter_documents(tmp_path / "nope.txt")
    with pytest.raises(DataError, match="matched no files"):
        iter_documents(str(tmp_path / "*.missing"))
    (tmp_path / "empty.txt").write_text("\n\n  \n")
    with pytest.raises(DataError, match="empty.txt contains no sentences"):
        list(iter_documents(tmp_path / "empty.txt"))
    (tmp_path / "only_hidden").mkdir()
    (tmp_path / "only_hidden" / ".x").write_text("a\n")
    with pytest.raises(DataError, match="only_hidden contains no"):
        iter_documents(tmp_path / "only_hidden")


def test_unreadable_file_error(tmp_path, monkeypatch):
    (tmp_path / "locked.txt").write_text("text\n")

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(corpus_module, "open", denied, raising=False)  # root ignores chmod
    with pytest.raises(DataError, match="cannot read corpus file .*locked.txt: Permission denied"):
        list(iter_documents(tmp_path / "locked.txt"))


# ----------------------------------------------------------------------------- tokenizer
def test_vocab_txt_loading_and_lowercase(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", "##s"]))
    lower = load_or_train_tokenizer(vocab=vocab)
    assert lower.encode("Hello worlds", add_special_tokens=False).ids == [5, 6, 7]
    assert lower.encode("hello", "world").ids == [2, 5, 3, 6, 3]  # [CLS] A [SEP] B [SEP]
    cased = load_or_train_tokenizer(vocab=vocab, lowercase=False)
    assert cased.encode("Hello worlds", add_special_tokens=False).ids == [1, 6, 7]
    ids = special_token_ids(lower)
    assert (ids.pad, ids.unk, ids.cls, ids.sep, ids.mask) == (0, 1, 2, 3, 4)


def test_vocab_lacking_mask_is_rejected(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n")
    with pytest.raises(DataError, match=r"vocab.txt lacks special tokens \['\[MASK\]'\]"):
        load_or_train_tokenizer(vocab=vocab)
    with pytest.raises(DataError, match="does not exist"):
        load_or_train_tokenizer(vocab=tmp_path / "missing.txt")


def test_tokenizer_training_saves_and_reuses(tmp_path):
    rng = random.Random(0)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa", "lambda"]
    text = "\n\n".join("\n".join(" ".join(rng.choice(words) + rng.choice(["", "s", "ing"])
                                          for _ in range(8)) for _ in range(5)) for _ in range(40))
    (tmp_path / "c.txt").write_text(text)
    save = tmp_path / "tok"
    trained = load_or_train_tokenizer(corpus_paths=tmp_path / "c.txt", vocab_size=120, save_dir=save)
    assert trained.token_to_id("[PAD]") == 0 and special_token_ids(trained).mask == 4
    assert trained.get_vocab_size() <= 120 and trained.token_to_id("alpha") is not None
    saved = save / "tokenizer.json"
    mtime = saved.stat().st_mtime_ns
    again = load_or_train_tokenizer(corpus_paths=tmp_path / "c.txt", vocab_size=120, save_dir=save)
    assert saved.stat().st_mtime_ns == mtime  # reused, not retrained
    assert again.get_vocab() == trained.get_vocab()
    from_file = load_or_train_tokenizer(vocab=saved)
    assert from_file.encode("Alphas gamma").ids == trained.encode("Alphas gamma").ids
    load_or_train_tokenizer(corpus_paths=tmp_path / "c.txt", vocab_size=100, save_dir=save)
    assert saved.stat().st_mtime_ns != mtime  # different settings: retrained


# ----------------------------------------------------------------------------- examples
def test_config_validation():
    for kwargs, field in [({"seq_len": 4}, "seq_len"), ({"mask_prob": 1.5}, "mask_prob"),
                          ({"eval_fraction": 0.0}, "eval_fraction"), ({"seed": -1}, "seed"),
                          ({"seq_len": 32, "max_predictions_per_seq": 30}, "max_predictions_per_seq"),
                          ({"short_seq_prob": -0.1}, "short_seq_prob")]:
        with pytest.raises(DataError, match=f"DataConfig.{field} has a nonsense value"):
            DataConfig(**kwargs)
    with pytest.raises(DataError, match="DataConfig.mask_prob has a nonsense value 'high'"):
        DataConfig(mask_prob="high")
    assert DataConfig().max_predictions == 20 and DataConfig(seq_len=512).max_predictions == 77


def test_batch_shapes_dtypes_and_layout(data, tok, config):
    (batch,) = train_batches(data, 16, 1)
    p = config.max_predictions
    expected = {"input_ids": ((16, SEQ_LEN), np.int32), "token_type_ids": ((16, SEQ_LEN), np.int32),
                "attention_mask": ((16, SEQ_LEN), np.int32), "masked_positions": ((16, p), np.int32),
                "masked_labels": ((16, p), np.int32), "masked_weights": ((16, p), np.float32),
                "nsp_labels": ((16,), np.int32)}
    assert {k: (v.shape, v.dtype) for k, v in batch.items()} == expected
    ids, sp = unmask(batch), special_token_ids(tok)
    for row in range(16):
        length = int(batch["attention_mask"][row].sum())
        assert np.array_equal(batch["attention_mask"][row], np.arange(SEQ_LEN) < length)
        assert ids[row, 0] == sp.cls and ids[row, length - 1] == sp.sep
        assert (ids[row, length:] == 0).all() and (batch["token_type_ids"][row, length:] == 0).all()
        seps = np.flatnonzero(ids[row, :length] == sp.sep)
        assert len(seps) == 2
        types = batch["token_type_ids"][row, :length]
        assert (types[:seps[0] + 1] == 0).all() and (types[seps[0] + 1:] == 1).all()
        n = int(batch["masked_weights"][row].sum())
        assert np.array_equal(batch["masked_weights"][row], np.arange(p) < n)  # real slots first
        assert (np.diff(batch["masked_positions"][row, :n]) > 0).all()
        assert (batch["masked_positions"][row, n:] == 0).all() and (batch["masked_labels"][row, n:] == 0).all()


def test_masking_statistics(data, tok, config):
    sp = special_token_ids(tok)
    eligible = masked = n_mask = n_same = n_random = 0
    for batch in train_batches(data, 64, 40):
        length = batch["attention_mask"].sum(1)
        weights = batch["masked_weights"] > 0
        # Exactly round(15%) of the non-special tokens, at least 1, at most max_predictions.
        expected = np.clip(np.rint((length - 3) * 0.15), 1, config.max_predictions)
        np.testing.assert_array_equal(weights.sum(1), expected)
        eligible += int((length - 3).sum())
        masked += int(weights.sum())
        rows, slots = np.nonzero(weights)
        pos = batch["masked_positions"][rows, slots]
        labels = batch["masked_labels"][rows, slots]
        now = batch["input_ids"][rows, pos]
        assert (labels >= N_SPECIAL).all()  # never [CLS]/[SEP]/[PAD] (nor other specials)
        assert ((pos > 0) & (pos < length[rows] - 1)).all()
        n_mask += int((now == sp.mask).sum())
        n_same += int((now == labels).sum())
        random_ids = now[(now != sp.mask) & (now != labels)]
        n_random += len(random_ids)
        assert (random_ids >= N_SPECIAL).all() and (random_ids < tok.get_vocab_size()).all()
    assert masked > 5000
    assert abs(masked / eligible - 0.15) < 0.01  # per-row rounding moves it a little
    assert abs(n_mask / masked - 0.8) < 0.025
    assert abs(n_same / masked - 0.1) < 0.02
    assert abs(n_random / masked - 0.1) < 0.02


def test_masked_labels_are_the_original_tokens(data):
    checked = 0
    for batch in train_batches(data, 64, 5) + loader.eval_batches(data, 64, seed=7):
        for a, b, _ in segments(batch):
            # Each segment is contiguous text, i.e. consecutive word numbers; a wrong label at a
            # masked position would break the run.
            assert np.array_equal(a, a[0] + np.arange(len(a)))
            assert np.array_equal(b, b[0] + np.arange(len(b)))
            checked += 1
    assert checked > 300


def test_nsp_balance_and_is_next_is_consecutive_text(data, corpus):
    rows = [seg for batch in epoch_batches(data, 32) for seg in segments(batch)]
    labels = np.array([nsp for _, _, nsp in rows])
    assert len(rows) > 400 and 0.43 < labels.mean() < 0.57
    exact = 0
    for a, b, nsp in rows:
        doc_a, doc_b = corpus.doc_of[a], corpus.doc_of[b]
        assert (doc_a == doc_a[0]).all() and (doc_b == doc_b[0]).all()
        if nsp == 0:  # IsNext: B follows A in the same document (truncation may cut between)
            assert doc_a[0] == doc_b[0] and b[0] > a[-1]
            exact += b[0] == a[-1] + 1
        else:
            assert doc_a[0] != doc_b[0]
    assert exact > 0.6 * (labels == 0).sum()  # the rest lost tokens to truncation at the seam


def test_pairs_are_a_function_of_the_pair_seed(data, config, tok, tmp_path):
    """The same corpus and seed prepare the same rows; another seed other NSP pairs (same documents and eval
    split)."""
    same = prepared(config, tok, tmp_path / "same")
    other = prepared(DataConfig(**{**config.__dict__, "seed": 8}), tok, tmp_path / "other")
    for split in ("train", "eval"):
        rows = np.arange(len(data.rows[split]))
        assert same.rows[split].read(rows).tobytes() == data.rows[split].read(rows).tobytes()
    assert (same.pair_seed, other.pair_seed) == (7, 8)
    assert data.manifest["counts"]["documents"] == other.manifest["counts"]["documents"]
    n = min(data.num_train_examples, other.num_train_examples)
    assert not np.array_equal(data.rows["train"].read(np.arange(n))["ids"],
                              other.rows["train"].read(np.arange(n))["ids"])


def test_fresh_masking_and_order_each_epoch(data):
    def by_example(epoch):
        out = {}
        for batch in epoch_batches(data, 16, epoch):
            for orig, positions in zip(unmask(batch), batch["masked_positions"]):
                out[orig.tobytes()] = positions.tobytes()
        return out
    first, second = by_example(0), by_example(1)
    assert list(first) != list(second)  # reshuffled
    common = first.keys() & second.keys()
    assert len(common) > 0.8 * len(first)
    assert sum(first[k] != second[k] for k in common) > 0.7 * len(common)


def test_start_step_resumes_at_the_same_batch(data):
    spe = loader.steps_per_epoch(data, 16)
    run = train_batches(data, 16, spe + 3)
    for start in (3, spe + 1):
        resumed = train_batches(data, 16, 2, start=start)
        assert_same_batch(resumed[0], run[start])
        assert_same_batch(resumed[1], run[start + 1])
    with loader.train_batches(data, 16, 7, start_step=spe - 1, workers=0) as it, Prefetcher(it, depth=2) as pre:
        for expected in run[spe - 1:spe + 2]:
            assert_same_batch(next(pre), expected)


def test_eval_split_is_disjoint_and_fixed(data, corpus):
    train_docs = {int(corpus.doc_of[w]) for batch in epoch_batches(data, 16)
                  for a, b, _ in segments(batch) for w in (*a, *b)}
    batches = loader.eval_batches(data, 16, seed=7)
    assert len(batches) == -(-data.num_eval_examples // 16)
    assert all(b["input_ids"].shape == (16, SEQ_LEN) for b in batches)
    eval_docs = {int(corpus.doc_of[w]) for batch in batches for a, b, _ in segments(batch) for w in (*a, *b)}
    assert len(eval_docs) >= 2 and not eval_docs & train_docs
    assert len(train_docs) > 0.8 * corpus.n_docs
    for a, b in zip(batches, loader.eval_batches(data, 16, seed=7)):
        assert_same_batch(a, b)


def test_most_frequent_token_baseline(data):
    (batch,) = loader.eval_batches(data, data.num_eval_examples, seed=7)
    labels = batch["masked_labels"][batch["masked_weights"] > 0]
    baseline = loader.most_frequent_token_baseline(data, seed=7)
    assert baseline == pytest.approx(np.bincount(labels).max() / len(labels))
    assert 0.0 < baseline < 0.5


def test_literal_special_tokens_in_text_are_not_structure(tmp_path, tok, corpus):
    path = tmp_path / "c.txt"
    path.write_text("\n\n".join(f"w{i} [SEP] w{i + 1}\nw{i + 2} [MASK] [CLS]" for i in range(0, 80, 3)))
    data = prepared(DataConfig(paths=str(path), seq_len=16, eval_fraction=0.2, vocab=str(corpus.vocab)), tok,
                    tmp_path / "p")
    with loader.train_batches(data, 8, workers=0) as it:
        batch = next(it)
    seps = (unmask(batch) == special_token_ids(tok).sep).sum(1)
    assert (seps == 2).all()


# ----------------------------------------------------------------------------- prefetcher
def test_prefetcher_wait_accounting():
    def slow():
        for i in range(5):
            time.sleep(0.05)
            yield i
    with Prefetcher(slow(), depth=2) as pre:
        assert list(pre) == [0, 1, 2, 3, 4]
        assert 0.15 < pre.wait_seconds < 1.0 and pre.num_items == 5
        assert 0.0 < pre.last_wait_seconds <= pre.wait_seconds
    with Prefetcher(iter(range(5)), depth=2) as pre:
        time.sleep(0.05)
        got = []
        for item in pre:
            got.append(item)
            time.sleep(0.03)  # a slow consumer: the producer keeps ahead
        assert got == list(range(5)) and pre.wait_seconds < 0.05


def test_prefetcher_propagates_exceptions_and_closes():
    def failing():
        yield 1
        yield 2
        raise RuntimeError("producer boom")
    pre = Prefetcher(failing())
    assert next(pre) == 1 and next(pre) == 2
    with pytest.raises(RuntimeError, match="producer boom"):
        next(pre)
    pre.close()

    def endless():
        i = 0
        while True:
            yield i
            i += 1
    before = threading.active_count()
    pre = Prefetcher(endless(), depth=3)
    assert [next(pre) for _ in range(3)] == [0, 1, 2]
    pre.close()
    assert not pre._thread.is_alive() and threading.active_count() == before
    with pytest.raises(StopIteration):
        next(pre)


# ----------------------------------------------------------------------------- built-in corpus
@pytest.fixture(scope="module")
def builtin(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    start = time.perf_counter()
    path = builtin_corpus(cache)
    return SimpleNamespace(cache=cache, path=path, seconds=time.perf_counter() - start)


def test_builtin_corpus_builds_offline_and_is_cached(builtin):
    assert builtin.seconds < 30
    assert builtin.path.parent == builtin.cache and builtin.path.name.startswith("builtin_corpus_py")
    assert os.listdir(builtin.cache) == [builtin.path.name]  # temp files cleaned up
    stats = CorpusStats()
    docs = list(iter_documents(builtin.path, stats))
    assert stats.documents > 3000 and stats.sentences > 10000 and builtin.path.stat().st_size > 1_000_000
    lines = [s for doc in docs for s in doc]
    assert not any(s.startswith((">>>", "...", "def ", ".. ")) for s in lines)
    assert any("iterator" in s for s in lines) and all(len(s.split()) >= 4 for s in lines)
    mtime = builtin.path.stat().st_mtime_ns
    assert builtin_corpus(builtin.cache) == builtin.path and builtin.path.stat().st_mtime_ns == mtime


def test_builtin_corpus_is_deterministic(builtin, tmp_path):
    assert builtin_corpus(tmp_path).read_bytes() == builtin.path.read_bytes()


def test_prepared_builtin_corpus(builtin, tmp_path):
    config = DataConfig(cache_dir=builtin.cache, vocab_size=4000, seq_len=64)
    prepare(config, tmp_path / "p", workers=0, progress=False, log=lambda *a: None)
    data = PreparedSet(tmp_path / "p", seq_len=64)
    assert (tmp_path / "p" / "tokenizer.json").is_file() and data.vocab_size <= 4000
    assert data.num_train_examples > 5000 and data.num_eval_examples > 50
    with loader.train_batches(data, 32, workers=0) as it:
        batch = next(it)
    assert batch["input_ids"].shape == (32, 64) and batch["masked_weights"].sum() >= 32
    assert 0.0 < loader.most_frequent_token_baseline(data) < 0.2
