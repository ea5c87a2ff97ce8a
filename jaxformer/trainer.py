"""Pre-training: the training loop (`train`), from the data to checkpoints, metrics and plots.

A batch's path: `data.PretrainingData.train_batches` (host, background thread) -> `Prefetcher` ->
`steps.Steps.train_step` (one jit: forward, MLM + NSP losses, gradients, optax update) -> `steps.TrainState`.
"""

from __future__ import annotations

import dataclasses
import signal
import threading
import time
from pathlib import Path
from typing import Any

import jax
from tqdm.auto import tqdm

from . import distributed, sharding
from .config import TrainConfig
from .data import DataConfig, Prefetcher, PretrainingData, builtin_corpus, load_or_train_tokenizer
from .outputs import CheckpointError, Checkpointer, MetricsWriter, plot_losses
from .steps import Steps, build_model, evaluate, host_metrics, make_optimizer


# ----------------------------------------------------------------------------------------------- the loop
class TrainingStopped(RuntimeError):
    """Training stopped early for a reason the user must hear (non-finite loss, Ctrl-C); exit status 2."""


def _resolve_out(tc: TrainConfig) -> Path:
    if tc.out is not None:
        return Path(tc.out)
    runs = Path("runs")
    if tc.resume:  # resume the most recent run
        previous = sorted(p for p in runs.glob("*") if (p / "checkpoints").is_dir()) if runs.is_dir() else []
        if not previous:
            raise CheckpointError("--resume without --out found no earlier run under runs/")
        return previous[-1]
    return runs / time.strftime("%Y%m%d-%H%M%S")


# Model-config fields that change how the step runs, not what the parameters are: a resumed run may change them.
_RUNTIME_FIELDS = frozenset({"kernels", "layouts", "remat", "scan_layers"})


def _config_diff(saved: dict, current: dict) -> dict[str, str]:
    return {k: f"{k}: checkpoint {saved.get(k)!r} vs now {current.get(k)!r}"
            for k in sorted(set(saved) | set(current)) if saved.get(k) != current.get(k)}


def train(tc: TrainConfig, log=print) -> dict[str, Any]:
    """Pre-train as `tc` says; returns a summary. User errors raise ValueError before anything is compiled.

    With several processes (jaxformer.distributed) every process calls this with the same `tc`; process 0 alone
    logs and writes metrics, plots and the tokenizer, and orbax writes each checkpoint once."""
    # Join the other processes first: the mesh check below already asks JAX for its (global) device count.
    distributed.initialize(distributed.resolve(tc.coordinator, tc.num_processes, tc.process_id))
    main = distributed.is_main()
    if not main:
        log = lambda *args, **kwargs: None  # noqa: E731 (process 0 speaks for the run)
    # The mesh checks first (again below with the tokenizer's vocabulary): a bad --mesh fails before any data work.
    sharding.validate(tc.mesh, tc.model_config(tc.vocab_size or 30522), tc)
    out = _resolve_out(tc)
    if tc.out is None and not tc.resume:
        out = Path(distributed.broadcast_text(str(out)))  # process 0's timestamp: one run directory for all
    ckpt_dir = out / "checkpoints"
    if tc.resume and not (ckpt_dir.is_dir() and any(ckpt_dir.iterdir())):
        raise CheckpointError(f"--resume: no checkpoint under {ckpt_dir}")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # unwritable or impossible path: a user error, before any data or model work
        raise ValueError(f"out={str(out)!r} cannot be created as the output directory: {e.strerror or e}") from e

    # Data first: every data error surfaces before the model is built or compiled.
    paths = tc.data if tc.data is not None else builtin_corpus()
    if tc.data is None:
        log(f"data: built-in corpus (Python standard library docs) at {paths}")
    vocab = tc.vocab
    if vocab is None and tc.resume and (out / "tokenizer.json").exists():
        vocab = out / "tokenizer.json"
    tokenizer = None
    if main or vocab is not None:  # a given vocabulary: every process loads it, process 0 copies it to out/
        tokenizer = load_or_train_tokenizer(vocab, paths, tc.vocab_size or 4096,
                                            save_dir=out if main else None)  # -> out/tokenizer.json
    if vocab is None:
        # WordPiece training is not reproducible run to run: process 0 trains, the others load its file.
        distributed.barrier("jaxformer-tokenizer")
        if tokenizer is None:
            tokenizer = load_or_train_tokenizer(out / "tokenizer.json")
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    if tc.vocab is not None and tc.vocab_size is not None and vocab_size != tc.vocab_size:
        raise ValueError(f"--vocab {tc.vocab} has {vocab_size} tokens but vocab_size={tc.vocab_size} was fixed")
    data = PretrainingData(DataConfig(paths=paths, seq_len=tc.seq_len, max_predictions_per_seq=tc.max_predictions,
                                      seed=tc.seed), tokenizer)
    if data.stats.undecodable_lines:
        log(f"data: skipped {data.stats.undecodable_lines} lines with undecodable bytes")
    cfg = tc.model_config(vocab_size)
    mesh_cfg = sharding.validate(tc.mesh, cfg, tc)
    steps_per_epoch = data.steps_per_epoch(tc.batch_size)
    log(f"data: {data.num_train_examples} training / {data.num_eval_examples} eval examples "
        f"({steps_per_epoch} steps per epoch), vocab {vocab_size}, seq_len {tc.seq_len}")

    ckpt = Checkpointer(ckpt_dir)
    start = 0
    meta = dict(model_config=cfg.to_dict(), train_config=dataclasses.asdict(tc))
    if tc.resume:
        start = ckpt.latest_step()
        if start is None:
            raise CheckpointError(f"--resume: no complete checkpoint under {ckpt_dir}")
        saved = ckpt.read_meta(start)
        diff = _config_diff(saved["model_config"], meta["model_config"])
        different = [text for k, text in diff.items() if k not in _RUNTIME_FIELDS]
        if different:
            raise CheckpointError("--resume: the checkpoint is of a different model config: " + "; ".join(different))
        if len(different) < len(diff):
            log("resume with a different execution (same parameters): "
                + "; ".join(text for k, text in diff.items() if k in _RUNTIME_FIELDS))
        if saved["train_config"]["optimizer"] != tc.optimizer:
            raise CheckpointError(f"--resume: the checkpoint's optimizer is {saved['train_config']['optimizer']!r}, "
                                  f"not optimizer={tc.optimizer!r}")
        if start >= tc.steps:
            raise ValueError(f"--resume: the checkpoint is at step {start}, not below --steps {tc.steps}")

    mesh = sharding.make_mesh(mesh_cfg)
    model = build_model(cfg, tc.seed)
    steps = Steps(model, make_optimizer(tc), tc, mesh)
    state = steps.place(steps.init_state(model, tc.seed))
    del model  # its arrays now live (sharded by the rules) in `state`
    if tc.resume:
        state = ckpt.restore(start, state)
        log(f"resumed from {ckpt_dir / str(start)} at step {start}")
    n_params = sum(x.size for x in jax.tree.leaves(state.params))
    log(f"model: {tc.config} ({n_params / 1e6:.1f}M parameters, {cfg.dtype}, "
        f"kernels={steps.resolved_kernels(cfg.kernels)}) on "
        f"{mesh_cfg.size} {jax.devices()[0].platform} device(s), mesh {sharding.describe(mesh)}; {tc.optimizer}, "
        f"lr {tc.peak_lr}, batch {tc.batch_size}")

    # Each process assembles only its block of rows of every batch (all rows with one process), train and eval.
    block, n_blocks = steps.batch_block
    eval_batches = [steps.place_batch(steps.local_rows(b))
                    for b in data.eval_batches(tc.batch_size)[:tc.eval_batches]]
    baseline = data.most_frequent_token_baseline
    on_device = (steps.place_batch(b) for b in data.train_batches(tc.batch_size, start, block, n_blocks))
    batches = Prefetcher(on_device, depth=2)
    writer = MetricsWriter(out) if main else _NoWriter()
    stop = _StopFlag()
    summary: dict[str, Any] = dict(out=str(out), most_frequent_token_baseline=baseline)
    last_eval: dict[str, float] = {}
    progress = tqdm(total=tc.steps, initial=start, disable=not (tc.progress and main), dynamic_ncols=True, unit="step")
    step, tick, tick_step, wait0, recent = start, time.perf_counter(), start, 0.0, {}
    try:
        if tc.dump_hlo and main:
            hlo = steps.train_step.compile(state, eval_batches[0]).as_text()
            (out / "train_step.hlo.txt").write_text(hlo)
            log(f"wrote the optimized HLO of the train step to {out / 'train_step.hlo.txt'}")
        while step < tc.steps:
            if tc.profile_steps and step == tc.profile_steps[0]:
                jax.profiler.start_trace(str(out / ("profile" if main else f"profile_{jax.process_index()}")))
            state, metrics = steps.train_step(state, next(batches))
            step += 1
            progress.update(1)
            if tc.profile_steps and step == tc.profile_steps[1]:
                jax.block_until_ready(state)
                jax.profiler.stop_trace()
                log(f"wrote a profiler trace of steps {tc.profile_steps[0]}:{step} to {out / 'profile'}")
            stopping = stop.requested
            if jax.process_count() > 1:
                # A stop saves a checkpoint, which every process must join: the processes agree at log steps (a
                # Ctrl-C reaches them at slightly different steps, or reaches only one).
                stopping = (step % tc.log_every == 0 or step == tc.steps) and distributed.any_process(stopping)
            if step % tc.log_every == 0 or step == tc.steps or stopping:
                fetched = jax.device_get(metrics)  # syncs: the time below covers the device work
                recent, bad = host_metrics(fetched), int(fetched["bad_step"])
                if bad >= 0:
                    raise TrainingStopped(f"non-finite loss at step {bad + 1}; stopped without saving it "
                                          f"(last good checkpoint: step {ckpt.latest_step()})")
                now = time.perf_counter()
                record = dict(step=step, **recent, seq_per_s=(step - tick_step) * tc.batch_size / (now - tick),
                              data_wait_s=batches.wait_seconds - wait0)
                tick, tick_step, wait0 = now, step, batches.wait_seconds
                writer.write(record)
                progress.set_postfix(loss=f"{recent['loss']:.3f}", seq_s=f"{record['seq_per_s']:.0f}")
            if step % tc.eval_every == 0 or step == tc.steps:
                last_eval = evaluate(steps, state.params, eval_batches)
                writer.write(dict(step=step, **last_eval))
                if main:  # tqdm.write prints even with the bar disabled
                    progress.write(f"step {step}: eval mlm loss {last_eval['eval_mlm_loss']:.3f}, "
                                   f"mlm acc {last_eval['eval_mlm_acc']:.3f}, nsp acc {last_eval['eval_nsp_acc']:.3f}")
            if step % tc.save_every == 0 or step == tc.steps or stopping:
                ckpt.save(step, state, dict(meta, step=step))
            if stopping:
                raise TrainingStopped(f"interrupted: saved a checkpoint at step {step} in {ckpt_dir}; "
                                      f"continue with: python train.py --out {out} --resume")
    finally:
        stop.restore()
        progress.close()
        batches.close()
        writer.close()
        ckpt.close()
        plot = plot_losses(out / "metrics.jsonl", out / "loss.png") if main else None
    summary.update(step=step, **{f"final_{k}": v for k, v in recent.items()}, **last_eval,
                   data_wait_s=batches.wait_seconds, plot=str(plot) if plot else None,
                   checkpoint=str(ckpt_dir / str(step)))
    return summary


class _NoWriter:
    """The metrics writer of processes other than 0 (the metrics are the same on every process)."""

    def write(self, record) -> None:
        pass

    def close(self) -> None:
        pass


class _StopFlag:
    """The first Ctrl-C asks the loop to save and stop after the current step; a second one aborts at once."""

    def __init__(self):
        self.requested = False
        self._previous = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def restore(self):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None
