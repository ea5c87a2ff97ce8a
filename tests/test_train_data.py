"""train.py's one data path (jaxformer/run_data.py): a prepared directory is opened without reading any text, raw
text is prepared once into the cache and reused, each checkpoint carries the loader's state, and a prepared set that
does not fit the run is refused (exit 2, naming the file and both values)."""

import json

import pytest

import jaxformer.corpus as corpus_module
import train as cli
from jaxformer import run_data
from jaxformer.data import DataConfig
from jaxformer.prepare import prepare
from jaxformer.prepared import MANIFEST
from test_trainer import WORDS, compilation_cache, metrics, write_corpus  # noqa: F401 (a fixture)

FLAGS = ["--seq-len", "32", "--batch-size", "8", "--steps", "3", "--warmup-steps", "1", "--log-every", "1",
         "--eval-every", "3", "--save-every", "3", "--eval-batches", "1", "--dropout", "0", "--data-workers", "0",
         "--no-progress"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus") / "corpus.txt")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache of prepared sets and tokenizers for each test."""
    monkeypatch.setenv("JAXFORMER_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def prepared(corpus, tmp_path_factory):
    """The corpus prepared by `python -m jaxformer.prepare`'s function: seq_len 32, pair seed 5, 64 tokens."""
    root = tmp_path_factory.mktemp("prepared")
    with pytest.MonkeyPatch.context() as m:
        m.setenv("JAXFORMER_CACHE_DIR", str(root / "cache"))
        prepare(DataConfig(paths=str(corpus), seq_len=32, seed=5, vocab_size=64), root / "set", workers=0,
                progress=False, log=lambda *a: None)
    return root / "set"


def refuse_text(monkeypatch):
    """Any reading of corpus text, tokenizer training or preparation fails the test."""
    def fail(*args, **kwargs):
        raise AssertionError("the run read text, trained a tokenizer or prepared data")
    for module, name in ((corpus_module, "_iter_lines"), (corpus_module, "_train"), (run_data, "prepare")):
        monkeypatch.setattr(module, name, fail)


def losses(out):
    return [r["loss"] for r in metrics(out) if "loss" in r]


def expect_error(capsys, argv, *needles):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, err


@pytest.mark.slow
def test_a_prepared_set_trains_without_reading_text(prepared, cache, tmp_path, monkeypatch, capsys):
    refuse_text(monkeypatch)
    manifest = json.loads((prepared / MANIFEST).read_text())
    out = tmp_path / "run"
    assert cli.main(["--data", str(prepared), "--out", str(out), *FLAGS]) == 0
    printed = capsys.readouterr().out
    assert f"data: prepared set {prepared}" in printed
    assert "NSP pairs made with seed 5 (pair_seed), order and masking from --seed 0" in printed
    assert "step 1: compiling the train step" in printed and "s after the start" in printed
    assert len(losses(out)) == 3
    assert (out / "tokenizer.json").read_bytes() == (prepared / "tokenizer.json").read_bytes()
    record = json.loads((out / "run.json").read_text())
    assert record["corpus"] == [[str(prepared), manifest["inputs"]["sha256"], 5]]
    assert record["train_config"]["vocab_size"] == manifest["vocab_size"]
    assert not cache.exists()  # nothing was prepared or cached
    assert cli.main(["--out", str(out), "--resume", "--steps", "4"]) == 0  # a resume reads no text either
    assert [r["step"] for r in metrics(out) if "loss" in r] == [1, 2, 3, 4]

    # A prepared set that does not fit the run: refused before any model work, naming the manifest and both values.
    where = prepared / MANIFEST
    bad = tmp_path / "bad"
    expect_error(capsys, ["--data", str(prepared), "--out", str(bad), *FLAGS, "--seq-len", "64"],
                 f"{where} was prepared with seq_len 32; the run asks for seq_len 64")
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, "."]) + "\n")
    expect_error(capsys, ["--data", str(prepared), "--out", str(bad), "--vocab", str(vocab), *FLAGS],
                 f"{where} was prepared with a different tokenizer ({manifest['vocab_size']} tokens, sha256 ",
                 f"than the run's ({len(WORDS) + 6} tokens, sha256 ")
    expect_error(capsys, ["--data", str(prepared), "--out", str(bad), "--vocab-size", "128", *FLAGS],
                 f"vocab_size=128 was given, but {where} holds the ids of a {manifest['vocab_size']}-token tokenizer")
    assert not bad.exists()


def test_text_is_prepared_once_then_reused(corpus, cache, tmp_path, monkeypatch, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    assert cli.main(["--data", str(corpus), "--out", str(a), "--vocab-size", "64", *FLAGS]) == 0
    printed = capsys.readouterr().out
    (entry,) = [p for p in (cache / "prepared").iterdir() if p.is_dir()]
    assert f"data: preparing the text into {entry}" in printed
    assert "NSP pairs made with seed 0 (pair_seed)" in printed
    with monkeypatch.context() as m:  # another run on the same text: the cached set, no reading or tokenizing
        refuse_text(m)
        assert cli.main(["--data", str(corpus), "--out", str(b), "--vocab-size", "64", *FLAGS]) == 0
    assert f"data: prepared before, opened from the cache: {entry}" in capsys.readouterr().out
    assert losses(a) == losses(b)

    # Each checkpoint holds the loader's state at its step; a resume continues from it and checks that it is this
    # run's data stream.
    meta_file = a / "checkpoints" / "3" / "meta" / "metadata"
    meta = json.loads(meta_file.read_text())
    assert meta["data_state"]["step"] == 3 and meta["data_state"]["seed"] == 0
    meta["data_state"]["seed"] = 9
    meta_file.write_text(json.dumps(meta))
    expect_error(capsys, ["--out", str(a), "--resume", "--steps", "5"],
                 "the data iterator state was saved for another data stream: seed: saved 9, now 0")
