"""A run's output directory and its record, run.json: what `--resume` continues, and how `--steps` extends a run.

An output directory belongs to one run. A new run needs a missing or empty `--out`, or `--overwrite`, which
deletes an earlier run's outputs (RUN_OUTPUTS, nothing else) after checking that it is a run directory. run.json
holds the run's TrainConfig with every default spelled out (`resolved`), its model config, the tokenizer's digest,
the corpus files' sizes (a prepared set's digest: `run_data.identity`), jaxformer's version and the pieces of its
learning-rate schedule. `resumed_config` rebuilds the run's TrainConfig from it with the flags given again;
`check_resume` refuses changes to the fields that define the run (`on_resume="fixed"` in jaxformer/config.py).

Extending (`--steps` above the run's total, from its newest checkpoint at step s): the schedule gains a piece from s
to the new total that follows the schedule of that total, scaled so that the rate at s is the one the run had
there (a finished run's rate at its end is 0: its last step's rate is used), so the rate never jumps and decays to
0 at the new total. Within its original total a resumed run uses the original optimizer, bit for bit.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import jax.numpy as jnp
import optax

from . import __version__, distributed
from .cli import fields_by_resume
from .config import DEFAULT_VOCAB_SIZE, BertConfig, MeshConfig, TrainConfig
from .outputs import CheckpointError

RUN_FILE = "run.json"
# Everything a run writes in its directory (plus profile_<i> and hidden temporary files): what --overwrite deletes.
RUN_OUTPUTS = ("run.json", "metrics.jsonl", "loss.png", "tokenizer.json", "tokenizer.meta.json", "checkpoints",
               "checkpoints-unrestorable", "tensorboard", "profile", "train_step.hlo.txt")
_ON_RESUME = fields_by_resume(TrainConfig)
FIXED, KEPT, LAUNCH = _ON_RESUME["fixed"], _ON_RESUME["kept"], _ON_RESUME["launch"]
# Model-config fields that change how the step runs, not what the parameters are: a resumed run may change them.
RUNTIME_FIELDS = frozenset({"kernels", "layouts", "remat", "scan_layers"})


# ----------------------------------------------------------------------------------------------- the directory
@dataclasses.dataclass
class Output:
    """The run's directory and the directories this start created (removed again if it fails before any step)."""

    path: Path
    created: list[Path]

    def remove_if_unused(self) -> None:
        """After a failure: delete the directory if this start created it and it holds no checkpoint or metrics."""
        if not self.created or not distributed.is_main():
            return
        metrics = self.path / "metrics.jsonl"
        if (metrics.exists() and metrics.stat().st_size) or any((self.path / "checkpoints").glob("[0-9]*")):
            return
        shutil.rmtree(self.path, ignore_errors=True)
        for parent in reversed(self.created[:-1]):  # the parents it made, innermost first, if left empty
            try:
                parent.rmdir()
            except OSError:
                break


def _is_run_output(p: Path) -> bool:
    name = p.name
    return name in RUN_OUTPUTS or name.startswith("profile_") or (name.startswith(".") and name.endswith(".tmp"))


def _is_run_dir(path: Path) -> bool:
    """A run's directory: it has a run.json, or holds nothing but what a run writes (a start that ended early)."""
    return (path / RUN_FILE).is_file() or all(_is_run_output(p) for p in path.iterdir())


def _latest_run() -> Path:
    runs = Path("runs")
    previous = sorted(p for p in runs.glob("*") if (p / RUN_FILE).is_file()) if runs.is_dir() else []
    if not previous:
        raise CheckpointError("--resume without --out found no run (a directory with a run.json) under runs/")
    return previous[-1]


def resume_dir(out: str | None) -> Path:
    """The directory `--resume` continues: `out`, or the most recent run under runs/; it must hold a run.json."""
    path = Path(out) if out is not None else _latest_run()
    if not path.is_dir():
        raise CheckpointError(f"--resume: {path} is not a directory (out={str(path)!r})")
    if not (path / RUN_FILE).is_file():
        hint = ""
        if any((path / "checkpoints").glob("[0-9]*")):
            hint = " (an earlier version of jaxformer wrote no run.json)"
        elif _is_run_dir(path):
            hint = " (a run stopped before it began: start it afresh with --overwrite)"
        raise CheckpointError(f"--resume: {path} has no {RUN_FILE}, so it is not a run directory that this version "
                              f"of jaxformer can continue{hint}")
    return path


def prepare(tc: TrainConfig) -> Output:
    """The run's directory, ready: `tc.out` (or runs/<timestamp>, process 0's, on every process). A new run needs
    it missing or empty, or `overwrite` (then an earlier run's outputs are deleted); `resume` needs its run.json.
    ValueError (before any data or model work) for a path that cannot be used."""
    if tc.resume:
        path = resume_dir(tc.out)
    elif tc.out is not None:
        path = Path(tc.out)
    else:
        path = Path(distributed.broadcast_text(str(Path("runs") / time.strftime("%Y%m%d-%H%M%S"))))
    name = f"out={str(path)!r}"
    if path.exists() and not path.is_dir():
        raise ValueError(f"{name} exists and is not a directory")
    if path.exists() and not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"{name} is not writable")
    stale = []
    if not tc.resume and path.is_dir() and any(path.iterdir()):
        if not _is_run_dir(path):
            raise ValueError(f"{name} is not empty and is not a jaxformer run directory (no {RUN_FILE}): choose "
                             "another --out (--overwrite deletes only a run's outputs)")
        if not tc.overwrite:
            raise ValueError(f"{name} already holds an earlier run: continue it with --resume, start it afresh "
                             "with --overwrite, or choose another --out")
        stale = [p for p in path.iterdir() if _is_run_output(p)]
    created = [p for p in (path, *path.absolute().parents) if not p.exists()][::-1]
    distributed.barrier("jaxformer-out-checked")  # every process has looked before process 0 deletes anything
    if distributed.is_main():
        for p in stale:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
    distributed.barrier("jaxformer-out-emptied")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # unwritable or impossible path: a user error, before any data or model work
        raise ValueError(f"{name} cannot be created as the output directory: {e.strerror or e}") from e
    return Output(path, created)


# ----------------------------------------------------------------------------------------------- run.json
def _absolute(path: str) -> str:
    return str(Path(path).expanduser().absolute())


def resolved(tc: TrainConfig, vocab_size: int | None = None) -> TrainConfig:
    """`tc` with every default that depends on other fields spelled out (learning rate, dropout, masked
    positions, vocabulary size) and paths made absolute: the same run, in the terms run.json stores.
    `vocab_size`: the size of a given tokenizer (`--vocab`, a prepared set's; unknown before it is loaded), None
    for one trained on the corpus."""
    from .data import DataConfig
    changes: dict[str, Any] = dict(
        lr=tc.peak_lr, pack_samples=tc.packing or None,
        max_predictions=tc.max_predictions or DataConfig(seq_len=tc.seq_len, pack=tc.packing).max_predictions,
        dropout=tc.dropout if tc.dropout is not None else BertConfig.preset(tc.config).hidden_dropout_prob,
        data=None if tc.data is None else tuple(_absolute(p) for p in tc.data),
        vocab=None if tc.vocab is None else _absolute(tc.vocab))
    if tc.vocab_size is None:
        changes["vocab_size"] = vocab_size if vocab_size is not None else DEFAULT_VOCAB_SIZE
    return dataclasses.replace(tc, **changes)


def file_digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# How the parameters are stored (run.json's "params_format"; a record without it is format 1). 1: the QKV kernel as
# (L, C, D, N, H); 2: as (L, D, C, N, H), the order its GEMMs read. `trainer.build_state` resumes format 1.
PARAMS_FORMAT = 2


def new_record(tc: TrainConfig, cfg: BertConfig, tokenizer: Path, corpus: list[list],
               mesh: MeshConfig | None = None) -> dict[str, Any]:
    """run.json of a new run: `tc` as `resolved`, the model config, the input's `corpus` (`run_data.identity`), the
    resolved `mesh` and one schedule piece (0, steps). (Only process 0 writes it, and only its copy of the tokenizer
    file is sure to be there.)"""
    return dict(jaxformer_version=__version__, params_format=PARAMS_FORMAT, started=time.strftime("%Y-%m-%d %H:%M:%S"),
                train_config=as_json(dataclasses.asdict(tc)), model_config=cfg.to_dict(),
                tokenizer_sha256=file_digest(tokenizer) if distributed.is_main() else None, corpus=as_json(corpus),
                schedule=[[0, tc.steps]], **({"mesh": mesh.spec()} if mesh is not None else {}))


def read_record(out: Path) -> dict[str, Any]:
    path = Path(out) / RUN_FILE
    try:
        record = json.loads(path.read_text())
        record["train_config"], record["schedule"]  # noqa: B018 - the keys every record has
        return record
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"--resume: {path} cannot be read as a run record: {e}") from None


def write_record(out: Path, record: dict[str, Any]) -> None:
    if distributed.is_main():
        tmp = Path(out) / f".{RUN_FILE}.tmp"
        tmp.write_text(json.dumps(record, indent=1) + "\n")
        os.replace(tmp, Path(out) / RUN_FILE)


def as_json(value):
    """`value` as run.json reads it back (tuples as lists)."""
    return json.loads(json.dumps(value))


# ----------------------------------------------------------------------------------------------- resume
def resumed_config(given: dict[str, Any]) -> TrainConfig:
    """The TrainConfig of `--resume`: the one stored in run.json (in `given["out"]`, or the most recent run under
    runs/), with the fields in `given` (the flags given on the command line) laid over it; "launch" fields come
    from `given` alone."""
    out = resume_dir(given.get("out"))
    stored = read_record(out)["train_config"]
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    fields = {k: v for k, v in stored.items() if k in known and k not in LAUNCH}
    fields.update(given, out=str(out), resume=True)
    return TrainConfig(**fields)


def check_resume(tc: TrainConfig, record: dict[str, Any], out: Path, log: Callable = print,
                 mesh: MeshConfig | None = None) -> None:
    """Refuse (CheckpointError) a change of a field that defines the run, naming the stored and given values (and,
    with gradient compression, of what shapes its state: `compression_changes`, on the resolved `mesh`); log the
    fields that change only how it runs."""
    stored, now = record["train_config"], as_json(dataclasses.asdict(resolved(tc)))
    # A field newer than the run's record: the run had its default (e.g. pack, off).
    stored = {**{f.name: f.default for f in dataclasses.fields(TrainConfig) if f.name not in stored}, **stored}
    fixed = [f"{k}: the run has {stored.get(k)!r}, given {now[k]!r}" for k in FIXED if stored.get(k) != now[k]]
    fixed += compression_changes(record, tc, mesh)
    if fixed:
        raise CheckpointError(f"--resume: these settings define the run in {out} and cannot change: "
                              + "; ".join(fixed) + ". Leave them out to keep the run's, or start a new run "
                              "(another --out)")
    kept = [f"{k}: {stored.get(k)!r} -> {now[k]!r}" for k in KEPT if k in stored and stored[k] != now[k]]
    if kept:
        log("resume with other settings of how the run executes: " + "; ".join(kept))
    if record.get("jaxformer_version") != __version__:
        log(f"resume: the run was started by jaxformer {record.get('jaxformer_version')}, this is {__version__}")


def resumed_record(record: dict[str, Any], tc: TrainConfig, pieces: list[list[int]],
                   mesh: MeshConfig | None = None) -> dict[str, Any]:
    """run.json once the run resumes as `tc` on `mesh`: the execution settings ("kept" fields) and the mesh as now,
    so that a plain `--resume` goes on with them, and the schedule's `pieces` (steps: their total)."""
    now = as_json(dataclasses.asdict(resolved(tc)))
    config = dict(record["train_config"], **{k: now[k] for k in KEPT}, steps=pieces[-1][1])
    return dict(record, train_config=config, schedule=pieces, params_format=PARAMS_FORMAT,
                **({"mesh": mesh.spec()} if mesh is not None else {}))


def compression_changes(record: dict[str, Any], tc: TrainConfig, mesh: MeshConfig | None) -> list[str]:
    """What `tc` on the resolved `mesh` changes of the run's gradient compression that its checkpoints cannot
    follow: turning it on or off (the optimizer state gains or loses the exchange's state) and, while it is on,
    `compression_min_size` or the mesh (the residuals have one entry per data rank, the exchange's per-device arrays
    one per device, sized by the local shards). Density, exchange, selection and warm-up may change."""
    stored = record["train_config"]
    before, now = stored.get("grad_compression", "none"), tc.grad_compression
    if (before == "none") != (now == "none"):
        return [f"grad_compression: the run has {before!r}, given {now!r} (compression on or off is fixed for a "
                "run; topk-allgather and topk-balanced may replace each other)"]
    if now == "none":
        return []
    changes = []
    if stored.get("compression_min_size") != tc.compression_min_size:
        changes.append(f"compression_min_size: the run has {stored.get('compression_min_size')!r}, given "
                       f"{tc.compression_min_size!r}")
    if mesh is not None and record.get("mesh") != mesh.spec():
        changes.append(f"mesh: the run has {record.get('mesh')!r}, given {tc.mesh!r} which resolves to "
                       f"{mesh.spec()!r} (fixed while grad_compression is on)")
    return changes


def check_inputs(record: dict[str, Any], corpus: list[list], tokenizer: Path) -> None:
    """The input (`corpus`: `run_data.identity`, the text files and their sizes or a prepared set's digest) and the
    run's tokenizer.json are those the run started with."""
    now = as_json(corpus)
    if "corpus" in record and record["corpus"] != now:
        raise CheckpointError(f"--resume: the corpus changed since the run started (then: {record['corpus']}; "
                              f"now: {now})")
    if "tokenizer_sha256" in record and file_digest(tokenizer) != record["tokenizer_sha256"]:
        raise CheckpointError(f"--resume: {tokenizer} changed since the run started (its SHA-256 differs from "
                              f"{RUN_FILE}'s)")


def check_model(record: dict[str, Any], cfg: BertConfig) -> None:
    """The model config equals the stored one but for RUNTIME_FIELDS (the same fixed flags can give another model
    under another version of jaxformer, e.g. a preset changed)."""
    saved, current = record["model_config"], as_json(cfg.to_dict())
    different = [f"{k}: the run has {saved.get(k)!r}, now {current.get(k)!r}" for k in sorted(set(saved) | set(current))
                 if saved.get(k) != current.get(k) and k not in RUNTIME_FIELDS]
    if different:
        raise CheckpointError("--resume: the model config differs from the run's: " + "; ".join(different))


def schedule_pieces(record: dict[str, Any], steps: int, at: int) -> list[list[int]]:
    """The schedule's pieces [[start, total], ...] once the run, at step `at`, goes on to `steps`: unchanged up to
    the run's total, else a new piece [at, steps] (replacing any piece that started at or after `at`)."""
    pieces = [list(p) for p in record["schedule"]]
    total = pieces[-1][1]
    if steps <= at:
        hint = f"; --steps N above {total} extends it (docs/training.md)" if at >= total else ""
        raise CheckpointError(f"--resume: the run is at step {at} of {total}: steps={steps} leaves nothing to do"
                              + hint)
    if steps <= total:
        return pieces
    return [p for p in pieces if p[0] < at] + [[at, steps]]


def learning_rate(tc: TrainConfig, pieces: list[list[int]]) -> tuple[list[optax.Schedule], list[float]]:
    """Per piece: the schedule of its total (`steps.learning_rate_schedule`) and the factor that makes it start at
    the rate the previous piece had there (for a previous piece at its end, where the rate is 0: its last
    step's)."""
    from .steps import learning_rate_schedule
    bases = [learning_rate_schedule(dataclasses.replace(tc, steps=total)) for _, total in pieces]
    factors = [1.0]
    for i in range(1, len(pieces)):
        start = pieces[i][0]
        rate = factors[-1] * float(bases[i - 1](start)) or factors[-1] * float(bases[i - 1](start - 1))
        factors.append(rate / float(bases[i](start)))
    return bases, factors


def schedule(tc: TrainConfig, pieces: list[list[int]]) -> optax.Schedule:
    """The learning rate at each step count under `pieces` (what the optimizer of `optimizer` applies)."""
    bases, factors = learning_rate(tc, pieces)

    def rate(count):
        out = bases[0](count)
        for (start, _), base, factor in zip(pieces[1:], bases[1:], factors[1:]):
            out = jnp.where(count >= start, factor * base(count), out)
        return out
    return rate


def optimizer(tc: TrainConfig, pieces: list[list[int]]) -> optax.GradientTransformation:
    """`steps.make_optimizer` on the schedule of `pieces` (one piece: the plain optimizer). Before the first
    extension the rate is the first piece's, bit for bit, so a resumed run within its total repeats the original."""
    from .steps import make_optimizer
    return make_optimizer(tc, schedule(tc, pieces) if len(pieces) > 1 else None)
