"""train.py in separate processes: the same command gives the same run; a run killed (SIGKILL) at random moments,
in the middle of saving a checkpoint and with its newest checkpoint damaged, resumes to exactly the uninterrupted
run; damaged checkpoints are named, one line each, not loaded."""

import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import train as cli
from test_trainer import metrics, write_corpus

ROOT = Path(__file__).resolve().parents[1]
STEPS = 12
FLAGS = ["--seq-len", "16", "--batch-size", "8", "--vocab-size", "64", "--steps", str(STEPS), "--warmup-steps", "2",
         "--log-every", "1", "--eval-every", "4", "--eval-batches", "1", "--save-every", "1", "--dropout", "0",
         "--data-workers", "0", "--no-progress"]
TIMING = ("seq_per_s", "tokens_per_s", "samples_per_s", "data_wait_s")  # wall-clock fields of a metrics record


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return tmp_path_factory.mktemp("resume")


@pytest.fixture(scope="module")
def corpus(base):
    return write_corpus(base / "corpus.txt")


@pytest.fixture(scope="module")
def env(base):
    """One device per process (no test flags), a tokenizer cache of their own, and XLA's persistent cache so that
    only the first process compiles."""
    return dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="", PYTHONUNBUFFERED="1",
                JAXFORMER_CACHE_DIR=str(base / "cache"), JAX_COMPILATION_CACHE_DIR=str(base / "xla-cache"),
                JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")


def start(env, *argv):
    return subprocess.Popen([sys.executable, str(ROOT / "train.py"), *map(str, argv)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc):
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out, err


def records(out):
    """metrics.jsonl without its wall-clock fields."""
    return [{k: v for k, v in r.items() if k not in TIMING} for r in metrics(out)]


def final_checksum(out, step=STEPS):
    return json.loads((Path(out) / "checkpoints" / str(step) / "meta" / "metadata").read_text())["state_checksum"]


@pytest.fixture(scope="module")
def reference(corpus, env, base):
    out = base / "reference"
    code, _, err = finish(start(env, "--data", corpus, "--out", out, *FLAGS))
    assert code == 0, err
    return out


@pytest.mark.slow
def test_the_same_command_in_a_fresh_process_gives_the_same_run(corpus, env, reference, tmp_path):
    """The tokenizer is reused from the cache (trained vocabularies are keyed by corpus contents), so every number
    of the run repeats: losses, learning rates, evaluations and the final state, bit for bit."""
    out = tmp_path / "again"
    code, _, err = finish(start(env, "--data", corpus, "--out", out, *FLAGS))
    assert code == 0, err
    assert (out / "tokenizer.json").read_bytes() == (reference / "tokenizer.json").read_bytes()
    assert records(out) == records(reference)
    assert final_checksum(out) == final_checksum(reference)


def _latest(out):
    found = [int(p.name) for p in (Path(out) / "checkpoints").glob("*") if p.name.isdigit()]
    return max(found, default=0)


def _saving(out):
    return any("tmp" in p.name for p in (Path(out) / "checkpoints").glob("*"))


def _wait(proc, condition, timeout=240):
    deadline = time.time() + timeout
    while proc.poll() is None and not condition():
        assert time.time() < deadline, "the run made no progress"
        time.sleep(0.01)
    return proc.poll() is None


def _flip_a_bit(checkpoint):
    data = max((p for p in (checkpoint / "state").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    data.write_bytes(bytes(raw))


def test_sigkill_at_any_moment_then_resume_gives_the_uninterrupted_run(corpus, env, reference, tmp_path):
    """Three SIGKILLs: at a random moment, as soon as a checkpoint is being written, and at a random moment after
    which a bit of the newest checkpoint is flipped; each time `train.py --out DIR --resume` goes on. The result:
    the uninterrupted run's metrics (one record per step) and final state, bit for bit."""
    rng = random.Random(os.getpid())
    out = tmp_path / "killed"
    proc = start(env, "--data", corpus, "--out", out, *FLAGS)
    kills, plan, notes = 0, ["random", "mid-save", "damage"], []
    while True:
        seen = _latest(out)
        alive = _wait(proc, lambda: _latest(out) > seen)  # a new checkpoint: progress since the last start
        if alive and kills < len(plan):
            if plan[kills] == "mid-save":
                alive = _wait(proc, lambda: _saving(out))
            else:
                time.sleep(rng.uniform(0.0, 0.4))
            if proc.poll() is None:
                proc.kill()
                proc.wait()
                notes.append(f"{plan[kills]} kill after checkpoint {_latest(out)}")
                if plan[kills] == "damage":
                    _flip_a_bit(out / "checkpoints" / str(_latest(out)))
                kills += 1
                proc = start(env, "--out", out, "--resume")
                continue
        code, stdout, err = finish(proc)
        assert code == 0, (notes, err)
        break
    assert kills >= 2, notes  # the run ended before the planned kills (a very fast machine): too little tested
    assert "Traceback" not in err
    if kills == len(plan):  # the last start found the flipped bit and went back one checkpoint
        assert "cannot be restored: checkpoint" in stdout and "do not match the checksum" in stdout, stdout
    steps = [r["step"] for r in records(out) if "loss" in r]
    assert steps == list(range(1, STEPS + 1)), (notes, steps)
    assert records(out) == records(reference), notes
    assert final_checksum(out) == final_checksum(reference), notes


def test_damaged_checkpoints_are_named_and_never_loaded(reference, tmp_path, capsys, monkeypatch):
    """The three newest checkpoints damaged three ways (array files cut short, one bit flipped, the state folder
    gone): --resume names each with its reason in one line and stops (exit 2) instead of loading one."""
    monkeypatch.setenv("JAXFORMER_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "damaged"
    shutil.copytree(reference, out)
    newest = sorted(int(p.name) for p in (out / "checkpoints").iterdir() if p.name.isdigit())
    assert newest == [STEPS - 2, STEPS - 1, STEPS]
    for data in (out / "checkpoints" / str(STEPS) / "state").rglob("d/*"):  # the array data files
        os.truncate(data, data.stat().st_size // 2)
    _flip_a_bit(out / "checkpoints" / str(STEPS - 1))
    shutil.rmtree(out / "checkpoints" / str(STEPS - 2) / "state")
    assert cli.main(["--out", str(out), "--resume", "--steps", str(STEPS + 2)]) == 2
    printed, err = capsys.readouterr()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert f"no checkpoint under {out / 'checkpoints'} can be restored" in err
    assert f"; {STEPS} (" not in err and f": {STEPS} (" in err and "Error reading" in err  # tensorstore's words
    assert f"{STEPS - 1} (checkpoint {STEPS - 1}: its arrays do not match the checksum saved with them" in err
    assert f"{STEPS - 2} (KeyError: 'Item \"state\" was not found" in err
    for step in (STEPS, STEPS - 1, STEPS - 2):
        assert f"checkpoint {step} cannot be restored: " in printed
