"""The train state, the optimizer and the jit-compiled train and eval steps (`Steps`).

One train step, `Steps._train_step` under one jit: the model's forward (`jaxformer.model`), the MLM + NSP losses
(`jaxformer.losses`), `jax.value_and_grad`, then `tx.update` and `optax.apply_updates` with the optimizer of
`make_optimizer` (clipping, then AdamW or LAMB on the warm-up/decay schedule) -> the next `TrainState`. The state
holds the float32 parameters as a plain dict, the optimizer state, the step and the dropout key, so it checkpoints
as one pytree. The loop that feeds the steps is jaxformer/loop.py; the run around it jaxformer/trainer.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax._src import config as _jax_config  # optimization_level as a context (jax 0.10 and 0.11): no public API
from flax import nnx

from . import distributed, ops, sharding
from .config import BertConfig, MeshConfig, TrainConfig
from .losses import pretraining_losses
from .model import BertForPreTraining
from .pipeline import Pipeline


# What `xla_gemm="auto"` means on a GPU (Steps.compiler_options): cuBLAS only. Faster than XLA's per-GEMM choice with
# the Pallas kernels on one device (+1.8% / +3.0%, S=128 / 512) and on every mesh measured: data=2 +2.4-3.5%,
# tensor=2 +3.0%, fsdp=2 equal (benchmarks/results/train-h200.md, distributed-2xh200.md, `--xla-gemm`).
AUTO_XLA_GEMM = "cublas"


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TrainState:
    """step: int32 (); params: dict of float32 arrays; opt_state: optax state; rng: uint32[2] raw dropout key;
    bad_step: int32 (), the first step whose loss was not finite (-1 if none; those updates are skipped);
    compute: the compute-dtype copy of the encoder's stacked weights that the next step reads, written by the
    update with the float32 weights (`Steps.carries_copy`; {path: array}, empty without one). It is a function of
    `params`, so checkpoints leave it out (`Steps.checkpointed`) and a restore recomputes it (`Steps.completed`)."""

    step: jax.Array
    params: Any
    opt_state: Any
    rng: jax.Array
    bad_step: jax.Array
    compute: Any = dataclasses.field(default_factory=dict)


def learning_rate_schedule(tc: TrainConfig) -> optax.Schedule:
    """Linear warm-up to `lr`, then linear (or polynomial, power 2) decay to 0 at `steps`."""
    warmup = min(tc.warmup_steps, tc.steps - 1)
    decay = optax.polynomial_schedule(tc.peak_lr, 0.0, power=1.0 if tc.schedule == "linear" else 2.0,
                                      transition_steps=max(tc.steps - warmup, 1))
    if warmup == 0:
        return decay
    return optax.join_schedules([optax.linear_schedule(0.0, tc.peak_lr, warmup), decay], [warmup])


def _decay_mask(params):
    """Weight decay for weight matrices and embeddings only: not biases, not layernorm scales and biases."""
    def wants_decay(path, _):
        names = [getattr(p, "key", str(p)) for p in path]
        return not (names[-1].endswith("bias") or "layer_norm" in names)
    return jax.tree_util.tree_map_with_path(wants_decay, params)


def global_norm(tree, *, per_layer: bool = False) -> jax.Array:
    """The float32 L2 norm of all of `tree`'s leaves (`optax.tree.norm`). `per_layer`: the squares of a stacked
    layer tensor (L + 2 or more axes) are summed one layer at a time, so XLA reads each layer's gradient where the
    layer loop wrote it instead of fusing the L pieces into one slow reduction (BERT-large S=128: -0.16 ms per step
    on an H200, benchmarks/results/train-h200.md); not where the layer axis is split into pipeline stages, whose
    slices would move between devices."""
    if not per_layer:
        return optax.tree.norm(tree)

    def squares(x):
        x = jnp.square(x.astype(jnp.float32))
        return sum(jnp.sum(x[i]) for i in range(x.shape[0])) if x.ndim >= 3 else jnp.sum(x)
    return jnp.sqrt(sum(squares(x) for x in jax.tree.leaves(tree)))


def clip_by_global_norm(max_norm: float, *, per_layer: bool = False) -> optax.GradientTransformation:
    """`optax.clip_by_global_norm` (the same empty state, so checkpoints carry over, and the same rule) with the
    norm of `global_norm(per_layer=)`."""
    def update(updates, state, params=None):
        del params
        norm = global_norm(updates, per_layer=per_layer)
        trigger = norm < max_norm
        return jax.tree.map(lambda t: jax.lax.select(trigger, t, (t / norm.astype(t.dtype)) * max_norm),
                            updates), state
    return optax.GradientTransformation(optax.init_empty_state, update)


def norms_per_layer(tc: TrainConfig) -> bool:
    """Whether the gradient norm sums one layer at a time (`global_norm(per_layer=)`): no pipeline stages."""
    return MeshConfig.parse(tc.mesh).pipeline == 1


def make_optimizer(tc: TrainConfig, schedule: optax.Schedule | None = None) -> optax.GradientTransformation:
    """AdamW or LAMB (BERT's hyper-parameters) after clipping by global norm, on `schedule` (default: the run's
    warm-up and decay, `learning_rate_schedule`). With `compression_freeze_variance_after` (and compression on) the
    second moment is frozen after those steps and the clip is the compression's, before the exchange."""
    schedule = learning_rate_schedule(tc) if schedule is None else schedule
    compression = tc.compression_config()
    freeze = compression.freeze_variance_after if compression is not None else 0
    if freeze:  # 1-bit Adam: the second moment frozen after the dense steps; the clip is before the exchange
        from .compression.frozen import scale_by_adam_frozen_variance
        trust = (optax.scale_by_trust_ratio(),) if tc.optimizer == "lamb" else ()
        opt = optax.chain(scale_by_adam_frozen_variance(0.9, 0.999, 1e-6, freeze),
                          optax.add_decayed_weights(tc.weight_decay, _decay_mask), *trust,
                          optax.scale_by_learning_rate(schedule))
        return optax.chain(clip_by_global_norm(float("inf"), per_layer=norms_per_layer(tc)), opt)
    if tc.optimizer == "adamw":
        opt = optax.adamw(schedule, b1=0.9, b2=0.999, eps=1e-6, weight_decay=tc.weight_decay, mask=_decay_mask)
    else:
        opt = optax.lamb(schedule, b1=0.9, b2=0.999, eps=1e-6, weight_decay=tc.weight_decay, mask=_decay_mask)
    # Always the same chain (clip_norm 0 clips at infinity), so checkpoints restore across clip settings.
    return optax.chain(clip_by_global_norm(tc.clip_norm or float("inf"), per_layer=norms_per_layer(tc)), opt)


PACKED_KEYS = ("position_ids", "segment_ids", "nsp_positions")  # a packed batch's model inputs (jaxformer/packing.py)


def _forward(graphdef, rest, params, batch, *, deterministic, dropout_key=None, pipeline=None):
    model = nnx.merge(graphdef, params, rest)
    return model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], batch["masked_positions"],
                 deterministic=deterministic, dropout_key=dropout_key, pipeline=pipeline,
                 masked_labels=batch["masked_labels"], **{k: batch[k] for k in PACKED_KEYS if k in batch})


@contextlib.contextmanager
def _tracing(mesh, sequence_parallel: bool = False, level: str | None = None):
    """What the model sees while it is traced on `mesh` (None: one device): `sharding.constrain`, the Pallas kernels'
    `batch_shard_map` and `ops.resolve("auto")` read the mesh and the sequence-parallel switch from here. `level` is
    XLA's optimization level ("O0".."O3", None: JAX's default) for what compiles inside (`Steps.optimization_level`)."""
    with (jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext()), \
            sharding.sequence_parallel(sequence_parallel), \
            (_jax_config.optimization_level(level) if level else contextlib.nullcontext()):
        yield


class _Traced:
    """A jitted step called (and lowered) inside `_tracing`."""

    def __init__(self, fn, mesh, sequence_parallel: bool = False, level: str | None = None):
        self.fn, self.context = fn, functools.partial(_tracing, mesh, sequence_parallel, level)

    def __call__(self, *args):
        with self.context():
            return self.fn(*args)

    def compile(self, *args):
        """The compiled step for `args`, lowered and compiled inside the context: the optimization level is read when
        XLA compiles, so a `lower(...).compile()` outside it would build (and cache) a default-level executable."""
        with self.context():
            return self.fn.lower(*args).compile()


# XLA's optimization level for a batch-parallel train step under `xla_opt_level="auto"` (`Steps.optimization_level`):
# 1-5% faster on 2 GPUs with data or fsdp, no change on one (benchmarks/results/distributed-2xh200.md, XLA's knobs).
BATCH_PARALLEL_OPT_LEVEL = "O2"


class Steps:
    """The compiled train and eval steps of one model and optimizer (the model's structure is static).

    With a `mesh` (`sharding.make_mesh`), the steps are jitted with explicit shardings: parameters, gradients and
    optimizer state as `sharding.PARAM_RULES` says (over `fsdp` that is ZeRO-3), the batch split on B, the state
    donated; `place` puts a state there. Without one, plain `jax.jit` on the default device (benchmarks, tests).
    """

    def __init__(self, model: BertForPreTraining, tx: optax.GradientTransformation, tc: TrainConfig, mesh=None):
        # The structure (graphdef) and the non-parameter state (rest) are static; the parameters live in TrainState.
        self.graphdef, params, self.rest = nnx.split(model, nnx.Param, ...)
        self.tx, self.tc, self.mesh, self.config = tx, tc, mesh, model.config
        self.compute_dtype = jnp.dtype(model.config.compute_dtype)
        self.schedule = learning_rate_schedule(tc)
        # The encoder's schedule: stages = the mesh's `pipeline` axis, microbatches and repeats from the flags
        # (jaxformer/pipeline.py; one stage and one microbatch is the plain layer stack). Checked here, before tracing.
        stages = mesh.shape["pipeline"] if mesh is not None else 1
        self.pipeline = Pipeline(stages=stages, microbatches=tc.microbatches, repeats=tc.pipeline_repeats)
        self.pipeline.check(model.config.num_hidden_layers, tc.batch_size)
        if self.pipeline.is_plain:
            self.pipeline = None
        self.batch_block = (0, 1)  # this process reads block i of k of every global batch (distributed.batch_block)
        options = self.compiler_options()
        if mesh is None:
            self.state_shardings = self.batch_sharding = None
            self.train_step = _Traced(jax.jit(self._train_step, donate_argnums=0, compiler_options=options), None,
                                      False, self.optimization_level())
            self.eval_step = jax.jit(self._eval_step, compiler_options=options)
            return
        replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        param_sh = sharding.param_shardings(params, mesh)
        # Optimizer moments mirror the parameters' shardings; counts and other scalars are replicated.
        opt_abstract = jax.eval_shape(tx.init, nnx.to_pure_dict(params))
        opt_sh = optax.tree_map_params(tx, lambda _, s: s, opt_abstract, param_sh,
                                       transform_non_params=lambda _: replicated,
                                       is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))
        self.state_shardings = TrainState(step=replicated, params=param_sh, opt_state=opt_sh, rng=replicated,
                                          bad_step=replicated,
                                          compute=self._copied(nnx.to_pure_dict(params), like=param_sh))
        self.batch_sharding = sharding.batch_sharding(mesh)
        self.batch_block = distributed.batch_block(self.batch_sharding, tc.batch_size)
        self.train_step = _Traced(jax.jit(self._train_step, in_shardings=(self.state_shardings, self.batch_sharding),
                                          out_shardings=(self.state_shardings, replicated), donate_argnums=0,
                                          compiler_options=options), mesh,
                                  tc.sequence_parallel, self.optimization_level())
        self.eval_step = _Traced(jax.jit(self._eval_step, in_shardings=(param_sh, self.batch_sharding),
                                         out_shardings=replicated, compiler_options=options), mesh,
                                 tc.sequence_parallel)

    def optimization_level(self) -> str | None:
        """XLA's optimization level for the train step ("O0".."O3"; None: JAX's default), from `xla_opt_level`:
        "auto" is `BATCH_PARALLEL_OPT_LEVEL` with data parallelism (data or fsdp > 1) and no pipeline, where
        it was measured faster, and JAX's default elsewhere (not measured better there)."""
        level = self.tc.xla_opt_level
        if level != "auto":
            return None if level == "default" else level
        batch_parallel = self.mesh is not None and any(self.mesh.shape.get(a, 1) > 1 for a in ("data", "fsdp"))
        return BATCH_PARALLEL_OPT_LEVEL if batch_parallel and self.pipeline is None else None

    def compiler_options(self) -> dict | None:
        """XLA options of both steps, from `xla_gemm`: "cublas" turns XLA's Triton GEMM emitter off
        (`xla_gpu_enable_triton_gemm=false`), so every GEMM is a cuBLAS call; "xla" leaves XLA's per-GEMM choice
        (Triton or cuBLAS, autotuned). "auto" is `AUTO_XLA_GEMM` (cuBLAS). Nothing is set off the GPU."""
        choice = self.tc.xla_gemm
        if choice == "auto":
            choice = AUTO_XLA_GEMM
        if choice == "cublas" and jax.default_backend() == "gpu":
            return {"xla_gpu_enable_triton_gemm": False}
        return None

    def resolved_kernels(self, kernels: str) -> str:
        """What `kernels` resolves to inside these steps ("auto" depends on the mesh: jaxformer/ops.py)."""
        with _tracing(self.mesh, self.tc.sequence_parallel):
            return ops.resolve(kernels)

    def place(self, state: TrainState) -> TrainState:
        """`state` on the mesh with the steps' shardings (unchanged without a mesh)."""
        if self.mesh is None:
            return state
        if jax.process_count() == 1:
            return jax.device_put(state, self.state_shardings)
        # Several processes: each built the same state (same seed, same program) on its own first device; every
        # process fills its devices' shards from its host copy (device_put would compare the copies across processes).
        # Arrays created in their sharding already (CompressedSteps' per-rank state) stay as they are.
        def put(x, s):
            if isinstance(x, jax.Array) and x.sharding == s:
                return x
            host = jax.device_get(x)
            return jax.make_array_from_callback(host.shape, s, lambda i: host[i])
        return jax.tree.map(put, state, self.state_shardings)

    def local_rows(self, batch):
        """This process's rows (block `batch_block`) of a global host batch."""
        i, k = self.batch_block
        return batch if k == 1 else jax.tree.map(lambda x: x[i * len(x) // k:(i + 1) * len(x) // k], batch)

    def place_batch(self, local_batch):
        """A global batch array from this process's rows of it (all rows with one process): each process's devices
        hold one aligned block of rows (checked by `distributed.batch_block`), which is `local_batch`."""
        if self.mesh is None:
            return jax.device_put(local_batch)
        k = self.batch_block[1]
        global_shapes = jax.tree.map(lambda x: (x.shape[0] * k,) + x.shape[1:], local_batch)
        return jax.make_array_from_process_local_data(self.batch_sharding, local_batch, global_shapes)

    def initial_state(self, seed: int) -> TrainState:
        """Step 0 of `seed` (the parameters of `build_model(config, seed)`, a fresh optimizer state), computed by one
        jitted program straight into the state's shardings: no copy on one device first, no eager dispatches."""
        return jax.jit(lambda: self._initial_state(seed), out_shardings=self.state_shardings)()

    def abstract_state(self, seed: int = 0) -> TrainState:
        """The shapes, dtypes and shardings of `initial_state` (jax.ShapeDtypeStruct), nothing computed: the
        target a checkpoint restores into."""
        shapes = jax.eval_shape(lambda: self._initial_state(seed))
        if self.state_shardings is None:
            return shapes
        return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), shapes,
                            self.state_shardings)

    def _initial_state(self, seed: int) -> TrainState:
        return self.init_state(_new_model(self.config, seed), seed)

    def init_state(self, model: BertForPreTraining, seed: int) -> TrainState:
        """Step 0 with `model`'s parameters, a fresh optimizer state and the dropout key of `seed`."""
        params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
        return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=self.tx.init(params),
                          rng=jax.random.key_data(jax.random.key(seed)), bad_step=jnp.full((), -1, jnp.int32),
                          compute=self._copied(params))

    def _casts(self) -> bool:
        """Whether the step differentiates through a compute-dtype copy of the stacked weights (`_compute_copy`):
        the plain layer stack in a 16-bit dtype."""
        return self.pipeline is None and self.compute_dtype != jnp.float32

    def carries_copy(self) -> bool:
        """Whether the state carries that copy from one step to the next: the update writes it in the same pass as
        the float32 weights, instead of the next step reading those again to cast them."""
        return self._casts()

    def _cast_layers(self, params, like=None) -> dict:
        """{path: leaf in the compute dtype} of the encoder's stacked weight tensors (L + 2 or more axes) of
        `params`; `like`: a tree of the same structure (e.g. shardings) whose leaves are taken instead."""
        flat = jax.tree_util.tree_flatten_with_path(params["encoder"]["layers"])[0]
        take = [leaf.astype(self.compute_dtype) for _, leaf in flat] if like is None else \
            jax.tree.leaves(like["encoder"]["layers"], is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))
        return {jax.tree_util.keystr(path): t for (path, leaf), t in zip(flat, take) if len(leaf.shape) >= 3}

    def _copied(self, params, like=None) -> dict:
        """The state's carried copy of `params` (`_cast_layers`); empty where no copy is carried."""
        return self._cast_layers(params, like) if self.carries_copy() else {}

    def checkpointed(self, state: TrainState) -> TrainState:
        """What a checkpoint holds of `state` (arrays, shapes or shardings): all of it but the compute copy."""
        return state if state is None else dataclasses.replace(state, compute={})

    def completed(self, state: TrainState) -> TrainState:
        """A restored (`checkpointed`) state with its compute copy, in the steps' shardings."""
        if not self.carries_copy():
            return state
        return jax.jit(lambda s: dataclasses.replace(s, compute=self._copied(s.params)),
                       out_shardings=self.state_shardings, donate_argnums=0)(state)

    def _compute_copy(self, params, compute: dict | None = None):
        """`params` with the encoder's stacked weight tensors (L + 2 or more axes) already in the compute dtype:
        `compute`, the state's carried copy of them (`_copied`), or cast here without one.

        The layers cast these weights at use anyway; differentiating with respect to the cast copy keeps their
        gradients in bf16 until after the layer loop (bit-identical on one device, tests/test_train_step.py) and
        halves the loop's weight reads and gradient writes (BERT-large +1.2-1.7% seq/s on an H200:
        benchmarks/results/distributed-2xh200.md, gradients through a bf16 copy). Not with pipeline microbatches,
        whose weight gradients accumulate in float32. The optimizer sees float32."""
        if not self._casts():
            return params
        compute = compute or self._cast_layers(params)
        layers = jax.tree_util.tree_map_with_path(lambda path, p: compute.get(jax.tree_util.keystr(path), p),
                                                  params["encoder"]["layers"])
        return {**params, "encoder": {**params["encoder"], "layers": layers}}

    def _train_step(self, state: TrainState, batch) -> tuple[TrainState, dict[str, jax.Array]]:
        rng, dropout_key = jax.random.split(jax.random.wrap_key_data(state.rng))

        def loss_fn(params):
            out = _forward(self.graphdef, self.rest, params, batch, deterministic=False, dropout_key=dropout_key,
                           pipeline=self.pipeline)
            return pretraining_losses(out, batch)

        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            self._compute_copy(state.params, state.compute))
        grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, state.params)
        updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        finite = jnp.isfinite(loss)
        # A non-finite loss leaves parameters and optimizer state untouched and records the step.
        keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)  # noqa: E731
        params = keep(params, state.params)
        new = TrainState(step=state.step + 1, params=params, opt_state=keep(opt_state, state.opt_state),
                         rng=jax.random.key_data(rng),
                         bad_step=jnp.where((state.bad_step < 0) & ~finite, state.step, state.bad_step),
                         compute=self._copied(params))
        # bad_step rides along with the metrics so a log step needs one device-to-host transfer, not two.
        metrics.update(grad_norm=global_norm(grads, per_layer=norms_per_layer(self.tc)), lr=self.schedule(state.step),
                       bad_step=new.bad_step)
        return new, metrics

    def _eval_step(self, params, batch) -> dict[str, jax.Array]:
        out = _forward(self.graphdef, self.rest, params, batch, deterministic=True, pipeline=self.pipeline)
        _, metrics = pretraining_losses(out, batch)
        return metrics


def evaluate(steps: Steps, params, batches) -> dict[str, float]:
    """MLM loss and accuracy over all masked positions, NSP accuracy over all samples of `batches`."""
    totals: dict[str, float] = {}
    # Dispatch every batch first, then one transfer: the device never waits for the host between batches.
    for m in jax.device_get([steps.eval_step(params, batch) for batch in batches]):
        for k in ("mlm_correct", "n_masked", "nsp_correct", "n_seq"):
            totals[k] = totals.get(k, 0.0) + float(m[k])
        totals["mlm_loss_sum"] = totals.get("mlm_loss_sum", 0.0) + float(m["mlm_loss"]) * float(m["n_masked"])
    return dict(eval_mlm_loss=totals["mlm_loss_sum"] / max(totals["n_masked"], 1.0),
                eval_mlm_acc=totals["mlm_correct"] / max(totals["n_masked"], 1.0),
                eval_nsp_acc=totals["nsp_correct"] / max(totals["n_seq"], 1.0))


def host_metrics(m: dict[str, Any]) -> dict[str, float]:
    """Loggable floats from a train step's metrics (already on the host)."""
    out = {k: float(m[k]) for k in ("loss", "mlm_loss", "nsp_loss", "grad_norm", "lr")}
    out["mlm_acc"] = float(m["mlm_correct"]) / max(float(m["n_masked"]), 1.0)
    out["nsp_acc"] = float(m["nsp_correct"]) / max(float(m["n_seq"]), 1.0)
    for k in ("compression_selected", "compression_overflowed"):  # compressed steps: entries, all devices summed
        if k in m:
            out[k] = int(m[k])
    return out


def _new_model(cfg: BertConfig, seed: int) -> BertForPreTraining:
    return BertForPreTraining(cfg, rngs=nnx.Rngs(params=seed, dropout=seed + 1))


def build_model(cfg: BertConfig, seed: int, abstract: bool = False) -> BertForPreTraining:
    """BertForPreTraining with the parameters of `seed`, built under jit (one compile instead of hundreds of small
    eager dispatches). `abstract`: the parameters as shapes only (jax.ShapeDtypeStruct), none computed: what
    `Steps` needs, whose `initial_state` then computes them straight into their shardings."""
    if not abstract:
        return nnx.jit(lambda: _new_model(cfg, seed))()
    graphdef, params, _ = nnx.split(nnx.eval_shape(lambda: _new_model(cfg, seed)), nnx.Param, ...)
    # The other state (the dropout stream) as values; XLA drops the parameters' initialisation as dead code.
    rest = jax.jit(lambda: nnx.split(_new_model(cfg, seed), nnx.Param, ...)[2])()
    return nnx.merge(graphdef, params, rest)
