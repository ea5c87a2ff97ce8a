"""train.py end to end on a small synthetic corpus: outputs, resume equivalence and every bad input."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

import train as cli

ROOT = Path(__file__).resolve().parents[1]
WORDS = ("the cat dog bird sees likes finds a red blue small big house tree river stone walks runs "
         "over under near quickly slowly and but then green old new").split()


def write_corpus(path: Path, docs: int = 60, seed: int = 0) -> Path:
    rng = np.random.RandomState(seed)
    lines = []
    for _ in range(docs):
        for _ in range(rng.randint(4, 9)):
            lines.append(" ".join(rng.choice(WORDS, rng.randint(5, 12))).capitalize() + ".")
        lines.append("")
    path.write_text("\n".join(lines))
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus") / "corpus.txt")


@pytest.fixture(autouse=True)
def tokenizer_cache(tmp_path_factory, monkeypatch):
    """Trained tokenizers are cached here, not in the user's ~/.cache/jaxformer."""
    monkeypatch.setenv("JAXFORMER_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "jaxformer-cache"))


@pytest.fixture(scope="module", autouse=True)
def compilation_cache(tmp_path_factory):
    """The runs here compile the same tiny steps again and again: XLA's persistent cache loads them instead (the
    same executables, so the same numbers)."""
    from jax._src import compilation_cache  # reset_cache: the cache directory is read once per process
    options = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")
    before = {name: getattr(jax.config, name) for name in options}
    jax.config.update("jax_compilation_cache_dir", str(tmp_path_factory.mktemp("xla-cache")))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    compilation_cache.reset_cache()
    yield
    for name, value in before.items():
        jax.config.update(name, value)
    compilation_cache.reset_cache()


def stop_after(monkeypatch, step):
    """As if Ctrl-C came during step `step`: the loop saves a checkpoint there and stops (`Interrupted`)."""
    from jaxformer import loop
    monkeypatch.setattr(loop, "_stop_agreed", lambda requested, s, tc: s == step)


def args(corpus, out, *extra):
    return ["--data", str(corpus), "--out", str(out), "--seq-len", "32", "--batch-size", "8",
            "--vocab-size", "64", "--steps", "6", "--log-every", "1", "--eval-every", "3", "--save-every", "3",
            "--eval-batches", "2", "--warmup-steps", "2", "--data-workers", "0", "--no-progress", *extra]


def metrics(out):
    return [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_cli_writes_metrics_checkpoints_plot(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(args(corpus, out, "--steps", "8", "--lr", "3e-3")) == 0
    records = metrics(out)
    train_lines = [r for r in records if "loss" in r]
    eval_lines = [r for r in records if "eval_mlm_loss" in r]
    assert [r["step"] for r in train_lines] == list(range(1, 9))
    for r in train_lines:
        assert {"step", "loss", "mlm_loss", "nsp_loss", "lr", "seq_per_s"} <= set(r)
        assert np.isfinite(r["loss"]) and r["seq_per_s"] > 0
        assert abs(r["loss"] - r["mlm_loss"] - r["nsp_loss"]) < 1e-4
    assert train_lines[0]["lr"] < train_lines[1]["lr"]  # warm-up
    assert train_lines[-1]["loss"] < train_lines[0]["loss"]  # it learns something
    assert [r["step"] for r in eval_lines] == [3, 6, 8]
    assert all(0 <= r["eval_mlm_acc"] <= 1 and 0 <= r["eval_nsp_acc"] <= 1 for r in eval_lines)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["3", "6", "8"]
    assert (out / "loss.png").stat().st_size > 10_000
    assert (out / "tokenizer.json").exists()
    printed = capsys.readouterr().out
    assert "most-frequent-token baseline" in printed and "--resume" in printed
    assert "step 1: compiling the train step" in printed


@pytest.mark.slow
def test_resume_continues_identically(corpus, tmp_path, monkeypatch, capsys):
    """The losses after a resume (given only --out) equal the uninterrupted run's, step for step, dropout included
    (its key is part of the checkpointed state). The resumed start reads its batches in Grain's worker processes
    (the default), the others in threads: the loader's stream is the same, from the state saved in the checkpoint."""
    full, part = tmp_path / "full", tmp_path / "part"
    assert cli.main(args(corpus, full, "--dropout", "0.1")) == 0
    with monkeypatch.context() as m:
        stop_after(m, 3)
        assert cli.main(args(corpus, part, "--dropout", "0.1")) == 130
    assert "continue with: python train.py --out" in capsys.readouterr().err
    assert cli.main(["--out", str(part), "--resume", "--data-workers", "2"]) == 0
    a = {r["step"]: r["loss"] for r in metrics(full) if "loss" in r}
    b = {r["step"]: r["loss"] for r in metrics(part) if "loss" in r}
    assert sorted(b) == [1, 2, 3, 4, 5, 6]
    assert a == b


@pytest.mark.slow
def test_resume_may_change_how_the_step_runs(corpus, tmp_path, monkeypatch, capsys):
    """--kernels/--remat/--log-every do not change the parameters: a run may resume with other values (logged)."""
    out = tmp_path / "run"
    with monkeypatch.context() as m:
        stop_after(m, 3)
        assert cli.main(args(corpus, out, "--dropout", "0")) == 130
    capsys.readouterr()
    assert cli.main(["--out", str(out), "--resume", "--remat", "full", "--kernels", "xla", "--log-every", "2"]) == 0
    printed = capsys.readouterr().out
    assert "resume with other settings of how the run executes" in printed
    assert "remat: 'none' -> 'full'" in printed and "log_every: 1 -> 2" in printed
    assert sorted(r["step"] for r in metrics(out) if "loss" in r) == [1, 2, 3, 4, 6]


def _expect_error(capsys, argv, needle):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err, err


def test_bad_inputs_exit_2(corpus, tmp_path, capsys):
    out = tmp_path / "bad"
    _expect_error(capsys, args(tmp_path / "missing.txt", out), "missing.txt")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    _expect_error(capsys, args(empty, out), "empty.txt")
    small = write_corpus(tmp_path / "small.txt", docs=6)
    _expect_error(capsys, args(small, out, "--batch-size", "512"), "batch_size=512")
    _expect_error(capsys, args(corpus, out, "--seq-len", "1024"), "seq_len=1024")
    _expect_error(capsys, args(corpus, out, "--batch-size", "12"), "batch_size=12")  # 8 test devices
    _expect_error(capsys, args(corpus, tmp_path / "never", "--resume"), "is not a directory")
    _expect_error(capsys, args(corpus, out, "--config", "medium"), "medium")
    _expect_error(capsys, args(corpus, out, "--steps", "0"), "steps=0")
    _expect_error(capsys, args(corpus, out, "--max-predictions", "999"), "max_predictions=999")
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    _expect_error(capsys, args(corpus, a_file / "run"), "cannot be created as the output directory")
    assert not out.exists()  # a run that fails before its first step leaves no directory behind


def test_vocab_that_does_not_fit(corpus, tmp_path, capsys):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS + ["."]) + "\n")
    _expect_error(capsys, args(corpus, tmp_path / "v", "--vocab", str(vocab), "--vocab-size", "500"),
                  "vocab_size=500")


@pytest.mark.slow
def test_resume_with_other_config_and_undecodable_bytes(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    mixed = tmp_path / "mixed.txt"
    mixed.write_bytes(corpus.read_bytes() + b"\nbad \xff\xfe bytes here.\n\n" + corpus.read_bytes())
    assert cli.main(args(mixed, out, "--steps", "3")) == 0
    assert "skipped 1 lines with undecodable bytes" in capsys.readouterr().out
    _expect_error(capsys, ["--out", str(out), "--resume", "--config", "mini"],
                  "config: the run has 'tiny', given 'mini'")
    assert (out / "checkpoints" / "3").is_dir()  # nothing saved was lost


@pytest.mark.slow
def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(corpus, tmp_path, capsys):
    out = tmp_path / "nan"
    # A learning rate of 1e30 overflows the parameters on the first update: the loss turns non-finite.
    assert cli.main(args(corpus, out, "--lr", "1e30", "--clip-norm", "0", "--warmup-steps", "0", "--steps", "9",
                         "--save-every", "1")) == 2
    err = capsys.readouterr().err
    match = re.search(r"non-finite loss at step (\d+); stopped without saving it \(last good checkpoint: step (\d+)",
                      err)
    assert match, err
    bad, good = int(match.group(1)), int(match.group(2))
    assert 2 <= bad <= 9 and good == bad - 1
    saved = sorted(int(p.name) for p in (out / "checkpoints").iterdir())
    assert saved[-1] == good  # every good step was saved (--save-every 1), the bad one never


@pytest.mark.slow
def test_ctrl_c_saves_and_exits_cleanly(corpus, tmp_path):
    out = tmp_path / "int"
    env = dict(os.environ, PYTHONUNBUFFERED="1", JAX_PLATFORMS="cpu")
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"),
                             *args(corpus, out, "--steps", "100000", "--save-every", "100000")],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while time.time() < deadline and not ((out / "metrics.jsonl").exists() and
                                          (out / "metrics.jsonl").read_text().count("\n") >= 2):
        time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "train.py: interrupted: saved a checkpoint at step" in err and "error" not in err
    assert "Traceback" not in err and "No artists" not in err
    saved = [p.name for p in (out / "checkpoints").iterdir()]
    assert len(saved) == 1 and int(saved[0]) >= 2


@pytest.mark.slow
def test_cli_pallas_kernels_per_device_match_xla(corpus, tmp_path):
    """--kernels pallas on the 8-device data mesh (kernels per shard in shard_map, interpreted on CPU) trains with
    the same losses as --kernels xla, dropout included: the kernels draw the references' masks on every shard."""
    losses = {}
    for kernels in ("xla", "pallas"):
        out = tmp_path / kernels
        vocab = ["--vocab", str(tmp_path / "xla" / "tokenizer.json")] if kernels == "pallas" else []
        assert cli.main(args(corpus, out, "--steps", "2", "--warmup-steps", "1", "--eval-every", "100",
                             "--save-every", "100", "--dtype", "float32", "--kernels", kernels, *vocab)) == 0
        losses[kernels] = [r["loss"] for r in metrics(out) if "loss" in r]
    np.testing.assert_allclose(losses["pallas"], losses["xla"], rtol=2e-4)


def test_output_dir_without_out(tmp_path, monkeypatch):
    """No --out: a new runs/<timestamp>, or with --resume the latest run under runs/ (a directory with a run.json)."""
    from jaxformer import run
    from jaxformer.config import TrainConfig
    from jaxformer.outputs import CheckpointError
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError, match="found no run"):
        run.resume_dir(None)
    fresh = run.prepare(TrainConfig()).path
    assert fresh.parent == Path("runs") and fresh.is_dir() and re.fullmatch(r"\d{8}-\d{6}", fresh.name)
    for name in ("20240101-000000", "20240102-000000"):
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "run.json").write_text("{}")
    assert run.resume_dir(None) == Path("runs/20240102-000000")


@pytest.mark.slow
def test_compile_cache_keeps_the_compiled_step_and_none_turns_it_off(corpus, tmp_path):
    from jax._src import compilation_cache
    from jaxformer.trainer import use_compile_cache
    before = jax.config.jax_compilation_cache_dir
    cache = tmp_path / "xla"
    try:
        assert cli.main(args(corpus, tmp_path / "run", "--steps", "3", "--compile-cache", str(cache))) == 0
        assert jax.config.jax_compilation_cache_dir == str(cache) and len(list(cache.iterdir())) >= 2
        assert use_compile_cache("none") is None and not jax.config.jax_enable_compilation_cache
        assert use_compile_cache(None) == cache and jax.config.jax_enable_compilation_cache  # the one configured
    finally:
        jax.config.update("jax_enable_compilation_cache", True)
        jax.config.update("jax_compilation_cache_dir", before)
        compilation_cache.reset_cache()


def test_metrics_writer_never_imports_torch(tmp_path):
    """Importing torch costs seconds of start-up; the TensorBoard events need only the tensorboard package."""
    code = ("import importlib.util as u, sys; from pathlib import Path; from jaxformer.outputs import MetricsWriter; "
            "w = MetricsWriter(Path(sys.argv[1])); w.write(dict(step=1, loss=2.5)); w.close(); "
            "print(w.tb is not None, 'torch' in sys.modules, u.find_spec('tensorboard') is not None)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                         check=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT))).stdout.split()
    writer, torch_loaded, tensorboard = (x == "True" for x in out)
    assert writer == tensorboard and not torch_loaded


def test_tensorboard_events_hold_the_logged_scalars(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from jaxformer.outputs import MetricsWriter
    w = MetricsWriter(tmp_path)
    for step, loss in ((1, 2.5), (2, 2.25)):
        w.write(dict(step=step, loss=loss, note="text is not a scalar"))
    w.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert acc.Tags()["scalars"] == ["loss"]
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(1, 2.5), (2, 2.25)]


@pytest.mark.slow
def test_a_checkpoint_with_the_earlier_qkv_order_resumes(tmp_path):
    """Checkpoints of runs whose run.json has no params_format (format 1) hold the QKV kernel and its moments as
    (L, C, D, N, H): a resume restores them in that order and converts them, shardings included."""
    from jaxformer import sharding
    from jaxformer.config import TrainConfig
    from jaxformer.outputs import Checkpointer
    from jaxformer.trainer import _swap_qkv, build_state
    tc = TrainConfig(config="tiny", batch_size=8, seq_len=32, steps=4, warmup_steps=1, mesh="data=2,fsdp=2,tensor=2")
    cfg = tc.model_config(64)
    mesh_cfg = sharding.validate(tc.mesh, cfg, tc)
    steps, state, _ = build_state(cfg, mesh_cfg, tc, log=lambda *a: None)
    earlier = jax.jit(_swap_qkv)(steps.checkpointed(state))  # what the loop saves
    qkv = state.params["encoder"]["layers"]["attention"]["qkv_kernel"]
    assert earlier.params["encoder"]["layers"]["attention"]["qkv_kernel"].shape == (2, 3, 128, 2, 64) \
        and qkv.shape == (2, 128, 3, 2, 64)
    ckpt = Checkpointer(tmp_path / "checkpoints")
    try:
        ckpt.save(2, earlier, {})
        _, restored, start = build_state(cfg, mesh_cfg, tc, ckpt, log=lambda *a: None, params_format=1)
    finally:
        ckpt.close()
    assert start == 2
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored)):
        assert a.shape == b.shape and a.sharding == b.sharding and np.array_equal(np.asarray(a), np.asarray(b))
