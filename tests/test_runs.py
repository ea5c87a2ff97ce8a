"""An output directory belongs to one run; --resume keeps what defines the run; --steps extends it without a jump in
the learning rate; bad input is refused (exit 2, field or file and value, no traceback, no directory left)."""

import json
import os
import re
import shutil
import signal
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import train as cli
from test_trainer import WORDS, compilation_cache, metrics, write_corpus  # noqa: F401 (a fixture)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus") / "corpus.txt")


@pytest.fixture(autouse=True)
def tokenizer_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("JAXFORMER_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "jaxformer-cache"))


def args(corpus, out, *extra):
    return ["--data", str(corpus), "--out", str(out), "--seq-len", "16", "--batch-size", "8", "--vocab-size", "64",
            "--steps", "4", "--warmup-steps", "1", "--log-every", "1", "--eval-every", "100", "--save-every", "2",
            "--eval-batches", "1", "--dropout", "0", "--data-workers", "0", "--no-progress", *extra]


def expect_error(capsys, argv, *needles):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, err
    return err


@pytest.fixture(scope="module")
def finished(corpus, tmp_path_factory):
    """A finished 4-step run (checkpoints 2 and 4), trained once for the tests that only read it."""
    out = tmp_path_factory.mktemp("finished") / "run"
    with pytest.MonkeyPatch.context() as m:
        m.setenv("JAXFORMER_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "jaxformer-cache"))
        assert cli.main(args(corpus, out)) == 0
    return out


@pytest.mark.slow
def test_out_belongs_to_one_run_and_overwrite_starts_it_afresh(corpus, finished, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    (out / "notes.txt").write_text("mine")
    before = (out / "metrics.jsonl").read_text()
    expect_error(capsys, args(corpus, out, "--seed", "1"),
                 f"out={str(out)!r} already holds an earlier run: continue it with --resume, start it afresh "
                 "with --overwrite")
    assert (out / "metrics.jsonl").read_text() == before  # nothing of the earlier run was touched
    assert cli.main(args(corpus, out, "--seed", "1", "--overwrite")) == 0
    assert json.loads((out / "run.json").read_text())["train_config"]["seed"] == 1
    assert [r["step"] for r in metrics(out) if "loss" in r] == [1, 2, 3, 4]  # the new run's records only
    assert [r["loss"] for r in metrics(out) if "loss" in r] != [r["loss"] for r in metrics(finished) if "loss" in r]
    assert (out / "notes.txt").read_text() == "mine"  # --overwrite deletes only what a run writes
    capsys.readouterr()

    other = tmp_path / "other"
    other.mkdir()
    (other / "thesis.tex").write_text("precious")
    for flag in ("--overwrite", "--no-progress"):
        expect_error(capsys, args(corpus, other, flag), "is not empty and is not a jaxformer run directory")
    assert (other / "thesis.tex").read_text() == "precious"


def test_resume_refuses_changes_of_what_defines_the_run(corpus, finished, tmp_path, monkeypatch, capsys):
    """Each fixed flag given with another value is refused before any work, naming the stored and given values."""
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    other = write_corpus(tmp_path / "other.txt", docs=20, seed=1)
    resume = ["--out", str(finished), "--resume", "--steps", "8"]
    for flags, needle in [
        (["--data", str(other)], f"data: the run has ['{corpus}'], given ['{other}']"),
        (["--vocab", str(vocab)], f"vocab: the run has None, given '{vocab}'"),
        (["--vocab-size", "128"], "vocab_size: the run has 64, given 128"),
        (["--seq-len", "32"], "seq_len: the run has 16, given 32"),
        (["--batch-size", "16"], "batch_size: the run has 8, given 16"),
        (["--max-predictions", "2"], "max_predictions: the run has 3, given 2"),
        (["--seed", "1"], "seed: the run has 0, given 1"),
        (["--config", "mini"], "config: the run has 'tiny', given 'mini'"),
        (["--dropout", "0.1"], "dropout: the run has 0.0, given 0.1"),
        (["--dtype", "float32"], "dtype: the run has 'bfloat16', given 'float32'"),
        (["--optimizer", "lamb"], "optimizer: the run has 'adamw', given 'lamb'"),
        (["--lr", "1e-3"], "lr: the run has 0.002, given 0.001"),
        (["--schedule", "polynomial"], "schedule: the run has 'linear', given 'polynomial'"),
        (["--warmup-steps", "2"], "warmup_steps: the run has 1, given 2"),
        (["--weight-decay", "0.1"], "weight_decay: the run has 0.01, given 0.1"),
    ]:
        expect_error(capsys, resume + flags, "these settings define the run", needle)
    # The same values again, however spelled, are not a change (defaults spelled out, a relative path).
    monkeypatch.chdir(corpus.parent)
    argv = resume + ["--data", corpus.name, "--lr", "0.002", "--max-predictions", "3", "--vocab-size", "64",
                     "--steps", "3"]
    expect_error(capsys, argv, "the run is at step 4 of 4: steps=3 leaves nothing to do")
    expect_error(capsys, ["--out", str(finished), "--resume"], "--steps N above 4 extends it")
    expect_error(capsys, ["--out", str(finished), "--resume", "--overwrite"], "contradict")


def test_extending_a_run_continues_the_learning_rate(corpus, finished, tmp_path, monkeypatch, capsys):
    """--steps 8 after a finished 4-step run: the rate goes on from the last step's and decays linearly to 0 at 8 (no
    jump); the extended run resumed after an interruption reproduces the uninterrupted extension."""
    from jaxformer import loop
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(finished, a)
    shutil.copytree(finished, b)
    assert cli.main(["--out", str(a), "--resume", "--steps", "8"]) == 0
    lr = {r["step"]: r["lr"] for r in metrics(a) if "lr" in r}
    assert lr[5] == pytest.approx(lr[4], rel=1e-6)  # the rate at step 4 (the run's last) goes on
    for step in (6, 7, 8):  # then straight down to 0 at the new total: lr[5] * (8 - count) / (8 - 4)
        assert lr[step] == pytest.approx(lr[5] * (8 - (step - 1)) / 4, rel=1e-5)
    assert all(lr[s] > lr[s + 1] > 0 for s in (5, 6, 7))
    record = json.loads((a / "run.json").read_text())
    assert record["schedule"] == [[0, 4], [4, 8]] and record["train_config"]["steps"] == 8

    with monkeypatch.context() as m:
        m.setattr(loop, "_stop_agreed", lambda requested, s, tc: s == 6)
        assert cli.main(["--out", str(b), "--resume", "--steps", "8"]) == 130
    assert cli.main(["--out", str(b), "--resume"]) == 0  # run.json's total is now 8
    assert [(r["step"], r["loss"], r["lr"]) for r in metrics(b) if "loss" in r] == \
        [(r["step"], r["loss"], r["lr"]) for r in metrics(a) if "loss" in r]


@pytest.mark.slow
def test_schedule_pieces_and_their_optimizer():
    """Mid-run extension [[0, 6], [3, 10]]: the original rate up to step 3, then from its value there linearly to 0 at
    10. The optimizer's updates are the original's bit for bit before 3 and follow that rate after."""
    from jaxformer import run
    from jaxformer.config import TrainConfig
    from jaxformer.steps import learning_rate_schedule, make_optimizer
    tc = TrainConfig(steps=6, warmup_steps=1, lr=1e-3)
    pieces = [[0, 6], [3, 10]]
    rate, base = run.schedule(tc, pieces), learning_rate_schedule(tc)
    for c in range(3):
        assert float(rate(c)) == float(base(c))
    for c in range(3, 11):
        assert float(rate(c)) == pytest.approx(float(base(3)) * (10 - c) / 7, rel=1e-6, abs=1e-12)
    key = jax.random.key(0)
    params = {"w": jax.random.normal(key, (4, 3)), "bias": jax.random.normal(jax.random.key(1), (3,))}
    plain, extended = make_optimizer(tc), run.optimizer(tc, pieces)
    s_plain, s_ext = plain.init(params), extended.init(params)
    for count in range(6):
        grads = jax.tree.map(lambda p, k=count: jax.random.normal(jax.random.key(10 + k), p.shape), params)
        u_plain, s_plain = plain.update(grads, s_plain, params)
        u_ext, s_ext = extended.update(grads, s_ext, params)
        ratio = float(rate(count)) / float(base(count)) if count else 1.0
        for k in params:
            if count < 3:
                np.testing.assert_array_equal(u_ext[k], u_plain[k])
            else:
                np.testing.assert_allclose(u_ext[k], u_plain[k] * ratio, rtol=1e-5)
    assert jax.tree.structure(s_ext) == jax.tree.structure(s_plain)  # checkpoints restore across extensions


def test_bad_inputs_are_refused_before_any_work(corpus, tmp_path, capsys):
    out = tmp_path / "deep" / "er" / "run"
    binary = tmp_path / "vocab.txt"
    binary.write_bytes(b"[PAD]\n\xff\xfe\x00garbage\n")
    for extra, needles in [
        (["--seed", str(2**63)], ["seed=9223372036854775808 must be an integer in [0, 2147483647]"]),
        (["--clip-norm", "nan"], ["clip_norm=nan must be a finite number >= 0"]),
        (["--weight-decay", "inf"], ["weight_decay=inf must be a finite number >= 0"]),
        (["--warmup-steps", "10"], ["warmup_steps=10 must be below steps=4"]),
        (["--vocab-size", "0"], ["vocab_size=0"]),
        (["--sequence-parallel"], ["sequence_parallel=True needs a tensor axis > 1"]),
        (["--data", "/dev/zero"], ["corpus path /dev/zero is not a regular file"]),
        (["--vocab", str(binary)], [f"vocabulary file {binary} is not UTF-8 text"]),
        (["--vocab", str(tmp_path)], [f"vocabulary {tmp_path} is a directory"]),
    ]:
        expect_error(capsys, args(corpus, out, *extra), *needles)
        assert not (tmp_path / "deep").exists()  # a failed start leaves no directory behind
    expect_error(capsys, args(corpus, ""), "out='' is empty")
    with pytest.raises(SystemExit) as e:
        cli.main(args(corpus, out, "--dtype", "float64"))
    assert e.value.code == 2 and "--dtype: invalid choice: 'float64'" in capsys.readouterr().err
    small = write_corpus(tmp_path / "small.txt", docs=3)
    err = expect_error(capsys, args(small, out), f"corpus {small} has 3 non-empty documents")
    assert "('" not in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to read-only directories")
def test_read_only_out_is_refused(corpus, tmp_path, capsys):
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o555)
    expect_error(capsys, args(corpus, out), f"out={str(out)!r} is not writable")


def test_skipped_corpus_lines_are_counted(tmp_path):
    from jaxformer.config import TrainConfig
    from jaxformer.trainer import load_data
    lines = [json.dumps({"text": " ".join(WORDS[i:i + 8]).capitalize() + ". " + " ".join(WORDS[i + 1:i + 9]) + "."})
             for i in range(20)]
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("\n".join(lines[:10] + ["{not json", '{"text": 3}', "[1]"] + lines[10:]) + "\n")
    logged = []
    load_data(TrainConfig(data=str(corpus), seq_len=16, batch_size=8, vocab_size=64), tmp_path, logged.append)
    assert any("skipped 3 .jsonl lines that are not JSON objects" in line for line in logged), logged


def test_ctrl_c_before_the_loop_stops_cleanly(corpus, tmp_path, monkeypatch, capsys):
    """A Ctrl-C while data loads stops with one line, no traceback and no directory; also when a library swallows
    the KeyboardInterrupt on its way (the run stops at its next stage)."""
    from jaxformer import trainer
    load, handler = trainer.load_data, signal.getsignal(signal.SIGINT)
    for swallowed in (False, True):
        def interrupted_load(*a, **kw):
            try:
                signal.raise_signal(signal.SIGINT)  # runs the handler before it returns
            except KeyboardInterrupt:
                if not swallowed:
                    raise
            return load(*a, **kw)
        monkeypatch.setattr(trainer, "load_data", interrupted_load)
        out = tmp_path / f"run{swallowed}"
        assert cli.main(args(corpus, out)) == 130
        err = capsys.readouterr().err
        assert "train.py: interrupted before training started; nothing was saved" in err and "Traceback" not in err
        assert not out.exists()
        assert signal.getsignal(signal.SIGINT) is handler  # the caller's handler is back


def test_ctrl_c_in_the_loop_asks_to_stop_and_the_next_one_ends_the_process():
    from jaxformer.loop import Interrupts
    handler = signal.getsignal(signal.SIGINT)
    interrupts = Interrupts()
    try:
        interrupts.arm()
        signal.raise_signal(signal.SIGINT)
        assert interrupts.requested
        assert signal.getsignal(signal.SIGINT) is signal.SIG_DFL  # a second Ctrl-C ends the process at once
    finally:
        interrupts.restore()
    assert signal.getsignal(signal.SIGINT) is handler


def test_metrics_are_truncated_to_the_restored_step(tmp_path):
    from jaxformer.outputs import read_metrics, truncate_metrics
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in (1, 2, 3, 4, 3, 4))
                    + '{"step": 5, "lo')  # the line a kill cut short
    assert truncate_metrics(path, 3) == 3  # two later records and the cut line
    assert [r["step"] for r in read_metrics(path)] == [1, 2, 3, 3]


def test_checksum_sees_every_bit_and_no_sharding():
    from jaxformer.outputs import state_checksum
    keys = jax.random.split(jax.random.key(5), 3)
    state = {"a": jax.random.normal(keys[0], (8, 6)), "b": jax.random.normal(keys[1], (5,)).astype(jnp.bfloat16),
             "n": jnp.arange(3, dtype=jnp.int32)}
    digest = state_checksum(state)
    mesh = jax.make_mesh((4, 2), ("x", "y"))
    spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x", "y"))
    sharded = dict(state, a=jax.device_put(state["a"], spec))
    assert state_checksum(sharded) == digest
    for leaf in ("a", "b"):
        bits = np.asarray(state[leaf]).view(np.uint16 if leaf == "b" else np.uint32).copy()
        bits.flat[3] ^= 1 << 3
        flipped = dict(state, **{leaf: jnp.asarray(bits.view(np.asarray(state[leaf]).dtype))})
        assert state_checksum(flipped) != digest
    swapped = dict(state, a=state["a"][::-1])  # the same values elsewhere
    assert state_checksum(swapped) != digest


def test_docs_training_md_names_the_fixed_flags():
    """docs/training.md lists the flags a resume may not change: those of `on_resume="fixed"`."""
    from jaxformer import run
    text = (Path(__file__).resolve().parents[1] / "docs" / "training.md").read_text()
    fixed = text[text.index("* **fixed**"):text.index("* **may change**")]
    assert sorted(re.findall(r"--([a-z-]+)", fixed)) == sorted(f.replace("_", "-") for f in run.FIXED)
