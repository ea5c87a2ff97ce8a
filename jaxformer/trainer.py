"""Pre-training: `train(tc)`, the whole run that `python train.py` starts, as four steps:

1. `run.output_dir`: the output directory (`--out`, or runs/<timestamp>; what `--resume` needs there);
2. `load_data`: the tokenizer and the MLM + NSP examples (`data.PretrainingData`), every data error before any
   model work;
3. `build_state`: the model, its compiled steps on the device mesh (`steps.Steps`) and the `TrainState` (restored
   from the latest checkpoint with `--resume`);
4. `loop.run`: the steps, metrics, evaluation, checkpoints and interrupts.

A batch's path to the optimizer: `PretrainingData.train_batches` (numpy rows on the host) -> `Steps.place_batch`
(device arrays, in a background thread) -> `Steps.train_step` (jaxformer/steps.py: one jit of forward, losses,
gradients and the optax update of `steps.make_optimizer`) -> the next `TrainState`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import jax

from . import distributed, loop, run, sharding
from .config import BertConfig, MeshConfig, TrainConfig
from .data import DataConfig, PretrainingData, builtin_corpus, load_or_train_tokenizer
from .loop import TrainingStopped
from .outputs import Checkpointer
from .steps import Steps, TrainState, build_model, make_optimizer

__all__ = ["TrainingStopped", "build_state", "load_data", "train"]


def train(tc: TrainConfig, log: Callable = print) -> dict[str, Any]:
    """Pre-train as `tc` says; returns a summary. User errors raise ValueError before anything is compiled.

    With several processes (jaxformer.distributed) every process calls this with the same `tc`; process 0 alone
    logs and writes metrics, plots and the tokenizer, and orbax writes each checkpoint once."""
    # Join the other processes first: the mesh check below already asks JAX for its (global) device count.
    distributed.initialize(distributed.resolve(tc.coordinator, tc.num_processes, tc.process_id))
    if not distributed.is_main():
        log = _quiet  # process 0 speaks for the run
    # The mesh checks first (again below with the tokenizer's vocabulary): a bad --mesh fails before any data work.
    sharding.validate(tc.mesh, tc.model_config(tc.vocab_size or 30522), tc)
    out = run.output_dir(tc)
    data = load_data(tc, out, log)
    cfg = tc.model_config(data.vocab_size)
    mesh_cfg = sharding.validate(tc.mesh, cfg, tc)
    ckpt = Checkpointer(out / "checkpoints")
    try:
        meta = run.metadata(cfg, tc)
        start = run.resume_step(ckpt, meta, tc, log) if tc.resume else 0
        steps, state = build_state(cfg, mesh_cfg, tc, ckpt if tc.resume else None, start, log)
        return loop.run(tc, steps, state, data, ckpt, out, start, meta, log)
    finally:
        ckpt.close()


def load_data(tc: TrainConfig, out: Path, log: Callable = print) -> PretrainingData:
    """The tokenizer (`--vocab`, the run's own from an earlier start, or trained on the corpus and saved as
    <out>/tokenizer.json) and the examples of the corpus (`--data`, or the built-in one)."""
    main = distributed.is_main()
    paths = tc.data if tc.data is not None else builtin_corpus()
    if tc.data is None:
        log(f"data: built-in corpus (Python standard library docs) at {paths}")
    vocab = tc.vocab
    if vocab is None and tc.resume and (out / "tokenizer.json").exists():
        vocab = out / "tokenizer.json"
    tokenizer = None
    if main or vocab is not None:  # a given vocabulary: every process loads it, process 0 copies it to out/
        tokenizer = load_or_train_tokenizer(vocab, paths, tc.vocab_size or 4096, save_dir=out if main else None)
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
    steps_per_epoch = data.steps_per_epoch(tc.batch_size)  # DataError if the corpus cannot fill one batch
    log(f"data: {data.num_train_examples} training / {data.num_eval_examples} eval examples "
        f"({steps_per_epoch} steps per epoch), vocab {vocab_size}, seq_len {tc.seq_len}")
    return data


def build_state(cfg: BertConfig, mesh_cfg: MeshConfig, tc: TrainConfig, ckpt: Checkpointer | None = None,
                start: int = 0, log: Callable = print) -> tuple[Steps, TrainState]:
    """The compiled steps of the model on the mesh, and the train state placed there: initialised from `tc.seed`,
    then, with a `ckpt`, restored from its step `start`."""
    mesh = sharding.make_mesh(mesh_cfg)
    model = build_model(cfg, tc.seed)
    steps = Steps(model, make_optimizer(tc), tc, mesh)
    state = steps.place(steps.init_state(model, tc.seed))  # the model's arrays now live (sharded) in `state`
    if ckpt is not None:
        state = ckpt.restore(start, state)
        log(f"resumed from {ckpt.directory / str(start)} at step {start}")
    n_params = sum(x.size for x in jax.tree.leaves(state.params))
    log(f"model: {tc.config} ({n_params / 1e6:.1f}M parameters, {cfg.dtype}, "
        f"kernels={steps.resolved_kernels(cfg.kernels)}) on "
        f"{mesh_cfg.size} {jax.devices()[0].platform} device(s), mesh {sharding.describe(mesh)}; {tc.optimizer}, "
        f"lr {tc.peak_lr}, batch {tc.batch_size}")
    return steps, state


def _quiet(*args, **kwargs) -> None:
    """The log of processes other than 0."""
