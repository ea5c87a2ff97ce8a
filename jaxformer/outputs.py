"""What a run leaves behind: orbax checkpoints (with a checksum of their arrays), metrics.jsonl (+ TensorBoard when
installed) and loss.png."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from . import distributed


class CheckpointError(ValueError):
    """A checkpoint is missing or does not fit the run (a user error: the CLI exits with status 2)."""


# ----------------------------------------------------------------------------------------------- checkpoints
def _words(x: jax.Array) -> jax.Array:
    """The bits of `x` as uint32 words (one per element; two for 8-byte types), the shape otherwise kept."""
    x = jnp.asarray(x)
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint32)
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    size = x.dtype.itemsize
    if size == 4:
        return jax.lax.bitcast_convert_type(x, jnp.uint32)
    if size == 8:
        return jax.lax.bitcast_convert_type(x, jnp.uint32)  # (..., 2)
    return jax.lax.bitcast_convert_type(x, {2: jnp.uint16, 1: jnp.uint8}[size]).astype(jnp.uint32)


@jax.jit
def _sums(leaves):
    """Per leaf: the wrapping uint32 sum of its words and of its words times their (1-based) flat positions.
    Integer sums are exact in any order, so the result does not depend on the sharding or the device count."""
    out = []
    for leaf in leaves:
        w = _words(leaf)
        position = jnp.ones(w.shape, jnp.uint32)
        stride = 1
        for axis in reversed(range(w.ndim)):
            position = position + jax.lax.broadcasted_iota(jnp.uint32, w.shape, axis) * jnp.uint32(stride % 2**32)
            stride *= w.shape[axis]
        out.append(jnp.stack([jnp.sum(w, dtype=jnp.uint32), jnp.sum(w * position, dtype=jnp.uint32)]))
    return jnp.stack(out) if out else jnp.zeros((0, 2), jnp.uint32)


def state_checksum(state) -> str:
    """A checksum of every bit of the arrays of `state` (a pytree), the same however they are sharded: a flipped bit
    changes it. Checkpoints store it in their metadata and `Checkpointer.restore` checks it."""
    leaves = jax.tree.leaves(state)
    sums = _sums(leaves)
    host = np.asarray(sums.addressable_data(0))  # replicated: every process holds the whole result
    shapes = repr([(tuple(x.shape), str(x.dtype)) for x in leaves]).encode()
    return hashlib.sha256(shapes + host.astype("<u4").tobytes()).hexdigest()[:32]


class Checkpointer:
    """Orbax checkpoints of the whole `TrainState` plus JSON metadata, under `<out>/checkpoints/<step>`.

    Orbax writes each checkpoint to a temporary directory and renames it when complete, so a checkpoint is never
    left half-written; an interrupted save is ignored by `latest_step` and its temporary directory removed on the
    next start. The metadata holds `state_checksum` of the saved state: `restore` recomputes it, so damaged bytes
    are found when a checkpoint is read, not steps later.
    """

    def __init__(self, directory: Path, max_to_keep: int = 3):
        self.directory = Path(directory).absolute()
        self.manager = ocp.CheckpointManager(
            self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                                                 cleanup_tmp_directories=True))

    def steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state, meta: dict[str, Any]) -> None:
        if step in self.manager.all_steps():  # a leftover of a run resumed from an older step: replaced
            self.manager.delete(step)
        meta = dict(meta, state_checksum=state_checksum(state))
        self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                         meta=ocp.args.JsonSave(meta)))
        self.manager.wait_until_finished()  # the caller may exit (Ctrl-C, bad loss) right after

    def read_meta(self, step: int) -> dict[str, Any]:
        return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

    def restore(self, step: int, like):
        """The state saved at `step`, with the structure, dtypes and shardings of `like`, its checksum verified
        (CheckpointError if it differs)."""
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        restored = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                                                                      meta=ocp.args.JsonRestore()))
        expected = restored["meta"].get("state_checksum")
        if expected is not None and state_checksum(restored["state"]) != expected:
            raise CheckpointError(f"checkpoint {step}: its arrays do not match the checksum saved with them "
                                  "(damaged on disk)")
        return restored["state"]

    def restore_newest(self, like, log: Callable = print) -> tuple[int, Any]:
        """(step, state) of the newest checkpoint that restores and verifies. Newer ones that fail are moved to
        <out>/checkpoints-unrestorable/ (so the run can save those steps again), each with the reason logged."""
        failed = []
        for step in reversed(self.steps()):
            reason = None
            try:
                with _quiet_orbax():
                    state = self.restore(step, like)
            except Exception as e:  # noqa: BLE001 - orbax and tensorstore raise many types for damaged files
                reason = _first_line(e)
            if distributed.any_process(reason is not None):  # every process goes on from the same step
                reason = reason or "another process could not restore it"
                failed.append(f"{step} ({reason})")
                log(f"checkpoint {step} cannot be restored: {reason}")
                continue
            if distributed.is_main():
                for bad in failed:
                    self._set_aside(int(bad.split()[0]))
            distributed.barrier("jaxformer-set-aside")
            self.manager.reload()
            if failed:
                log(f"resuming from the newest checkpoint that restores and verifies: step {step}")
            return step, state
        raise CheckpointError(f"--resume: no checkpoint under {self.directory} can be restored: " + "; ".join(failed)
                              if failed else f"--resume: no complete checkpoint under {self.directory}")

    def _set_aside(self, step: int) -> None:
        aside = self.directory.parent / "checkpoints-unrestorable"
        aside.mkdir(exist_ok=True)
        target = aside / str(step)
        if target.exists():
            shutil.rmtree(target)
        os.replace(self.directory / str(step), target)

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


def _first_line(e: BaseException) -> str:
    """The gist of a failed restore in one line (tensorstore appends its whole spec to its messages)."""
    text = (str(e).strip().splitlines() or [""])[0].split(" See full TensorStore details")[0][:300]
    return text if isinstance(e, CheckpointError) else f"{type(e).__name__}: {text}"


class _quiet_orbax:
    """Silences orbax's and absl's error logging (full tracebacks) while a checkpoint that may be damaged is read:
    the caller reports the reason in one line. When one read fails, orbax closes its event loop while other reads
    are in flight in tensorstore's threads; each of those then raises "Event loop is closed" where nobody can catch
    it, and Python prints it (hundreds of lines, some after the restore returned): those alone are dropped, from
    the first restore on (`_drop_closed_loop_errors`)."""

    def __enter__(self):
        _drop_closed_loop_errors()
        self.loggers = [logging.getLogger(name) for name in ("absl", "orbax", "")]
        self.levels = [lg.level for lg in self.loggers]
        for lg in self.loggers:
            lg.setLevel(logging.CRITICAL)

    def __exit__(self, *exc):
        for lg, level in zip(self.loggers, self.levels):
            lg.setLevel(level)


def _is_closed_loop(exc_type, exc_value) -> bool:
    return exc_type is RuntimeError and str(exc_value) == "Event loop is closed"


def _drop_closed_loop_errors() -> None:
    """sys.excepthook (what PyErr_Print calls) and sys.unraisablehook, wrapped to drop `_is_closed_loop` errors."""
    if getattr(sys.excepthook, "drops_closed_loops", False):
        return
    excepthook, unraisablehook = sys.excepthook, sys.unraisablehook

    def on_exception(exc_type, exc_value, tb):
        if not _is_closed_loop(exc_type, exc_value):
            excepthook(exc_type, exc_value, tb)

    def on_unraisable(unraisable):
        if not _is_closed_loop(unraisable.exc_type, unraisable.exc_value):
            unraisablehook(unraisable)
    on_exception.drops_closed_loops = True
    sys.excepthook, sys.unraisablehook = on_exception, on_unraisable


# ----------------------------------------------------------------------------------------------- metrics
class MetricsWriter:
    """Appends one JSON object per logged step to `metrics.jsonl`, and mirrors the scalars to TensorBoard event
    files in <out>/tensorboard where the `tensorboard` package is installed."""

    def __init__(self, out: Path):
        self.path = out / "metrics.jsonl"
        self.file = open(self.path, "a", buffering=1)
        self.tb = _TensorBoard(out / "tensorboard") if importlib.util.find_spec("tensorboard") is not None else None

    def write(self, record: dict[str, Any]) -> None:
        self.file.write(json.dumps(record) + "\n")
        if self.tb is not None:
            self.tb.add_scalars({k: v for k, v in record.items() if k != "step" and isinstance(v, (int, float))},
                                record["step"])

    def close(self) -> None:
        self.file.close()
        if self.tb is not None:
            self.tb.close()


class _TensorBoard:
    """Scalars as TensorBoard events, written by the tensorboard package's own event-file writer: what
    torch.utils.tensorboard does, without importing torch (seconds of start-up) or TensorFlow."""

    def __init__(self, logdir: Path):
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
        self.event, self.summary = event_pb2.Event, summary_pb2.Summary
        self.writer = EventFileWriter(str(logdir))

    def add_scalars(self, scalars: dict[str, float], step: int) -> None:
        values = [self.summary.Value(tag=k, simple_value=float(v)) for k, v in scalars.items()]
        self.writer.add_event(self.event(wall_time=time.time(), step=int(step), summary=self.summary(value=values)))

    def close(self) -> None:
        self.writer.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl; a line that is not a JSON object with a step (e.g. cut short when the process
    was killed) is left out."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            records.append(record)
    return records


def truncate_metrics(path: Path, step: int) -> int:
    """Keep the records of `path` up to `step` (a resumed run writes the later ones again); returns how many were
    dropped (later steps and unreadable lines)."""
    if not path.exists():
        return 0
    lines = path.read_text(errors="replace").splitlines()
    kept = [json.dumps(r) for r in read_metrics(path) if r["step"] <= step]
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    os.replace(tmp, path)
    return len([line for line in lines if line.strip()]) - len(kept)


def plot_losses(metrics_path: Path, png: Path) -> Path | None:
    """Training loss (and its MLM/NSP parts) and eval MLM loss/accuracy against step, as `png`."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    records = read_metrics(metrics_path)
    train = [r for r in records if "loss" in r]
    evals = [r for r in records if "eval_mlm_loss" in r]
    if not train and not evals:
        return None
    fig, (ax, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    for key, style in (("loss", "-"), ("mlm_loss", "--"), ("nsp_loss", ":")):
        if train:
            ax.plot([r["step"] for r in train], [r[key] for r in train], style, label=f"train {key}")
    if evals:
        ax.plot([r["step"] for r in evals], [r["eval_mlm_loss"] for r in evals], "o-", label="eval mlm_loss")
        ax_acc.plot([r["step"] for r in evals], [r["eval_mlm_acc"] for r in evals], "o-", label="eval MLM acc")
        ax_acc.plot([r["step"] for r in evals], [r["eval_nsp_acc"] for r in evals], "s-", label="eval NSP acc")
    ax.set(xlabel="step", ylabel="loss", title="training")
    ax_acc.set(xlabel="step", ylabel="accuracy", title="held-out evaluation", ylim=(0, 1))
    for a in (ax, ax_acc):
        a.grid(alpha=0.3)
        if a.get_legend_handles_labels()[0]:
            a.legend()
    fig.tight_layout()
    tmp = png.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, png)
    return png
