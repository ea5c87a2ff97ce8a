"""The training loop (`run`): steps, metrics, held-out evaluation, checkpoints, profiling and Ctrl-C (`Interrupts`).

Each iteration is `state, metrics = steps.train_step(state, next(batches))`: `batches` yields device batches that
a `data.Prefetcher` thread took from the loader (`loader.train_batches`: this process's rows, assembled and masked
in Grain's workers) and placed on the mesh (`Steps.place_batch`) ahead of time; `Steps.train_step`
(jaxformer/steps.py) is one jit of the forward pass, the MLM + NSP losses, the gradients and the optax update. The
host waits for the device only at log steps, where one transfer brings the metrics (and the first non-finite step,
if any) back. Each checkpoint stores the loader's state at its step (`run_data.checkpoint_meta`).
"""

from __future__ import annotations

import shlex
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import jax
from tqdm.auto import tqdm

from . import distributed, loader, run_data
from .config import TrainConfig
from .data import Prefetcher
from .outputs import Checkpointer, MetricsWriter, plot_losses
from .prepared import PreparedSet
from .steps import Steps, TrainState, evaluate, host_metrics


class TrainingStopped(RuntimeError):
    """Training stopped early for a reason the user must hear (a non-finite loss); exit status 2."""


class Interrupted(TrainingStopped):
    """Ctrl-C in the loop: a checkpoint was saved; train.py exits with status 130."""


class Interrupts:
    """Ctrl-C (SIGINT) during a run. Before the loop the first one stops the run at once (KeyboardInterrupt); in the
    loop (after `arm`) it asks the loop to save a checkpoint and stop after the current step. Either way the next
    one ends the process at once (the signal's default action: nothing more is saved). So no press is lost: not
    while XLA compiles (Python handlers wait for it, the default action does not), nor when a library swallows the
    KeyboardInterrupt (then `check` raises it at the next stage)."""

    def __init__(self):
        self.requested = self.armed = False
        self._previous = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum, frame):
        self.requested = True
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if not self.armed:
            raise KeyboardInterrupt
        print("\nCtrl-C: stopping after this step with a checkpoint (Ctrl-C again: stop at once, without saving)",
              file=sys.stderr, flush=True)

    def check(self) -> None:
        """KeyboardInterrupt if a Ctrl-C came before the loop (and was swallowed on its way)."""
        if self.requested and not self.armed:
            raise KeyboardInterrupt

    def arm(self) -> None:
        self.check()
        self.armed = True

    def restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None


def run(tc: TrainConfig, steps: Steps, state: TrainState, data: PreparedSet, train_batches: loader.TrainBatches,
        ckpt: Checkpointer, out: Path, start: int, meta: dict[str, Any], interrupts: Interrupts | None = None,
        log: Callable = print, started: float | None = None) -> dict[str, Any]:
    """Train from step `start` to `tc.steps` on `train_batches` (this process's rows of the batches from `start`
    on); returns the summary (final metrics, last evaluation, outputs).

    Metrics every `log_every` steps, evaluation every `eval_every` (the first `eval_batches` held-out batches of
    `data`), a checkpoint (state + `meta` + the loader's state) every `save_every`, and all three at the last step.
    Process 0 alone writes metrics and the plot. `started`: the process's start (`time.perf_counter()`), for the
    start-up time logged when the first step is dispatched."""
    main = distributed.is_main()
    stop = interrupts or Interrupts()
    stop.arm()
    # Each process reads only its block of rows of every batch (all rows with one process), train and eval.
    block, n_blocks = steps.batch_block
    eval_batches = [steps.place_batch(b) for b in loader.eval_batches(
        data, tc.batch_size, tc.seed, limit=tc.eval_batches, block=block, n_blocks=n_blocks,
        max_predictions=tc.max_predictions)]
    baseline = loader.most_frequent_token_baseline(data, tc.seed, max_predictions=tc.max_predictions,
                                                   limit=tc.eval_batches * tc.batch_size)
    batches = Prefetcher((steps.place_batch(b) for b in train_batches), depth=2)
    checkpoints = out / "checkpoints"
    summary: dict[str, Any] = dict(out=str(out), most_frequent_token_baseline=baseline)
    writer = MetricsWriter(out) if main else _NoWriter()
    progress = _Progress(tc, start)
    meter, profile = _Throughput(tc.batch_size, batches, start, packed=tc.pack), _Profile(tc, out, log)
    step, recent, last_eval = start, {}, {}
    try:
        if tc.dump_hlo and main:
            (out / "train_step.hlo.txt").write_text(steps.train_step.compile(state, eval_batches[0]).as_text())
            log(f"wrote the optimized HLO of the train step to {out / 'train_step.hlo.txt'}")
        while step < tc.steps:
            profile.before(step)
            batch = next(batches)
            if step == start:
                since = "" if started is None else f"; {time.perf_counter() - started:.1f}s after the start"
                log(f"step {start + 1}: compiling the train step (the first step takes longer than the others){since}")
            state, metrics = steps.train_step(state, batch)
            meter.count(metrics)
            step += 1
            progress.update(metrics, log)
            profile.after(step, state)
            last = step == tc.steps
            stopping = _stop_agreed(stop.requested, step, tc)
            if step % tc.log_every == 0 or last or stopping:
                recent = _log_metrics(metrics, step, meter, writer, progress, ckpt)
            if step % tc.eval_every == 0 or last:
                last_eval = evaluate(steps, state.params, eval_batches)
                writer.write(dict(step=step, **last_eval))
                if main:  # tqdm.write prints even with the bar disabled
                    progress.write(f"step {step}: eval mlm loss {last_eval['eval_mlm_loss']:.3f}, "
                                   f"mlm acc {last_eval['eval_mlm_acc']:.3f}, nsp acc {last_eval['eval_nsp_acc']:.3f}")
            if step % tc.save_every == 0 or last or stopping:
                ckpt.save(step, steps.checkpointed(state),
                          dict(meta, step=step, **run_data.checkpoint_meta(train_batches, step)))
            if stopping:
                raise Interrupted(f"interrupted: saved a checkpoint at step {step} in {checkpoints}; continue "
                                  f"with: python train.py --out {shlex.quote(str(out))} --resume")
    finally:
        if interrupts is None:
            stop.restore()
        progress.close()
        batches.close()
        writer.close()
        plot = plot_losses(out / "metrics.jsonl", out / "loss.png") if main else None
    summary.update(step=step, **{f"final_{k}": v for k, v in recent.items()}, **last_eval,
                   data_wait_s=batches.wait_seconds, plot=str(plot) if plot else None,
                   checkpoint=str(checkpoints / str(step)))
    return summary


def _log_metrics(metrics, step: int, meter: "_Throughput", writer, progress, ckpt: Checkpointer) -> dict[str, float]:
    """One metrics record (loss, accuracies, learning rate, throughput); TrainingStopped at a non-finite loss."""
    fetched = jax.device_get(metrics)  # syncs: the throughput below covers the device work
    recent, bad = host_metrics(fetched), int(fetched["bad_step"])
    if bad >= 0:
        latest = ckpt.latest_step()
        raise TrainingStopped(f"non-finite loss at step {bad + 1}; stopped without saving it ("
                              + ("no checkpoint saved yet)" if latest is None else f"last good checkpoint: step "
                                 f"{latest}, in {ckpt.directory})"))
    record = dict(step=step, **recent, **meter.since_last(step))
    writer.write(record)
    progress.set_postfix(loss=f"{recent['loss']:.3f}", seq_s=f"{record['seq_per_s']:.0f}",
                         tok_s=f"{record['tokens_per_s']:.0f}")
    return recent


def _stop_agreed(requested: bool, step: int, tc: TrainConfig) -> bool:
    """Whether to save and stop after `step`. A stop saves a checkpoint, which every process must join: several
    processes agree at log steps (a Ctrl-C reaches them at slightly different steps, or reaches only one)."""
    if jax.process_count() == 1:
        return requested
    return (step % tc.log_every == 0 or step == tc.steps) and distributed.any_process(requested)


class _Progress:
    """The progress bar, started once the first step (which compiles the train step) is done: its rate and time
    left then count the steps alone."""

    def __init__(self, tc: TrainConfig, start: int):
        self.tc, self.step, self.bar = tc, start, None
        self.began = time.perf_counter()

    def update(self, metrics, log: Callable) -> None:
        self.step += 1
        if self.bar is None:
            jax.block_until_ready(metrics)
            log(f"step {self.step}: done in {time.perf_counter() - self.began:.1f}s (compiling included)")
            self.bar = tqdm(total=self.tc.steps, initial=self.step, dynamic_ncols=True, unit="step",
                            disable=not (self.tc.progress and distributed.is_main()))
        else:
            self.bar.update(1)

    def set_postfix(self, **kwargs) -> None:
        if self.bar is not None:
            self.bar.set_postfix(**kwargs)

    def write(self, text: str) -> None:
        (self.bar or tqdm).write(text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class _Throughput:
    """Rows (sequences) and real (not padding) tokens per second, and seconds spent waiting for data, since the
    previous log step; samples per second too where rows are packed (several samples a row). The steps' token and
    sample counts stay on the device until the log step fetches them."""

    def __init__(self, batch_size: int, batches: Prefetcher, step: int, packed: bool = False):
        self.batch_size, self.batches, self.packed = batch_size, batches, packed
        self.tick, self.step, self.waited = time.perf_counter(), step, 0.0
        self.counts: list = []

    def count(self, metrics) -> None:
        self.counts.append((metrics["n_tokens"], metrics["n_seq"]))

    def since_last(self, step: int) -> dict[str, float]:
        counts = jax.device_get(self.counts)
        now = time.perf_counter()
        seconds = now - self.tick
        out = dict(seq_per_s=(step - self.step) * self.batch_size / seconds,
                   tokens_per_s=sum(float(t) for t, _ in counts) / seconds,
                   data_wait_s=self.batches.wait_seconds - self.waited)
        if self.packed:
            out["samples_per_s"] = sum(float(n) for _, n in counts) / seconds
        self.tick, self.step, self.waited, self.counts = now, step, self.batches.wait_seconds, []
        return out


class _Profile:
    """A jax.profiler trace of steps `profile_steps` = (A, B), A..B-1, into <out>/profile (profile_<i> on process
    i > 0)."""

    def __init__(self, tc: TrainConfig, out: Path, log: Callable):
        self.span, self.log = tc.profile_steps, log
        self.dir = out / ("profile" if distributed.is_main() else f"profile_{jax.process_index()}")

    def before(self, step: int) -> None:
        if self.span and step == self.span[0]:
            jax.profiler.start_trace(str(self.dir))

    def after(self, step: int, state) -> None:
        if self.span and step == self.span[1]:
            jax.block_until_ready(state)
            jax.profiler.stop_trace()
            self.log(f"wrote a profiler trace of steps {self.span[0]}:{step} to {self.dir}")


class _NoWriter:
    """The metrics writer of processes other than 0 (the metrics are the same on every process)."""

    def write(self, record) -> None:
        pass

    def close(self) -> None:
        pass
