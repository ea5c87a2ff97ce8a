"""Multi-process training: two train.py processes on localhost (4 CPU devices each, gloo collectives) against one
process with 8 devices, and the checks of the start-up settings (jaxformer/distributed.py)."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import train as cli
from jaxformer import distributed
from jaxformer.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
WORDS = ("the cat dog bird sees likes finds a red blue small big house tree river stone walks runs "
         "over under near quickly slowly and but then green old new").split()
NO_ENV = {"JAXFORMER_COORDINATOR", "JAXFORMER_NUM_PROCESSES", "JAXFORMER_PROCESS_ID", "SLURM_JOB_ID",
          "SLURM_NTASKS", "SLURM_STEP_NODELIST"}


@pytest.fixture
def clean_env(monkeypatch):
    for var in NO_ENV:
        monkeypatch.delenv(var, raising=False)


def _inputs(tmp: Path) -> tuple[Path, Path]:
    rng = np.random.RandomState(0)
    lines = []
    for _ in range(60):
        for _ in range(rng.randint(4, 9)):
            lines.append(" ".join(rng.choice(WORDS, rng.randint(5, 12))).capitalize() + ".")
        lines.append("")
    corpus = tmp / "corpus.txt"
    corpus.write_text("\n".join(lines))
    # A fixed vocabulary: WordPiece training is not reproducible, and the two runs compared must share a tokenizer.
    vocab = tmp / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS + ["."]) + "\n")
    return corpus, vocab


def _args(corpus, vocab, out, *extra):
    return ["--data", str(corpus), "--vocab", str(vocab), "--out", str(out), "--seq-len", "32", "--batch-size", "8",
            "--steps", "4", "--log-every", "1", "--eval-every", "2", "--save-every", "100", "--eval-batches", "2",
            "--warmup-steps", "1", "--dropout", "0", "--dtype", "float32", "--kernels", "xla", "--mesh", "data=8",
            "--data-workers", "0", "--no-progress", *extra]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _two_processes(flags: list[str], devices: int, caches: list[Path] | None = None) -> list[tuple[str, str]]:
    """train.py `flags` run as processes 0 and 1 of one run on `devices` CPU devices each (with `caches`, a cache
    directory of its own each): their (stdout, stderr), both having exited 0."""
    env = {k: v for k, v in os.environ.items() if k not in NO_ENV}
    # The parent's 8-device XLA flag, if conftest fell back to it, must not leak in.
    env.update(JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES=str(devices), PYTHONUNBUFFERED="1",
               XLA_FLAGS=" ".join(f for f in env.get("XLA_FLAGS", "").split()
                                  if not f.startswith("--xla_force_host_platform_device_count")))
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, str(ROOT / "train.py"), *flags, "--coordinator", f"localhost:{port}",
                               "--num-processes", "2", "--process-id", str(i)],
                              cwd=ROOT, env=dict(env, **({"JAXFORMER_CACHE_DIR": str(caches[i])} if caches else {})),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in (0, 1)]
    try:
        outputs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_, err) in zip(procs, outputs):
        assert p.returncode == 0, err[-3000:]
    return outputs


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_two_processes_train_like_one(tmp_path, clean_env, monkeypatch):
    corpus, vocab = _inputs(tmp_path)
    multi, single = tmp_path / "multi", tmp_path / "single"
    # Each process has a cache of its own (as on hosts that share none): process 1 prepares its own copy of the
    # corpus, which must be the same bytes as process 0's.
    monkeypatch.setenv("JAXFORMER_CACHE_DIR", str(tmp_path / "cache0"))
    outputs = _two_processes(_args(corpus, vocab, multi), devices=4,
                             caches=[tmp_path / f"cache{i}" for i in (0, 1)])
    assert "on 8 cpu device(s), mesh data=8" in outputs[0][0]
    assert "== done ==" in outputs[0][0] and "== done ==" not in outputs[1][0]
    assert "data:" not in outputs[1][0] and "model:" not in outputs[1][0]  # process 1 logs nothing
    (set0,), (set1,) = ([p for p in (tmp_path / f"cache{i}" / "prepared").iterdir() if p.is_dir()] for i in (0, 1))
    assert set0.name == set1.name
    assert [(p.name, p.read_bytes()) for p in sorted(set0.glob("*.npy"))] == \
        [(p.name, p.read_bytes()) for p in sorted(set1.glob("*.npy"))]

    # The reference: this process, 8 devices (conftest), one process, the same flags.
    assert cli.main(_args(corpus, vocab, single)) == 0
    got, want = _metrics(multi), _metrics(single)
    # Only process 0 wrote (both append to the same file): each record once, in order.
    assert [(r["step"], "loss" in r) for r in got] == [(r["step"], "loss" in r) for r in want]
    assert [r["step"] for r in got if "loss" in r] == [1, 2, 3, 4]
    keys = ("loss", "mlm_loss", "nsp_loss", "grad_norm", "mlm_acc", "nsp_acc", "eval_mlm_loss", "eval_mlm_acc",
            "eval_nsp_acc")
    for g, w in zip(got, want):
        for k in (k for k in keys if k in w):
            # fp32; only the order of the cross-device sums differs (gloo across processes vs in-process)
            np.testing.assert_allclose(g[k], w[k], rtol=1e-5, err_msg=f"step {w['step']} {k}")
    losses = [r["loss"] for r in got if "loss" in r]
    assert losses[-1] != losses[0]  # it trained
    # One checkpoint (orbax: every process saves, the files are written once), one tokenizer, one plot.
    assert sorted(p.name for p in (multi / "checkpoints").iterdir()) == ["4"]
    assert (multi / "tokenizer.json").is_file() and (multi / "loss.png").is_file()
    assert sorted(p.name for p in multi.iterdir()) == sorted(p.name for p in single.iterdir())


@pytest.mark.slow
def test_two_processes_train_with_compressed_gradients(tmp_path, clean_env):
    """--grad-compression over data=2, one device per process: the exchange's per-rank state is created in its
    sharding across the processes (Steps.place keeps it) and its all-to-all and all-gather run over gloo."""
    corpus, vocab = _inputs(tmp_path)
    out = tmp_path / "run"
    # The flags given last win: 2 steps, one checkpoint, data=2.
    _two_processes(_args(corpus, vocab, out, "--steps", "2", "--eval-every", "100", "--save-every", "2",
                         "--mesh", "data=2", "--grad-compression", "topk-balanced", "--compression-min-size", "1024"),
                   devices=1)
    records = [r for r in _metrics(out) if "loss" in r]
    assert [r["step"] for r in records] == [1, 2] and all(r["compression_selected"] > 0 for r in records)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["2"]


# ------------------------------------------------------------------------------------------ start-up settings
def test_resolve_flags_env_and_slurm():
    assert distributed.resolve(environ={}) is None
    spec = distributed.resolve("node0:1234", 4, 3, environ={})
    assert (spec.coordinator, spec.num_processes, spec.process_id, spec.slurm) == ("node0:1234", 4, 3, False)
    env = {"JAXFORMER_COORDINATOR": "h:99", "JAXFORMER_NUM_PROCESSES": "2", "JAXFORMER_PROCESS_ID": "1"}
    assert distributed.resolve(environ=env) == distributed.Spec("h:99", 2, 1)
    assert distributed.resolve(process_id=0, environ=env) == distributed.Spec("h:99", 2, 0)  # the flag wins
    assert distributed.resolve(num_processes=1, environ={}) is None  # one process: nothing to join
    slurm = {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4", "SLURM_STEP_NODELIST": "n[1-4]"}
    assert distributed.resolve(environ=slurm) == distributed.Spec(slurm=True)
    assert distributed.resolve(environ=dict(slurm, SLURM_NTASKS="1")) is None
    assert distributed.resolve(environ={k: v for k, v in slurm.items() if k != "SLURM_STEP_NODELIST"}) is None
    assert distributed.resolve("h:1", 2, 0, environ=slurm) == distributed.Spec("h:1", 2, 0)  # flags beat SLURM


@pytest.mark.parametrize("kwargs, env, match", [
    (dict(coordinator="h:1"), {}, r"--num-processes \(or \$JAXFORMER_NUM_PROCESSES\), --process-id"),
    (dict(num_processes=2, process_id=0), {}, r"--coordinator \(or \$JAXFORMER_COORDINATOR\) missing"),
    (dict(coordinator="h:1", num_processes=2), {}, r"--process-id \(or \$JAXFORMER_PROCESS_ID\) missing$"),
    (dict(coordinator="h:1", num_processes=2, process_id=2), {}, r"process_id=2 .* out of range .*num_processes=2"),
    (dict(coordinator="h:1", num_processes=2), {"JAXFORMER_PROCESS_ID": "5"}, r"process_id=5 \(\$JAXFORMER_PROC"),
    (dict(coordinator="h:1", process_id=0), {"JAXFORMER_NUM_PROCESSES": "two"}, r"num_processes='two'"),
    (dict(coordinator="nohost", num_processes=2, process_id=0), {}, r"coordinator='nohost' .*HOST:PORT"),
    (dict(coordinator="h:1", num_processes=0, process_id=0), {}, r"num_processes=0 .* >= 1"),
    (dict(coordinator="h:1", num_processes=2, process_id=-1), {}, r"process_id=-1 .* >= 0"),
])
def test_resolve_rejects(kwargs, env, match):
    with pytest.raises(ValueError, match=match):
        distributed.resolve(**kwargs, environ=env)


def test_train_config_fields():
    with pytest.raises(ValueError, match=r"process_id=3 .*out of range for num_processes=2"):
        TrainConfig(num_processes=2, process_id=3)
    with pytest.raises(ValueError, match=r"coordinator='h:0'"):
        TrainConfig(coordinator="h:0")
    TrainConfig(coordinator="h:1", process_id=1)  # completeness is checked at train start, with the environment


def test_cli_rejects_partial_flags_before_starting(tmp_path, capsys, clean_env):
    corpus, vocab = _inputs(tmp_path)
    assert cli.main(_args(corpus, vocab, tmp_path / "x", "--coordinator", "localhost:1")) == 2
    err = capsys.readouterr().err
    assert "--num-processes (or $JAXFORMER_NUM_PROCESSES), --process-id (or $JAXFORMER_PROCESS_ID) missing" in err
    assert cli.main(_args(corpus, vocab, tmp_path / "x", "--coordinator", "localhost:1", "--num-processes", "2",
                          "--process-id", "2")) == 2
    assert "process_id=2" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()  # refused before anything was written


@pytest.mark.parametrize("spans, block", [
    ([(0, 1), (1, 2), (2, 3), (3, 4)], (0, 2)),  # process 0 of 2 with a batch of 8
    ([(4, 6), (6, 8)], (1, 2)),
    ([(0, 8), (0, 8)], (0, 1)),  # the batch replicated across processes (e.g. tensor over hosts)
    ([(4, 6), (4, 6), (6, 8), (6, 8)], (1, 2)),  # data=4,tensor=2 over 2 processes: process 1, rows held twice
])
def test_rows_block(spans, block):
    assert distributed.rows_block(spans, 8) == block


@pytest.mark.parametrize("spans", [[(0, 2), (4, 6)], [(2, 6)], [(1, 3)]])
def test_rows_block_rejects_scattered_rows(spans):
    with pytest.raises(ValueError, match="not one aligned block"):
        distributed.rows_block(spans, 8)


def test_single_process_mesh_reads_everything():
    import jax
    from jaxformer import sharding
    mesh = sharding.make_mesh("data=4,tensor=2")
    assert jax.process_count() == 1
    assert distributed.batch_block(sharding.batch_sharding(mesh), 16) == (0, 1)
