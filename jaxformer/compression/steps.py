"""`CompressedSteps`: `jaxformer.steps.Steps` whose train step exchanges sparse gradients over the `data` axis.

The step is one `shard_map` manual over `data` only: each data rank runs the forward and backward pass on its rows
of the batch, with `tensor`, `pipeline` and `fsdp` left to GSPMD inside it (the model's sharding constraints skip
the manual axis: `sharding.logical_to_spec`), so its gradient is the local one. The losses are normalised by the
global counts (one scalar `psum` each), so the ranks' gradients sum to the dense step's. `sparse_allreduce` then
replaces the dense all-reduce over `data`; `fsdp`'s gradient reduce-scatter stays dense (it is already sharded: each
device receives only its own slice). The optimizer, the TrainState, the metrics and the donated shardings are the
dense step's; the transform's state is the first half of `opt_state`, as `optax.chain(sparse_allreduce, optimizer)`
lays it out, so it checkpoints with the optimizer.

Density warm-up: each level of `CompressionConfig.levels()` is its own jitted step (compiled when first reached);
`train_step(state, batch)` picks the level from the step count, read from the device only when the state is not
the one it returned last (the first call, a restored checkpoint).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from .. import sharding
from ..config import TrainConfig
from ..losses import n_samples, nsp_sums, per_example_losses, real_tokens
from ..model import BertForPreTraining
from ..steps import Steps, TrainState, _forward, _Traced
from .config import CompressionConfig
from .transform import sparse_allreduce, state_shardings


def _stacked(param_state) -> dict:
    """True for each parameter whose leading logical axis is the layer axis L (selected per layer)."""
    out: dict = {}
    flat = jax.tree_util.tree_flatten_with_path(param_state, is_leaf=lambda v: isinstance(v, nnx.Variable))[0]
    for path, var in flat:
        names = var.get_metadata().get("out_sharding") or ()
        node = out
        keys = [getattr(k, "key", getattr(k, "name", k)) for k in path]
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = bool(names) and names[0] == "L"
    return out


def _local_losses(out, batch, n_masked, n_seq):
    """This rank's share of the global losses (its sums over the global counts) and its metric sums."""
    labels, weights = batch["masked_labels"], batch["masked_weights"]
    nll, pred, nsp_nll, nsp_hit = per_example_losses(out, batch)
    nsp, nsp_correct, _ = nsp_sums(nsp_nll, nsp_hit, batch)
    sums = dict(mlm=jnp.sum(nll * weights), mlm_correct=jnp.sum((pred == labels) * weights), nsp=nsp,
                nsp_correct=nsp_correct.astype(jnp.float32), n_tokens=real_tokens(batch))
    return sums["mlm"] / jnp.maximum(n_masked, 1.0) + sums["nsp"] / jnp.maximum(n_seq, 1.0), sums


def kernels_run_inside_manual_data(mesh) -> bool:
    """Whether the Pallas kernels' `batch_shard_map` lowers inside a shard_map manual over `data` on `mesh` (it must
    then split the batch over the remaining batch axes only)."""
    from pallas_kernels.mesh import batch_shard_map
    inner = batch_shard_map(lambda offset, a: a + offset.astype(a.dtype), 1)
    f = jax.shard_map(inner, mesh=mesh, in_specs=P("data"), out_specs=P("data"), axis_names={"data"},
                      check_vma=False)
    try:
        with jax.set_mesh(mesh):
            jax.jit(f).lower(jax.ShapeDtypeStruct((2 * mesh.size,), jnp.float32))
        return True
    except Exception:  # noqa: BLE001 (any lowering failure means: not supported)
        return False


class _Levels:
    """The train step of each warm-up level, chosen by the step count; `at(step)` is that step's `_Traced`."""

    def __init__(self, levels: list[tuple[int, _Traced]]):
        self.levels, self._last, self._next = levels, None, 0

    def at(self, step: int) -> _Traced:
        return [fn for start, fn in self.levels if start <= step][-1]

    def _step_of(self, state) -> int:
        if len(self.levels) == 1:
            return 0
        return self._next if state is self._last else int(jax.device_get(state.step))

    def __call__(self, state, batch):
        step = self._step_of(state)
        new, metrics = self.at(step)(state, batch)
        if len(self.levels) > 1:
            self._last, self._next = new, step + 1
        return new, metrics

    def compile(self, state, batch):
        return self.at(self._step_of(state)).compile(state, batch)


class CompressedSteps(Steps):
    """`Steps` with the gradient exchange over `data` compressed as `compression` says (`optimizer`: the optimizer
    after the exchange, e.g. `steps.make_optimizer(tc)`; `tx` is the chain of both)."""

    def __init__(self, model: BertForPreTraining, optimizer: optax.GradientTransformation, tc: TrainConfig, mesh,
                 compression: CompressionConfig):
        if mesh is None:
            raise ValueError("compressed gradient exchange needs a mesh with a data axis of 2 or more devices")
        compression.check_mesh(mesh)
        if compression.axis != "data":
            raise ValueError(f"axis={compression.axis!r}: the train step compresses the 'data' axis only (fsdp's "
                             f"gradient reduce-scatter is already sharded)")
        super().__init__(model, optimizer, tc, mesh)
        kernels = self.resolved_kernels(model.config.kernels)
        if kernels == "pallas" and not kernels_run_inside_manual_data(mesh):
            raise ValueError(f"kernels={model.config.kernels!r} runs the Pallas kernels, whose batch_shard_map "
                             f"(pallas_kernels/mesh.py) does not leave the compressed step's manual 'data' axis "
                             f"alone; use kernels='xla' with compression")
        self.optimizer, self.compression = optimizer, compression
        param_state = nnx.state(model, nnx.Param)
        self._params_shape = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                                          nnx.to_pure_dict(param_state))  # the model may be abstract
        specs, stacked = sharding.param_specs(param_state, mesh), _stacked(param_state)
        self.transforms = {d: sparse_allreduce(compression, mesh, specs, stacked, density=d)
                           for _, d in compression.levels()}
        self.tx = optax.chain(self.transforms[compression.density], optimizer)
        sparse_sh = state_shardings(compression, mesh, self._params_shape, specs)
        self.state_shardings = dataclasses.replace(self.state_shardings,
                                                   opt_state=(sparse_sh, self.state_shardings.opt_state))
        replicated = NamedSharding(mesh, P())
        levels = []
        for start, density in compression.levels():
            fn = jax.jit(functools.partial(self._compressed_train_step, self.transforms[density]),
                         in_shardings=(self.state_shardings, self.batch_sharding),
                         out_shardings=(self.state_shardings, replicated), donate_argnums=0,
                         compiler_options=self.compiler_options())
            levels.append((start, _Traced(fn, mesh, tc.sequence_parallel, self.optimization_level())))
        self.train_step = _Levels(levels)

    def carries_copy(self) -> bool:
        """No carried compute copy: each rank casts the replicated weights inside its shard_map."""
        return False

    def init_state(self, model: BertForPreTraining, seed: int) -> TrainState:
        """As `Steps.init_state`; the transform's per-rank state is created directly in its shardings."""
        params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
        sparse = self.transforms[self.compression.density]
        shapes = self._params_shape
        sparse_state = jax.jit(lambda: sparse.init(shapes), out_shardings=self.state_shardings.opt_state[0])()
        return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                          opt_state=(sparse_state, self.optimizer.init(params)),
                          rng=jax.random.key_data(jax.random.key(seed)), bad_step=jnp.full((), -1, jnp.int32))

    def _compressed_train_step(self, sparse_tx, state: TrainState, batch):
        axis = self.compression.axis
        rng, dropout_key = jax.random.split(jax.random.wrap_key_data(state.rng))
        sparse_state, opt_state = state.opt_state

        def per_rank(params, sparse_state, opt_state, batch, dropout_key):
            key = jax.random.fold_in(dropout_key, jax.lax.axis_index(axis))  # each rank its own dropout masks
            n_masked = jax.lax.psum(jnp.sum(batch["masked_weights"]), axis)
            n_seq = jax.lax.psum(n_samples(batch), axis)

            def loss_fn(p):
                out = _forward(self.graphdef, self.rest, p, batch, deterministic=False, dropout_key=key,
                               pipeline=self.pipeline)
                return _local_losses(out, batch, n_masked, n_seq)

            (_, sums), grads = jax.value_and_grad(loss_fn, has_aux=True)(self._compute_copy(params))
            grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
            updates, sparse_state = sparse_tx.update(grads, sparse_state, params)
            grad_norm = optax.tree.norm(updates)
            updates, opt_state = self.optimizer.update(updates, opt_state, params)
            # The exchange's counts of this step (entries selected, overflowed) ride on the losses' psum.
            counts = jnp.sum(sparse_state.stats[..., :2].reshape(-1, 2), axis=0)
            sums, counts = jax.lax.psum((sums, counts), axis)
            mlm_loss, nsp_loss = sums["mlm"] / jnp.maximum(n_masked, 1.0), sums["nsp"] / jnp.maximum(n_seq, 1.0)
            metrics = dict(loss=mlm_loss + nsp_loss, mlm_loss=mlm_loss, nsp_loss=nsp_loss,
                           mlm_correct=sums["mlm_correct"], n_masked=n_masked, nsp_correct=sums["nsp_correct"],
                           n_seq=n_seq, n_tokens=sums["n_tokens"], grad_norm=grad_norm, compression_selected=counts[0],
                           compression_overflowed=counts[1])
            return optax.apply_updates(params, updates), sparse_state, opt_state, metrics

        ranked = jax.tree.map(lambda x: P(axis) if x.ndim else P(), sparse_state)
        batch_specs = jax.tree.map(lambda _: P(axis), batch)
        fn = jax.shard_map(per_rank, in_specs=(P(), ranked, P(), batch_specs, P()),
                           out_specs=(P(), ranked, P(), P()), axis_names={axis}, check_vma=False)
        params, sparse_state, opt_state, metrics = fn(state.params, sparse_state, opt_state, batch, dropout_key)
        finite = jnp.isfinite(metrics["loss"])
        # A non-finite loss leaves parameters and optimizer state untouched and records the step (as Steps does).
        keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)  # noqa: E731
        new = TrainState(step=state.step + 1, params=keep(params, state.params),
                         opt_state=keep((sparse_state, opt_state), state.opt_state), rng=jax.random.key_data(rng),
                         bad_step=jnp.where((state.bad_step < 0) & ~finite, state.step, state.bad_step))
        metrics.update(lr=self.schedule(state.step), bad_step=new.bad_step)
        return new, metrics


def make_steps(model: BertForPreTraining, optimizer: optax.GradientTransformation, tc: TrainConfig, mesh) -> Steps:
    """The steps `tc` asks for: `CompressedSteps` with its `grad_compression` (`tc.compression_config()`), else the
    dense `Steps` (the trainer's, benchmarks/train_step.py's and jaxformer.hlo_report's choice)."""
    compression = tc.compression_config()
    if compression is None:
        return Steps(model, optimizer, tc, mesh)
    return CompressedSteps(model, optimizer, tc, mesh, compression)


def steady_train_step(steps: Steps) -> _Traced:
    """The train step after any density warm-up (the one to compile from abstract shapes: `_Levels` reads the step
    count of a concrete state)."""
    train = steps.train_step
    return train.at(steps.compression.steady_step) if isinstance(train, _Levels) else train

