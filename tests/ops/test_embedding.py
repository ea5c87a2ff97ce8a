"""The embedding block (gathers + sum + layernorm + dropout): every implementation that runs here against the
reference, `jnp.take`'s semantics for ids out of range, the per-shard run and the fallback where a mesh splits the
tables, and the compiled kernels on a GPU."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels.embedding_layernorm as embedding
from pallas_kernels import registry
from pallas_kernels.dropout import seed_from_key
from pallas_kernels.embedding_layernorm import kernel, reference

from .harness import check_vjp, kernels_here


def _case(batch, seq, d, vocab, types, dtype, rate, seed, table_dtype=jnp.float32, interpret=None, **kw):
    """The fused embedding block (tables gathered in the kernel) against the reference: forward and the gradients of
    the three tables and the LN parameters, fresh random ids, tables and cotangent."""
    k = jax.random.split(jax.random.key(seed), 9)
    ids = jax.random.randint(k[0], (batch, seq), 0, vocab)
    tt = jax.random.randint(k[1], (batch, seq), 0, types)
    tables = tuple(jax.random.normal(k[i], (n, d), table_dtype) for i, n in ((2, vocab), (3, seq), (4, types)))
    scale, shift = 1 + 0.2 * jax.random.normal(k[5], (d,)), jax.random.normal(k[6], (d,))
    drop = dict(seed=seed_from_key(k[7]), rate=rate, eps=1e-12, dtype=dtype)
    check_vjp(lambda *a: embedding.embedding_layernorm(ids, tt, *a, **drop, interpret=interpret, **kw),
              lambda *a: reference.embedding_layernorm(ids, tt, *a, **drop), (*tables, scale, shift), dtype, k[8])


CASES = [  # batch, seq, d, vocab, types, dtype, rate, blocks
    (3, 8, 96, 50, 2, jnp.float32, 0.0, None),
    (4, 16, 128, 37, 3, jnp.bfloat16, 0.1, None),
    (5, 4, 1000, 40, 1, jnp.float32, 0.1,  # a padded width; 5 batch rows in programs of 2 (a ragged last)
     kernel.Blocks(bwd_batch_per_program=2, bwd_block_rows=2)),
    (4, 8, 768, 64, 2, jnp.bfloat16, 0.1,  # the forward's one-tile programs
     kernel.Blocks(block_rows=2, tiles_per_program=1, bwd_batch_per_program=2)),
    (7, 8, 96, 30, 2, jnp.float32, 0.1,  # the backward's chunks without prefetch; the forward's 3 tiles per program,
     kernel.Blocks(bwd_batch_per_program=4, bwd_block_rows=2, bwd_prefetch=False,  # a ragged last one
                   block_rows=4, tiles_per_program=3)),
]


def _call(batch, seq, d, vocab, types, dtype, rate, blocks):
    return embedding.Call(batch * seq, d, jnp.dtype(dtype).name, rate)


@pytest.mark.parametrize("batch,seq,d,vocab,types,dtype,rate,blocks,impl", [
    (*c, impl) for c in CASES for impl in kernels_here("embedding_layernorm", _call(*c))])
@pytest.mark.slow
def test_matches_reference(batch, seq, d, vocab, types, dtype, rate, blocks, impl):
    _case(batch, seq, d, vocab, types, dtype, rate, seed=d + batch, blocks=blocks, impl=impl)


@pytest.mark.slow
def test_bf16_tables_and_repeated_ids():
    """bf16 tables (parameter_dtype bfloat16) and ids that repeat within the batch (the word gradient adds them)."""
    _case(2, 16, 64, 3, 2, jnp.bfloat16, 0.1, seed=5, table_dtype=jnp.bfloat16)


def test_ids_out_of_range_as_jnp_take():
    """Negative ids count from the end and ids past the table give NaN rows, as the reference's jnp.take."""
    ids = jnp.array([[0, -1, 5, 2], [7, 1, -9, 3]])
    tt = jnp.array([[0, 1, 1, 0], [0, -1, 0, 2]])
    k = jax.random.split(jax.random.key(3), 3)
    word, pos, typ = (jax.random.normal(k[i], (n, 64)) for i, n in ((0, 6), (1, 4), (2, 2)))
    kw = dict(seed=None, rate=0.0, eps=1e-12)
    got = np.asarray(embedding.embedding_layernorm(ids, tt, word, pos, typ, jnp.ones(64), jnp.zeros(64), **kw))
    ref = np.asarray(reference.embedding_layernorm(ids, tt, word, pos, typ, jnp.ones(64), jnp.zeros(64), **kw))
    nan_rows = np.isnan(ref).all(-1)
    assert nan_rows.tolist() == [[False] * 4, [True, False, True, True]]
    np.testing.assert_array_equal(np.isnan(got).all(-1), nan_rows)
    np.testing.assert_allclose(got[~nan_rows], ref[~nan_rows], rtol=1e-5, atol=1e-5)


def test_bad_shapes_are_named():
    ids = jnp.zeros((2, 4), jnp.int32)
    word, pos, typ, ones = jnp.ones((10, 8)), jnp.ones((4, 8)), jnp.ones((2, 8)), jnp.ones(8)
    kw = dict(seed=None, rate=0.0, eps=1e-12)
    with pytest.raises(ValueError, match="position.shape"):
        embedding.embedding_layernorm(ids, ids, word, jnp.ones((5, 8)), typ, ones, ones, **kw)
    with pytest.raises(ValueError, match="token_type_ids.shape"):
        embedding.embedding_layernorm(ids, ids[:1], word, pos, typ, ones, ones, **kw)
    with pytest.raises(ValueError, match="token_type.shape"):
        embedding.embedding_layernorm(ids, ids, word, pos, jnp.ones((2, 9)), ones, ones, **kw)
    with pytest.raises(ValueError, match="scale.shape"):
        embedding.embedding_layernorm(ids, ids, word, pos, typ, jnp.ones(9), ones, **kw)
    with pytest.raises(ValueError, match="input_ids.dtype"):
        embedding.embedding_layernorm(ids.astype(jnp.float32), ids, word, pos, typ, ones, ones, **kw)
    with pytest.raises(ValueError, match="needs a seed"):
        embedding.embedding_layernorm(ids, ids, word, pos, typ, ones, ones, seed=None, rate=0.1, eps=1e-12)


@pytest.mark.skipif(len(jax.devices()) < 4, reason="needs 4 devices (the CPU's 8 virtual ones)")
@pytest.mark.parametrize("axes", [("data",), ("data", "tensor")])
def test_per_batch_shard_and_split_tables(axes, caplog, monkeypatch):
    """On a data mesh the kernels run per batch shard (shard_map) and draw the unsharded masks; where a mesh splits
    the tables (tensor here) the operator is the reference, with a warning naming why. Values and every gradient as
    the reference's. The trainer's mesh (auto axes): with explicit axes the reference's own gather of a replicated
    table at batch-sharded ids asks for an out_sharding."""
    monkeypatch.setattr(registry, "_LOGGED", set())  # the fallback is logged once per process: here, fresh
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]).reshape((4,) if axes == ("data",) else (2, 2)), axes)
    k = jax.random.split(jax.random.key(21), 8)
    ids, tt = jax.random.randint(k[0], (8, 8), 0, 40), jax.random.randint(k[1], (8, 8), 0, 2)
    word, pos, typ = (jax.random.normal(k[i], (n, 96)) for i, n in ((2, 40), (3, 8), (4, 2)))
    scale, shift, seed = 1 + 0.1 * jax.random.normal(k[5], (96,)), jax.random.normal(k[6], (96,)), seed_from_key(k[7])

    def loss(fn, *tables):
        y = fn(ids_, tt_, *tables, seed=seed, rate=0.2, eps=1e-12)
        return jnp.sum(y * jnp.cos(jnp.arange(y.size).reshape(y.shape)))

    args = (word, pos, typ, scale, shift)
    grad = jax.jit(jax.value_and_grad(loss, argnums=(1, 2, 3, 4, 5)), static_argnums=0)
    ids_, tt_ = ids, tt
    expected = grad(reference.embedding_layernorm, *args)
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    ids_, tt_ = jax.device_put(ids, sharding), jax.device_put(tt, sharding)
    with jax.set_mesh(mesh), caplog.at_level(logging.WARNING, logger="pallas_kernels"):
        got = grad(embedding.embedding_layernorm, *args)
        jaxpr = str(jax.make_jaxpr(lambda *a: loss(embedding.embedding_layernorm, *a))(*args))
    assert ("pallas_call" in jaxpr) == (axes == ("data",))
    warned = [r.getMessage() for r in caplog.records if "embedding_layernorm: triton skipped" in r.getMessage()]
    assert warned == ([] if axes == ("data",) else
                      ["embedding_layernorm: triton skipped (the mesh splits the tables (tensor=2): the kernels read "
                       "whole tables); running xla"])
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-5)
    for a, b in zip(got[1], expected[1]):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("batch,seq,d", [(64, 128, 1024), (16, 512, 1024), (64, 128, 768), (6, 40, 1000)])
def test_compiled_matches_reference_on_gpu(batch, seq, d):
    """The kernels compiled: BERT-large/base shapes with its vocabulary, and a ragged one."""
    _case(batch, seq, d, 30522, 2, jnp.bfloat16, 0.1, seed=seq + d, interpret=False)
    _case(batch, seq, d, 30522, 2, jnp.float32, 0.0, seed=seq + d + 1, interpret=False)


def test_position_ids_gather_the_positions():
    """Position ids (packed rows, positions restarting per sample): the entry point runs the reference, which adds
    position[position_ids[b, s]]; positions 0..S-1 as ids give the unpacked result exactly."""
    k = jax.random.split(jax.random.key(41), 6)
    ids = jax.random.randint(k[0], (2, 16), 0, 50)
    tt = jax.random.randint(k[1], (2, 16), 0, 2)
    word, position, types = (jax.random.normal(k[i], (n, 64)) for i, n in ((2, 50), (3, 32), (4, 2)))
    ln = (jnp.ones((64,)), jnp.zeros((64,)))
    kw = dict(seed=None, rate=0.0, eps=1e-12)
    pos_ids = jnp.asarray(np.concatenate([np.arange(10), np.arange(6)])[None].repeat(2, 0), jnp.int32)
    got = embedding.embedding_layernorm(ids, tt, word, position, types, *ln, **kw, position_ids=pos_ids)
    want = (jnp.take(word, ids, axis=0) + jnp.take(position, pos_ids, axis=0) + jnp.take(types, tt, axis=0))
    want = (want - want.mean(-1, keepdims=True)) / jnp.sqrt(want.var(-1, keepdims=True) + 1e-12)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    arange = jnp.broadcast_to(jnp.arange(16, dtype=jnp.int32), (2, 16))
    np.testing.assert_array_equal(
        reference.embedding_layernorm(ids, tt, word, position, types, *ln, **kw, position_ids=arange),
        reference.embedding_layernorm(ids, tt, word, position[:16], types, *ln, **kw))
    with pytest.raises(ValueError, match="position_ids.shape"):
        embedding.embedding_layernorm(ids, tt, word, position, types, *ln, **kw, position_ids=pos_ids[:, :8])
