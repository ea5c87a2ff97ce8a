"""Pre-training: `train(tc)`, the whole run that `python train.py` starts, as four steps:

1. `run.prepare`: the output directory (`--out`, or runs/<timestamp>; one run's own) and, with `--resume`, the
   checks of the flags against the run's run.json;
2. `load_data`: the prepared set (`--data DIR`, or the text prepared on the fly into the cache:
   jaxformer/run_data.py) and its tokenizer, every data error before any model work; then the data loader
   (`loader.train_batches`), whose worker processes start while the model is built and compiled;
3. `build_state`: the model, its compiled steps on the device mesh (`steps.Steps`; with `--grad-compression`,
   `compression.CompressedSteps`) and the `TrainState` (restored from the newest checkpoint that verifies, with
   `--resume`);
4. `loop.run`: the steps, metrics, evaluation, checkpoints and interrupts.

A batch's path to the optimizer: `loader.train_batches` (this process's rows, read from the shards and masked in
Grain's worker processes) -> `Steps.place_batch` (device arrays, in a background thread) -> `Steps.train_step`
(jaxformer/steps.py: one jit of forward, losses, gradients and the optax update of `steps.make_optimizer`) -> the
next `TrainState`.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from . import distributed, loop, run, run_data, sharding
from .compression import make_steps
from .config import DEFAULT_COMPILE_CACHE, DEFAULT_VOCAB_SIZE, BertConfig, MeshConfig, TrainConfig
from .loop import Interrupted, TrainingStopped
from .outputs import CheckpointError, Checkpointer, truncate_metrics
from .prepared import PreparedSet
from .steps import Steps, TrainState, build_model

__all__ = ["Interrupted", "TrainingStopped", "build_state", "load_data", "train"]


def train(tc: TrainConfig, log: Callable = print, started: float | None = None) -> dict[str, Any]:
    """Pre-train as `tc` says; returns a summary. User errors raise ValueError before anything is compiled; a
    Ctrl-C before the loop raises KeyboardInterrupt, one in the loop `Interrupted` (after saving a checkpoint).
    `started`: the `time.perf_counter()` of the process's start (default: now), for the start-up time logged at
    the first step.

    With `tc.resume`, `tc` must agree with the run's run.json on the fields that define the run:
    `run.resumed_config` builds such a config from the flags given again. With several processes
    (jaxformer.distributed) every process calls this with the same `tc`; process 0 alone logs and writes metrics,
    plots, run.json and the tokenizer, and orbax writes each checkpoint once."""
    started = time.perf_counter() if started is None else started
    interrupts = loop.Interrupts()
    use_compile_cache(tc.compile_cache)
    try:
        # Join the other processes first: the mesh check below already asks JAX for its (global) device count.
        distributed.initialize(distributed.resolve(tc.coordinator, tc.num_processes, tc.process_id))
        if not distributed.is_main():
            log = _quiet  # process 0 speaks for the run
        # The mesh checks first (again below with the tokenizer's vocabulary): a bad --mesh fails before data work.
        mesh_cfg = _check_mesh(tc, tc.model_config(tc.vocab_size or DEFAULT_VOCAB_SIZE))
        record = None
        if tc.resume:
            path = run.resume_dir(tc.out)
            record = run.read_record(path)
            run.check_resume(tc, record, path, log, mesh_cfg)
        output = run.prepare(tc)
        try:
            return _train(tc, output.path, record, interrupts, log, started)
        except BaseException:
            output.remove_if_unused()
            raise
    finally:
        interrupts.restore()


def use_compile_cache(setting: str | None) -> Path | None:
    """Turn on JAX's persistent compilation cache in `setting` (TrainConfig.compile_cache; None: the directory
    already configured, $JAX_COMPILATION_CACHE_DIR, else DEFAULT_COMPILE_CACHE; "none": off). Programs that took
    more than JAX's threshold (1 s) to compile are stored, so a run started again with the same model, mesh and
    flags loads its train step instead of compiling it. Returns the directory in use (None: off)."""
    from jax.experimental.compilation_cache import compilation_cache
    before = (jax.config.jax_enable_compilation_cache, jax.config.jax_compilation_cache_dir)
    path = None if setting == "none" else \
        Path(setting or jax.config.jax_compilation_cache_dir or DEFAULT_COMPILE_CACHE).expanduser()
    jax.config.update("jax_enable_compilation_cache", path is not None)
    if path is not None:
        jax.config.update("jax_compilation_cache_dir", str(path))
    if before != (jax.config.jax_enable_compilation_cache, jax.config.jax_compilation_cache_dir):
        compilation_cache.reset_cache()  # JAX decides once per process whether and where to cache: again
    return path


def _check_mesh(tc: TrainConfig, cfg: BertConfig) -> MeshConfig:
    mesh_cfg = sharding.validate(tc.mesh, cfg, tc)
    if tc.sequence_parallel and mesh_cfg.tensor == 1:
        raise ValueError(f"sequence_parallel=True needs a tensor axis > 1 (mesh={tc.mesh!r} resolves to "
                         f"{mesh_cfg.spec()}): it splits the sequence over `tensor`")
    return mesh_cfg


def _train(tc: TrainConfig, out: Path, record: dict | None, interrupts: "loop.Interrupts", log: Callable,
           started: float) -> dict[str, Any]:
    ckpt = Checkpointer(out / "checkpoints")
    batches, at = None, 0
    try:
        if record is not None:  # every check of the resume before any data or model work
            if not (out / "tokenizer.json").is_file():
                raise CheckpointError(f"--resume: the run's tokenizer {out / 'tokenizer.json'} is missing")
            run.check_inputs(record, run_data.identity(tc), out / "tokenizer.json")
            at = ckpt.latest_step()
            if at is None:
                raise CheckpointError(f"--resume: no complete checkpoint under {ckpt.directory} (the run stopped "
                                      "before its first): start it afresh with --overwrite")
            pieces = run.schedule_pieces(record, tc.steps, at)
        data = load_data(tc, out, log)
        interrupts.check()
        if record is None:  # a trained tokenizer's size is not the run's setting (vocab_size is)
            given = tc.vocab is not None or run_data.prepared_dir(tc.data) is not None
            tc = run.resolved(tc, data.vocab_size if given else None)
        cfg = tc.model_config(data.vocab_size)
        mesh_cfg = _check_mesh(tc, cfg)
        if record is None:
            record = run.new_record(tc, cfg, out / "tokenizer.json", run_data.identity(tc), mesh_cfg)
            run.write_record(out, record)
            pieces = record["schedule"]
        else:
            run.check_model(record, cfg)
            if pieces != record["schedule"]:
                log(f"extending the run from {record['schedule'][-1][1]} to {tc.steps} steps at step {at}: the "
                    "learning rate goes on from its value there down to 0 (docs/training.md)")
        # The loader first: its worker processes start while the model is built and compiled.
        block = distributed.batch_block(sharding.batch_sharding(sharding.make_mesh(mesh_cfg)), tc.batch_size)
        batches = run_data.train_batches(tc, data, block, ckpt, at, log)
        steps, state, start = build_state(cfg, mesh_cfg, tc, ckpt if tc.resume else None, pieces, log,
                                          record.get("params_format", 1))
        if (start, steps.batch_block) != (at, block):  # an older checkpoint restored (the newest was damaged)
            batches.close()
            batches = run_data.train_batches(tc, data, steps.batch_block, ckpt, start, log)
        if tc.resume:
            run.write_record(out, run.resumed_record(record, tc, pieces, mesh_cfg))
            if distributed.is_main():
                dropped = truncate_metrics(out / "metrics.jsonl", start)
                if dropped:
                    log(f"metrics.jsonl: dropped {dropped} records after step {start} (they are written again)")
        interrupts.check()
        meta = dict(model_config=cfg.to_dict(), train_config=run.as_json(dataclasses.asdict(tc)))
        summary = loop.run(tc, steps, state, data, batches, ckpt, out, start, meta, interrupts, log, started)
        return dict(summary, total_steps=pieces[-1][1])
    finally:
        if batches is not None:
            batches.close()
        ckpt.close()


def load_data(tc: TrainConfig, out: Path, log: Callable = print) -> PreparedSet:
    """The run's prepared set (`--data DIR`, or the text of `--data` or the built-in corpus prepared on the fly into
    the cache: jaxformer/run_data.py) and its tokenizer in <out>/tokenizer.json (`--vocab`, the prepared set's, the
    run's own with `--resume`, or one trained on the text)."""
    return run_data.load(tc, out, log)


def build_state(cfg: BertConfig, mesh_cfg: MeshConfig, tc: TrainConfig, ckpt: Checkpointer | None = None,
                pieces: list[list[int]] | None = None, log: Callable = print,
                params_format: int = run.PARAMS_FORMAT) -> tuple[Steps, TrainState, int]:
    """The compiled steps of the model on the mesh, the train state placed there and its step: initialised from
    `tc.seed` (step 0), or, with a `ckpt`, restored from its newest checkpoint that verifies (stored in
    `params_format`: run.PARAMS_FORMAT's, or 1, converted). `pieces`: the learning-rate schedule's
    (jaxformer/run.py; default one piece of `tc.steps`)."""
    pieces = pieces or [[0, tc.steps]]
    mesh = sharding.make_mesh(mesh_cfg)
    model = build_model(cfg, tc.seed, abstract=True)  # shapes: the state is computed (or restored) in place below
    scheduled = dataclasses.replace(tc, steps=pieces[0][1])  # the schedule's total, whatever --steps stops at
    steps = make_steps(model, run.optimizer(scheduled, pieces), scheduled, mesh)  # compressed: jaxformer/compression
    if len(pieces) > 1:
        steps.schedule = run.schedule(scheduled, pieces)  # the rate the metrics report
    if ckpt is None:
        start, state = 0, steps.initial_state(tc.seed)
    else:
        like = steps.checkpointed(steps.abstract_state(tc.seed))
        if params_format == 1:
            start, state = ckpt.restore_newest(_swap_qkv(like), log)
            state = jax.jit(_swap_qkv, out_shardings=steps.checkpointed(steps.state_shardings))(state)
            log("converted the checkpoint's QKV kernel from the (L, C, D, N, H) order of earlier versions")
        else:
            start, state = ckpt.restore_newest(like, log)
        state = steps.completed(state)
        log(f"resumed from {ckpt.directory / str(start)} at step {start}")
    n_params = sum(x.size for x in jax.tree.leaves(state.params))
    log(f"model: {tc.config} ({n_params / 1e6:.1f}M parameters, {cfg.dtype}, "
        f"kernels={steps.resolved_kernels(cfg.kernels)}) on "
        f"{mesh_cfg.size} {jax.devices()[0].platform} device(s), mesh {sharding.describe(mesh)}; {tc.optimizer}, "
        f"lr {tc.peak_lr}, batch {tc.batch_size}"
        + ("" if tc.grad_compression == "none" else f"; gradients over data: {tc.grad_compression}, density "
           f"{tc.density}"))
    return steps, state, start


def _swap_qkv(state):
    """`state` with the C and D axes of every QKV-kernel array swapped (parameter, moments, compression residuals:
    (..., C, D, N, H) <-> (..., D, C, N, H)); shapes (jax.ShapeDtypeStruct, with their shardings) or arrays."""
    def swap(path, x):
        if not any(getattr(k, "key", None) == "qkv_kernel" for k in path) or len(x.shape) < 4 \
                or 3 not in x.shape[-4:-2]:  # not an array of the kernel's layout (a per-tensor statistic)
            return x
        if not isinstance(x, jax.ShapeDtypeStruct):
            return jnp.swapaxes(x, -4, -3)
        shape = list(x.shape)
        shape[-4], shape[-3] = shape[-3], shape[-4]
        sharding = x.sharding
        if isinstance(sharding, NamedSharding):
            spec = list(sharding.spec) + [None] * (len(shape) - len(sharding.spec))
            spec[-4], spec[-3] = spec[-3], spec[-4]
            sharding = NamedSharding(sharding.mesh, PartitionSpec(*spec))
        return jax.ShapeDtypeStruct(tuple(shape), x.dtype, sharding=sharding)
    return jax.tree_util.tree_map_with_path(swap, state)


def _quiet(*args, **kwargs) -> None:
    """The log of processes other than 0."""
