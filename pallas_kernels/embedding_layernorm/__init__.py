"""Embedding gathers + sum + layernorm + dropout: `dropout(LN(word[ids] + position + token_type[type_ids]))`.

`embedding_layernorm` runs one of the implementations in `impls.py` (the Triton kernels, which gather the table rows
themselves, or the reference), chosen by the registry for the call and mesh or named by `impl=`. The backward kernel
writes the gathered rows' float32 gradient, which XLA scatter-adds into the word table's gradient (as the reference's
`jnp.take` transposes); the token-type gradients and the LN parameters' come from the kernel's per-program partial
sums, and so does the position table's without position ids. With `position_ids` (packed rows: positions restart at
each sample) the kernels gather the position rows by id, and the position table's gradient is the same scatter-add
of the rows' gradient, by position id.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from .. import _pallas as pk
from .. import registry
from ..mesh import batch_shard_map, current_mesh, shard_counts
from . import kernel as _k
from . import reference
from .impls import Call, mesh_axes

__all__ = ["Call", "embedding_layernorm", "reference"]


def embedding_layernorm(input_ids, token_type_ids, word, position, token_type, scale, ln_bias, *, seed, rate: float,
                        eps: float, dtype=jnp.float32, interpret: bool | None = None, blocks: _k.Blocks | None = None,
                        impl: str | None = None, position_ids=None):
    """Fused `reference.embedding_layernorm` (same contract): ids (B, S) int, word (V, D), position (S, D) (with
    `position_ids` (B, S) int, packed rows: the whole (P, D) table they index), token_type (T, D), scale and ln_bias
    (D,). Per batch shard on a data-parallel mesh. `impl` names an implementation (`impls.py`; default: the
    registry's choice: the reference where the mesh splits the tables)."""
    if input_ids.shape != token_type_ids.shape or input_ids.ndim != 2:
        raise ValueError(f"input_ids.shape={input_ids.shape} and token_type_ids.shape={token_type_ids.shape} must "
                         "be the same (B, S)")
    if not jnp.issubdtype(token_type_ids.dtype, jnp.integer):
        raise ValueError(f"token_type_ids.dtype={token_type_ids.dtype} must be an integer type")
    _k.check_shapes(input_ids, word, position, token_type, position_ids)
    d = word.shape[1]
    for name, v in (("scale", scale), ("ln_bias", ln_bias)):
        if v.shape != (d,):
            raise ValueError(f"{name}.shape={v.shape} must be ({d},), the width of word.shape={word.shape}")
    if rate and seed is None:
        raise ValueError(f"rate={rate} needs a seed")
    interpret, mesh = pk.resolve_interpret(interpret), current_mesh()
    call = Call(input_ids.size // shard_counts(mesh)[0], d, jnp.dtype(dtype).name, float(rate), mesh_axes(mesh),
                position_ids is not None)
    choice = registry.choose("embedding_layernorm", call, impl=impl, blocks=blocks, interpret=interpret)
    if not choice.impl.kernel:
        return choice.impl.fn(input_ids, token_type_ids, word, position, token_type, scale, ln_bias, seed=seed,
                              rate=rate, eps=eps, dtype=dtype, position_ids=position_ids)
    seed = jnp.zeros((2,), jnp.uint32) if seed is None else jnp.asarray(seed, jnp.uint32)
    ids, types = input_ids.astype(jnp.int32), token_type_ids.astype(jnp.int32)
    pids = None if position_ids is None else position_ids.astype(jnp.int32)
    return _op(ids, types, pids, word, position, token_type, scale, ln_bias, seed, float(rate), float(eps),
               jnp.dtype(dtype), interpret, choice.config)


@functools.partial(jax.custom_vjp, nondiff_argnums=(9, 10, 11, 12, 13))
def _op(ids, types, pids, word, position, token_type, scale, shift, seed, rate, eps, dtype, interpret, blocks):
    return _fwd(ids, types, pids, word, position, token_type, scale, shift, seed, rate, eps, dtype, interpret,
                blocks)[0]


def _fwd(ids, types, pids, word, position, token_type, scale, shift, seed, rate, eps, dtype, interpret, blocks):
    def run(b_offset, ids, types, pids, word, position, token_type, scale, shift, seed):
        seq = ids.shape[1]
        y, mean, rstd = _k.forward(ids, types, word, position, token_type, scale, shift,
                                   pk.seed_words(seed, b_offset * jnp.uint32(seq)), rate=rate, eps=eps,
                                   out_dtype=dtype, interpret=interpret, blocks=blocks, position_ids=pids)
        return y.reshape(*ids.shape, -1), mean.reshape(ids.shape), rstd.reshape(ids.shape)

    y, mean, rstd = batch_shard_map(run, n_batched=3)(ids, types, pids, word, position, token_type, scale, shift,
                                                      seed)
    return y, (ids, types, pids, word, position, token_type, scale, shift, seed, mean, rstd)


def _take_grad(table, ids, rows_grad):
    """The gradient of `jnp.take(table, ids, axis=0)` at its rows' float32 gradient: its transpose (XLA's scatter-add),
    as the reference's, in whatever sharding the table and ids have (the forward gather is dead code)."""
    _, take_vjp = jax.vjp(lambda t: jnp.take(t, ids, axis=0), table.astype(jnp.float32))
    return take_vjp(rows_grad)[0].astype(table.dtype)


def _bwd(rate, eps, dtype, interpret, blocks, res, dy):
    ids, types, pids, word, position, token_type, scale, shift, seed, mean, rstd = res

    def run(b_offset, ids, types, pids, mean, rstd, dy, word, position, token_type, scale, seed):
        (batch, seq), d = ids.shape, word.shape[1]
        dh, dscale, dshift, dpos, dtypes_part = _k.backward(
            ids, types, word, position, token_type, scale, pk.seed_words(seed, b_offset * jnp.uint32(seq)),
            mean.reshape(-1), rstd.reshape(-1), dy.reshape(-1, d), rate=rate, interpret=interpret, blocks=blocks,
            position_ids=pids)
        dscale, dshift, *dtypes = pk.column_sums(dscale, dshift, *dtypes_part, interpret=interpret)  # (1, D) each
        # per shard: every output split on its leading axis by batch_shard_map, summed over the shards below
        out = dh.reshape(batch, seq, d), dscale, dshift, jnp.concatenate(dtypes)[None]
        if dpos is None:  # position ids: the caller scatter-adds dh by position id
            return out
        per_pos = _k.programs_per_position(batch, blocks)
        return *out, dpos.reshape(seq, per_pos, d).sum(axis=1)[None]

    dh, dscale, dshift, dtypes, *dpos = batch_shard_map(run, n_batched=6)(
        ids, types, pids, mean, rstd, dy, word, position, token_type, scale, seed)
    total = lambda p, like: jnp.sum(p, axis=0).astype(like.dtype)  # noqa: E731
    # The word table's gradient, and with position ids the position table's, scatter-add the rows' gradient by id
    d_position = total(dpos[0], position) if pids is None else _take_grad(position, pids, dh)
    return (None, None, None, _take_grad(word, ids, dh), d_position, total(dtypes, token_type), total(dscale, scale),
            total(dshift, shift), None)


_op.defvjp(_fwd, _bwd)
