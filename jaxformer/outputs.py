"""What a run leaves behind: orbax checkpoints, metrics.jsonl (+ TensorBoard when installed) and loss.png."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp


class CheckpointError(ValueError):
    """A checkpoint is missing or does not fit the run (a user error: the CLI exits with status 2)."""


class Checkpointer:
    """Orbax checkpoints of the whole `TrainState` plus JSON metadata, under `<out>/checkpoints/<step>`.

    Orbax writes each checkpoint to a temporary directory and renames it when complete, so a checkpoint is never
    left half-written; an interrupted save is ignored by `latest_step`.
    """

    def __init__(self, directory: Path, max_to_keep: int = 3):
        self.directory = Path(directory).absolute()
        self.manager = ocp.CheckpointManager(
            self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True))

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state, meta: dict[str, Any]) -> None:
        if step in self.manager.all_steps():
            return
        self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                         meta=ocp.args.JsonSave(meta)))
        self.manager.wait_until_finished()  # the caller may exit (Ctrl-C, bad loss) right after

    def read_meta(self, step: int) -> dict[str, Any]:
        return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

    def restore(self, step: int, like):
        """The state saved at `step`, with the structure, dtypes and shardings of `like`."""
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        restored = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))
        return restored["state"]

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


class MetricsWriter:
    """Appends one JSON object per logged step to `metrics.jsonl`, and mirrors scalars to TensorBoard if present."""

    def __init__(self, out: Path):
        self.path = out / "metrics.jsonl"
        self.file = open(self.path, "a", buffering=1)
        self.tb = None
        try:
            from tensorboardX import SummaryWriter  # optional: only when installed
            self.tb = SummaryWriter(str(out / "tensorboard"))
        except ImportError:
            try:
                from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package
                self.tb = SummaryWriter(str(out / "tensorboard"))
            except ImportError:
                pass

    def write(self, record: dict[str, Any]) -> None:
        self.file.write(json.dumps(record) + "\n")
        if self.tb is not None:
            for k, v in record.items():
                if k != "step" and isinstance(v, (int, float)):
                    self.tb.add_scalar(k, v, record["step"])

    def close(self) -> None:
        self.file.close()
        if self.tb is not None:
            self.tb.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


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
    fig, (ax, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    for key, style in (("loss", "-"), ("mlm_loss", "--"), ("nsp_loss", ":")):
        ax.plot([r["step"] for r in train], [r[key] for r in train], style, label=f"train {key}")
    if evals:
        ax.plot([r["step"] for r in evals], [r["eval_mlm_loss"] for r in evals], "o-", label="eval mlm_loss")
        ax_acc.plot([r["step"] for r in evals], [r["eval_mlm_acc"] for r in evals], "o-", label="eval MLM acc")
        ax_acc.plot([r["step"] for r in evals], [r["eval_nsp_acc"] for r in evals], "s-", label="eval NSP acc")
    ax.set(xlabel="step", ylabel="loss", title="training")
    ax_acc.set(xlabel="step", ylabel="accuracy", title="held-out evaluation", ylim=(0, 1))
    for a in (ax, ax_acc):
        a.grid(alpha=0.3)
        a.legend()
    fig.tight_layout()
    tmp = png.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, png)
    return png
