"""A run's output directory: where it is (`--out`, or runs/<timestamp>), what `--resume` must find there, and the
metadata saved with every checkpoint (the model and train configs), against which a resumed run is checked.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable

from . import distributed
from .config import BertConfig, TrainConfig
from .outputs import CheckpointError, Checkpointer

# Model-config fields that change how the step runs, not what the parameters are: a resumed run may change them.
RUNTIME_FIELDS = frozenset({"kernels", "layouts", "remat", "scan_layers"})


def output_dir(tc: TrainConfig) -> Path:
    """The run's directory, created: `tc.out`; without it the most recent run under runs/ (`--resume`) or a new
    runs/<timestamp> (process 0's, on every process). With `--resume` it must hold a checkpoint."""
    if tc.out is not None:
        out = Path(tc.out)
    elif tc.resume:
        runs = Path("runs")
        previous = sorted(p for p in runs.glob("*") if (p / "checkpoints").is_dir()) if runs.is_dir() else []
        if not previous:
            raise CheckpointError("--resume without --out found no earlier run under runs/")
        out = previous[-1]
    else:
        out = Path(distributed.broadcast_text(str(Path("runs") / time.strftime("%Y%m%d-%H%M%S"))))
    checkpoints = out / "checkpoints"
    if tc.resume and not (checkpoints.is_dir() and any(checkpoints.iterdir())):
        raise CheckpointError(f"--resume: no checkpoint under {checkpoints}")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # unwritable or impossible path: a user error, before any data or model work
        raise ValueError(f"out={str(out)!r} cannot be created as the output directory: {e.strerror or e}") from e
    return out


def metadata(cfg: BertConfig, tc: TrainConfig) -> dict[str, Any]:
    """What every checkpoint records besides the state (JSON): the model config and the train config."""
    return dict(model_config=cfg.to_dict(), train_config=dataclasses.asdict(tc))


def _config_diff(saved: dict, current: dict) -> dict[str, str]:
    return {k: f"{k}: checkpoint {saved.get(k)!r} vs now {current.get(k)!r}"
            for k in sorted(set(saved) | set(current)) if saved.get(k) != current.get(k)}


def resume_step(ckpt: Checkpointer, meta: dict[str, Any], tc: TrainConfig, log: Callable = print) -> int:
    """The step of the latest complete checkpoint, once its metadata fits `meta`: the same model (fields other than
    RUNTIME_FIELDS, whose changes are logged) and optimizer, and a step below `tc.steps`."""
    start = ckpt.latest_step()
    if start is None:
        raise CheckpointError(f"--resume: no complete checkpoint under {ckpt.directory}")
    saved = ckpt.read_meta(start)
    diff = _config_diff(saved["model_config"], meta["model_config"])
    different = [text for k, text in diff.items() if k not in RUNTIME_FIELDS]
    if different:
        raise CheckpointError("--resume: the checkpoint is of a different model config: " + "; ".join(different))
    if len(different) < len(diff):
        log("resume with a different execution (same parameters): "
            + "; ".join(text for k, text in diff.items() if k in RUNTIME_FIELDS))
    if saved["train_config"]["optimizer"] != tc.optimizer:
        raise CheckpointError(f"--resume: the checkpoint's optimizer is {saved['train_config']['optimizer']!r}, "
                              f"not optimizer={tc.optimizer!r}")
    if start >= tc.steps:
        raise ValueError(f"--resume: the checkpoint is at step {start}, not below --steps {tc.steps}")
    return start
