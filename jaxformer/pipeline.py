"""Pipeline parallelism for the stacked encoder layers, written with JAX's own sharding (GSPMD).

The encoder's `L` layers are stacked on a leading axis. A `Pipeline(stages=p, microbatches=m, repeats=r)` views them
as `[r, p, k]` chunks (`k = L / (p r)` layers each): layer `l` belongs to stage `(l // k) % p`, repeat `l // (p k)`.
The batch is cut into `m` microbatches (strided: microbatch `i` holds rows `i, i+m, ...`, see `_split`) that flow
through the stages; with `r > 1` (the circular or interleaved schedule) every microbatch goes round the ring of
stages `r` times, meeting a different chunk of layers each time.

How it runs (in the manner of MaxText's `pipeline.py`):

* `state[p, b, S, D]` holds what each stage works on in this tick (`b = B / m`). Every tick is one `vmap` over the
  stage axis of "run my k layers on my microbatch". The stage axis of `state` and of the (reshaped) weights is
  constrained to the `pipeline` mesh axis, so each device runs only its own stage; the `vmap` carries
  `spmd_axis_name="pipeline"`, so a `shard_map` inside a layer (the Pallas kernels' `batch_shard_map`) gets the stage
  axis in its specs too and stays per device.
* Between ticks the state moves one stage down the ring: `concat(state[-1:], state[:-1])`, which XLA turns into a
  collective-permute of one microbatch activation (`b S D`) per device when the stage axis is sharded.
* `buf[p, m, b, S, D]` (stage-sharded: one copy per stage, only stage 0's is read) starts as the microbatched
  input. Stage 0 reads microbatch `t mod m` from it at tick `t`; what stage `p-1` finished reaches stage 0 through
  the ring one tick later and is written back into `buf` at its microbatch's slot, where stage 0 picks it up for the
  next repeat (`m >= p` makes it arrive in time) or, after the last repeat, it is the output. The slot is read and
  written with dynamic slices on the unsharded microbatch axis: no communication. At the end stage 0's copy is
  broadcast to every pipeline device (a masked sum over the stage axis: one all-reduce of `B S D`), because the
  heads after the encoder run replicated over `pipeline`, as do the embeddings before it; in the backward pass the
  input's gradient is summed over the stages' copies of `buf` (one more all-reduce of `B S D`). Microbatches are
  strided so that the data-axis split of the batch survives the reshape to `[m, b]` (no all-to-all). The compiled
  GPipe step has, besides these, only the collective-permutes of the shift (forward and backward) and the
  data-parallel gradient all-reduces.
* Stage `s` at tick `t` works on microbatch `(t - s) mod m` at repeat `(t - s) // m`; there are
  `T = r m + p - 1` ticks, of which each stage spends `r m` doing real work. The rest is the bubble, where stages
  run their layers on filler data that never reaches an output (so it gets zero cotangent): see `bubble_fraction`.

Where the weights move. A parameter stored `[L, ...]` and sharded contiguously over `pipeline` (device `d` holds
layers `d L/p ... (d+1) L/p - 1`) is exactly GPipe's stage assignment (`r = 1`): the reshape to `[p, 1, k, ...]` is
local and no weight ever crosses devices (the tests check that the compiled HLO has no all-gather of the stacked
weights). For `r > 1` the circular assignment differs from the contiguous storage (device `d` must hold chunks
`d, d+p, d+2p, ...`), so XLA reshards the stacked weights once per call, outside the tick loop: all-to-alls (seen
in the compiled HLO) moving about `(1 - 1/p)` of each device's `W/p` bytes of layer weights, the same again for
the weight gradients in the backward pass, and one extra copy of `W/p` held as a residual. That is per step, not
per tick (the per-tick choice of repeat is a local dynamic slice): for BERT-large (`W` ~ 1.2 GB of fp32 layer
weights) at p = 4 about 230 MB per device each way, the same order as one data-parallel gradient all-reduce.
Storing the layers in stage-major order would remove it; that changes the checkpoint layout and is not done.

Dropout: layer `l` uses `fold_in(key, l)` as in the plain layer stack; with more than one microbatch the microbatch
index is folded in as well, so microbatches get independent masks (with one microbatch the masks equal the plain
layer stack's).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from pallas_kernels.mesh import PIPELINE_AXIS, current_mesh  # the stage axis: the kernels shard_map over it too



def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name}={value!r} must be a positive integer")


def bubble_fraction(stages: int, microbatches: int, repeats: int = 1) -> float:
    """The idle fraction of each stage's time: `(p - 1) / (r m + p - 1)`.

    The schedule runs `T = r m + p - 1` ticks of `L / (p r)` layers each; every stage does `r m` useful ticks (one per
    microbatch and repeat) and idles `p - 1` (filling and draining the ring). With `r = 1` this is GPipe's
    `(p - 1) / (m + p - 1)`; with `r` chunks per stage it is Megatron-LM's interleaved schedule, whose bubble
    `(p - 1) / (r m)` of the ideal time shrinks by the number of chunks (Narayanan et al. 2021, section 2.2).
    """
    for name, value in (("stages", stages), ("microbatches", microbatches), ("repeats", repeats)):
        _positive_int(name, value)
    return (stages - 1) / (repeats * microbatches + stages - 1)


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """A pipeline schedule: `stages` (the size of the `pipeline` mesh axis), `microbatches` per batch, and `repeats`
    (> 1: circular schedule, each stage holding `repeats` non-contiguous chunks of layers).

    `Pipeline()` (1 stage, 1 microbatch, 1 repeat) is the plain layer stack.
    """

    stages: int = 1
    microbatches: int = 1
    repeats: int = 1

    def __post_init__(self):
        for field in ("stages", "microbatches", "repeats"):
            _positive_int(field, getattr(self, field))
        if self.repeats > 1 and self.microbatches < self.stages:
            # Stage 0 takes a microbatch's next repeat from what stage p-1 finished m - p + 1 ticks earlier.
            raise ValueError(f"microbatches={self.microbatches} must be >= stages={self.stages} for the circular "
                             f"schedule (repeats={self.repeats})")

    @property
    def is_plain(self) -> bool:
        """True when this is the plain layer stack (nothing to pipeline)."""
        return self.stages == 1 and self.microbatches == 1 and self.repeats == 1

    @property
    def bubble_fraction(self) -> float:
        return bubble_fraction(self.stages, self.microbatches, self.repeats)

    def check(self, num_layers: int, batch: int) -> None:
        """Raise ValueError (naming the fields) unless `num_layers` and `batch` split as this schedule needs."""
        if num_layers % (self.stages * self.repeats):
            raise ValueError(f"num_hidden_layers={num_layers} must be divisible by stages*repeats="
                             f"{self.stages * self.repeats} (stages={self.stages}, repeats={self.repeats})")
        if batch % self.microbatches:
            raise ValueError(f"batch size {batch} must be divisible by microbatches={self.microbatches}")

    def run(self, layer_fn: Callable, params, x, mask, *, key, remat_policy=None):
        """Run `layer_fn(layer_params, h, mask, key) -> h` over the stacked layers in `params` (a pytree whose
        leaves have a leading `L` axis), pipelined over microbatches of `x` (B, S, D) and `mask` (B, ...).

        `remat_policy` (a `jax.checkpoint_policies` entry, or None) rematerialises each layer as the plain layer stack
        does.
        Returns the encoder output (B, S, D).
        """
        leaves = jax.tree.leaves(params)
        if not leaves:
            raise ValueError("params has no stacked layer arrays")
        num_layers, batch = leaves[0].shape[0], x.shape[0]
        self.check(num_layers, batch)
        if mask.shape[0] != batch:
            raise ValueError(f"mask batch {mask.shape[0]} != x batch {batch}")
        mesh = _pipeline_mesh(self.stages)
        p, m, r = self.stages, self.microbatches, self.repeats
        k, b = num_layers // (p * r), batch // m

        def to_stages(a):
            # [L, ...] -> [r, p, k, ...] -> [p, r, k, ...]: stage first, so one device holds all of its chunks. The
            # stored [L, ...] is pinned to contiguous `pipeline` shards first, so that its gradient comes back in that
            # layout (for r > 1 an all-to-all, rather than the all-gather XLA would otherwise pick).
            a = _constrain(a, mesh)
            return _constrain(jnp.swapaxes(a.reshape(r, p, k, *a.shape[1:]), 0, 1), mesh)

        weights = jax.tree.map(to_stages, params)
        masks = _split(mask, m)
        stage_ids = jnp.arange(p)

        layer = layer_fn
        if remat_policy is not None:
            layer = jax.checkpoint(layer_fn, policy=remat_policy, prevent_cse=False)

        def stage(w, h, s, t):
            """Stage `s` at tick `t`: its k layers of the current repeat on its current microbatch."""
            d = t - s
            rep = jnp.clip(d // m, 0, r - 1)
            micro = jnp.mod(d, m)
            # This stage's chunk of the current repeat: [r, k, ...] -> [k, ...] (a static slice for GPipe).
            w = jax.tree.map(lambda a: a[0] if r == 1 else jax.lax.dynamic_index_in_dim(a, rep, 0, False), w)
            mask_s = jax.lax.dynamic_index_in_dim(masks, micro, 0, keepdims=False)  # the mask travels with it
            layer_ids = (rep * p + s) * k + jnp.arange(k)

            def body(h, xs):
                w_l, layer_id = xs
                key_l = jax.random.fold_in(key, layer_id)  # the plain layer stack's key of layer l
                if m > 1:
                    key_l = jax.random.fold_in(key_l, micro)  # independent masks per microbatch
                return layer(w_l, h, mask_s, key_l), None

            h, _ = jax.lax.scan(body, h, (w, layer_ids))
            return h

        vmap_kw = dict(spmd_axis_name=PIPELINE_AXIS) if mesh is not None else {}
        stages_fn = jax.vmap(stage, in_axes=(0, 0, 0, None), **vmap_kw)

        def shift(state):
            # Stage s receives stage s-1's output (stage 0 receives stage p-1's): a collective-permute when sharded.
            return _constrain(jnp.concatenate([state[-1:], state[:-1]], axis=0), mesh)

        def store(buf, shifted, t):
            # Stage p-1 finished microbatch (t - p) mod m at tick t - 1; it is now in stage 0's slot of `shifted`.
            slot = jnp.mod(t - p, m)
            old = jax.lax.dynamic_index_in_dim(buf, slot, 1, keepdims=True)
            new = jnp.where(t >= p, shifted[:, None], old)  # nothing finished before tick p
            return _constrain(jax.lax.dynamic_update_slice_in_dim(buf, new, slot, axis=1), mesh, 1)

        first = (stage_ids == 0).reshape(p, *([1] * x.ndim))

        def tick(carry, t):
            state, buf = carry
            shifted = shift(state)
            buf = store(buf, shifted, t)
            fresh = jax.lax.dynamic_index_in_dim(buf, jnp.mod(t, m), 1, keepdims=False)  # [p, b, S, D]
            inputs = _constrain(jnp.where(first, fresh, shifted), mesh)
            return (_constrain(stages_fn(weights, inputs, stage_ids, t), mesh), buf), None

        state = _constrain(jnp.zeros((p, b, *x.shape[1:]), x.dtype), mesh)
        buf = _constrain(jnp.broadcast_to(_split(x, m), (p, m, b, *x.shape[1:])), mesh, 1)
        ticks = r * m + p - 1
        (state, buf), _ = jax.lax.scan(tick, (state, buf), jnp.arange(ticks))
        buf = store(buf, shift(state), ticks)  # the last microbatch comes off stage p-1
        # Stage 0's copy now holds every output; the masked sum broadcasts it to all stages (exact: adds zeros).
        out = jnp.sum(jnp.where(first[:, None], buf, jnp.zeros((), buf.dtype)), axis=0)
        return _merge(out)


def _split(x, m: int):
    """(B, ...) -> (m, B/m, ...) with microbatch i = rows i, i + m, i + 2m, ...: strided, so that a batch split
    contiguously over the data axes stays split the same way in every microbatch (a local reshape, where contiguous
    microbatches would need an all-to-all over the data axes on the way in and out)."""
    return jnp.swapaxes(x.reshape(x.shape[0] // m, m, *x.shape[1:]), 0, 1)


def _merge(x):
    """The inverse of `_split`: (m, B/m, ...) -> (B, ...)."""
    return jnp.swapaxes(x, 0, 1).reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def _pipeline_mesh(stages: int):
    """The current mesh if it has a `pipeline` axis of more than one device (then it must have `stages` devices)."""
    mesh = current_mesh()
    if mesh is None or PIPELINE_AXIS not in mesh.axis_names:
        return None
    size = mesh.shape[PIPELINE_AXIS]
    if size == 1:
        return None
    if PIPELINE_AXIS in (getattr(mesh, "explicit_axes", ()) or ()):
        # Explicit axes turn `with_sharding_constraint` into an assertion on the type; the schedule relies on
        # GSPMD propagating its constraints (jaxformer.sharding.make_mesh builds Auto axes).
        raise ValueError(f"the mesh's {PIPELINE_AXIS!r} axis is Explicit; Pipeline(stages={stages}) needs an Auto "
                         f"axis (jax.sharding.Mesh(..., axis_types=Auto) or jaxformer.sharding.make_mesh)")
    if size != stages:
        raise ValueError(f"Pipeline stages={stages} must equal the size of the mesh's {PIPELINE_AXIS!r} axis ({size})")
    return mesh


def _constrain(x, mesh, replicated: int = 0):
    """Put the leading (stage) axis on the `pipeline` mesh axis and keep the next `replicated` axes whole (the
    microbatch axis, which is indexed dynamically), leaving the other axes to the partitioner."""
    if mesh is None:
        return x
    spec = P(PIPELINE_AXIS, *([None] * replicated), *([P.UNCONSTRAINED] * (x.ndim - 1 - replicated)))
    return jax.lax.with_sharding_constraint(x, spec)
