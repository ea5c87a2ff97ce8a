"""The embedding block (gathers + sum + layernorm + dropout): every implementation that runs here against the
reference, with and without position ids (packed rows), `jnp.take`'s semantics for ids out of range, the per-shard
run and the fallback where a mesh splits the tables, and the compiled kernels on a GPU."""

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


def _position_ids(key, batch, seq, n):
    """Packed rows' position ids (B, S) into an n-row table: random in [0, n) (repeating, and past S where n > S),
    with row 0's restarting at 0 per sample as packing makes them."""
    pids = jax.random.randint(key, (batch, seq), 0, n)
    return pids.at[0].set(jnp.arange(seq) % min(n, seq // 2 + 1))


def _case(batch, seq, d, vocab, types, dtype, rate, seed, table_dtype=jnp.float32, interpret=None, positions=None,
          **kw):
    """The fused embedding block (tables gathered in the kernel) against the reference: forward and the gradients of
    the three tables and the LN parameters, fresh random ids, tables and cotangent. With `positions` (a table of
    that many rows), packed rows' position ids (`_position_ids`)."""
    key = jax.random.key(seed)
    k = jax.random.split(key, 9)
    ids = jax.random.randint(k[0], (batch, seq), 0, vocab)
    tt = jax.random.randint(k[1], (batch, seq), 0, types)
    n_pos = seq if positions is None else positions
    tables = tuple(jax.random.normal(k[i], (n, d), table_dtype) for i, n in ((2, vocab), (3, n_pos), (4, types)))
    scale, shift = 1 + 0.2 * jax.random.normal(k[5], (d,)), jax.random.normal(k[6], (d,))
    drop = dict(seed=seed_from_key(k[7]), rate=rate, eps=1e-12, dtype=dtype)
    pids = None if positions is None else _position_ids(jax.random.fold_in(key, 9), batch, seq, positions)
    check_vjp(lambda *a: embedding.embedding_layernorm(ids, tt, *a, **drop, interpret=interpret, position_ids=pids,
                                                       **kw),
              lambda *a: reference.embedding_layernorm(ids, tt, *a, **drop, position_ids=pids),
              (*tables, scale, shift), dtype, k[8])


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


POSITION_CASES = [  # batch, seq, d, vocab, types, dtype, rate, position table rows (> S: the whole table), blocks
    (3, 8, 96, 50, 2, jnp.float32, 0.0, 20, None),
    (3, 8, 96, 50, 2, jnp.float32, 0.1, 20, None),
    (4, 16, 128, 37, 3, jnp.bfloat16, 0.1, 40, None),
    (5, 4, 1000, 40, 1, jnp.float32, 0.1, 9,  # a padded width; a ragged last backward program
     kernel.Blocks(bwd_batch_per_program=2, bwd_block_rows=2)),
    (4, 8, 768, 64, 2, jnp.float32, 0.0, 12,  # the forward's one-tile programs
     kernel.Blocks(block_rows=2, tiles_per_program=1, bwd_batch_per_program=2)),
    (7, 8, 96, 30, 2, jnp.float32, 0.1, 24,  # the backward without prefetch; a ragged last forward program
     kernel.Blocks(bwd_batch_per_program=4, bwd_block_rows=2, bwd_prefetch=False, block_rows=4, tiles_per_program=3)),
]


@pytest.mark.parametrize("batch,seq,d,vocab,types,dtype,rate,positions,blocks", [
    pytest.param(*c, marks=[pytest.mark.slow] if i > 1 else []) for i, c in enumerate(POSITION_CASES)])
def test_position_ids_kernels_match_reference(batch, seq, d, vocab, types, dtype, rate, positions, blocks):
    """Packed rows through the kernels (the position rows gathered by id, their gradient scatter-added by id): the
    forward and every gradient as the reference's, position ids repeating and past S in a table longer than S."""
    _case(batch, seq, d, vocab, types, dtype, rate, seed=d + batch + positions, positions=positions, blocks=blocks,
          impl="triton")


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


def test_position_ids_out_of_range_as_jnp_take():
    """Position ids as the word ids: negative ones count from the end of the table, ids past it give NaN rows."""
    ids, tt = jnp.array([[0, 1, 5, 2], [3, 1, 4, 3]]), jnp.zeros((2, 4), jnp.int32)
    pos_ids = jnp.array([[0, -1, 3, 2], [4, 1, -5, 3]])
    k = jax.random.split(jax.random.key(4), 3)
    word, pos, typ = (jax.random.normal(k[i], (n, 64)) for i, n in ((0, 6), (1, 4), (2, 2)))
    kw = dict(seed=None, rate=0.0, eps=1e-12, position_ids=pos_ids)
    got = np.asarray(embedding.embedding_layernorm(ids, tt, word, pos, typ, jnp.ones(64), jnp.zeros(64), **kw,
                                                   impl="triton"))
    ref = np.asarray(reference.embedding_layernorm(ids, tt, word, pos, typ, jnp.ones(64), jnp.zeros(64), **kw))
    nan_rows = np.isnan(ref).all(-1)
    assert nan_rows.tolist() == [[False] * 4, [True, False, True, False]]
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
    with pytest.raises(ValueError, match="position_ids.dtype"):
        embedding.embedding_layernorm(ids, ids, word, pos, typ, ones, ones, **kw, position_ids=ids * 1.0)
    with pytest.raises(ValueError, match="position.shape"):  # the whole table, but D wide as the others
        embedding.embedding_layernorm(ids, ids, word, jnp.ones((9, 7)), typ, ones, ones, **kw, position_ids=ids)


@pytest.mark.skipif(len(jax.devices()) < 4, reason="needs 4 devices (the CPU's 8 virtual ones)")
@pytest.mark.parametrize("axes", [("data",), ("data", "tensor")])
@pytest.mark.parametrize("packed", [False, True])
def test_per_batch_shard_and_split_tables(axes, packed, caplog, monkeypatch):
    """On a data mesh the kernels run per batch shard (shard_map) and draw the unsharded masks; where a mesh splits
    the tables (tensor here) the operator is the reference, with a warning naming why. Values and every gradient as
    the reference's, also with packed rows' position ids (batch-sharded as the ids). The trainer's mesh (auto axes):
    with explicit axes the reference's own gather of a replicated table at batch-sharded ids asks for an
    out_sharding."""
    monkeypatch.setattr(registry, "_LOGGED", set())  # the fallback is logged once per process: here, fresh
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]).reshape((4,) if axes == ("data",) else (2, 2)), axes)
    k = jax.random.split(jax.random.key(21), 8)
    ids, tt = jax.random.randint(k[0], (8, 8), 0, 40), jax.random.randint(k[1], (8, 8), 0, 2)
    word, pos, typ = (jax.random.normal(k[i], (n, 96)) for i, n in ((2, 40), (3, 20 if packed else 8), (4, 2)))
    scale, shift, seed = 1 + 0.1 * jax.random.normal(k[5], (96,)), jax.random.normal(k[6], (96,)), seed_from_key(k[7])
    pids = _position_ids(jax.random.fold_in(k[0], 1), 8, 8, 20) if packed else None

    def loss(fn, *tables):
        y = fn(ids_, tt_, *tables, seed=seed, rate=0.2, eps=1e-12, position_ids=pids_)
        return jnp.sum(y * jnp.cos(jnp.arange(y.size).reshape(y.shape)))

    args = (word, pos, typ, scale, shift)
    grad = jax.jit(jax.value_and_grad(loss, argnums=(1, 2, 3, 4, 5)), static_argnums=0)
    ids_, tt_, pids_ = ids, tt, pids
    expected = grad(reference.embedding_layernorm, *args)
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    ids_, tt_ = jax.device_put(ids, sharding), jax.device_put(tt, sharding)
    pids_ = None if pids is None else jax.device_put(pids, sharding)
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


@pytest.mark.gpu
@pytest.mark.parametrize("batch,seq,d", [(64, 128, 1024), (16, 512, 1024), (64, 128, 768), (6, 40, 1000)])
def test_compiled_position_ids_match_reference_on_gpu(batch, seq, d):
    """The kernels compiled with packed rows' position ids into BERT's 512-row position table."""
    _case(batch, seq, d, 30522, 2, jnp.bfloat16, 0.1, seed=seq + d + 2, interpret=False, positions=512,
          impl="triton")
    _case(batch, seq, d, 30522, 2, jnp.float32, 0.0, seed=seq + d + 3, interpret=False, positions=512,
          impl="triton")


def test_position_ids_gather_the_positions():
    """Position ids (packed rows, positions restarting per sample): the entry point runs the kernels (the registry's
    choice here), which add position[position_ids[b, s]]; positions 0..S-1 as ids give the unpacked result exactly."""
    k = jax.random.split(jax.random.key(41), 6)
    ids = jax.random.randint(k[0], (2, 16), 0, 50)
    tt = jax.random.randint(k[1], (2, 16), 0, 2)
    word, position, types = (jax.random.normal(k[i], (n, 64)) for i, n in ((2, 50), (3, 32), (4, 2)))
    ln = (jnp.ones((64,)), jnp.zeros((64,)))
    kw = dict(seed=None, rate=0.0, eps=1e-12)
    pos_ids = jnp.asarray(np.concatenate([np.arange(10), np.arange(6)])[None].repeat(2, 0), jnp.int32)
    got = embedding.embedding_layernorm(ids, tt, word, position, types, *ln, **kw, position_ids=pos_ids)
    assert "pallas_call" in str(jax.make_jaxpr(lambda p: embedding.embedding_layernorm(
        ids, tt, word, p, types, *ln, **kw, position_ids=pos_ids))(position))
    want = (jnp.take(word, ids, axis=0) + jnp.take(position, pos_ids, axis=0) + jnp.take(types, tt, axis=0))
    want = (want - want.mean(-1, keepdims=True)) / jnp.sqrt(want.var(-1, keepdims=True) + 1e-12)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    arange = jnp.broadcast_to(jnp.arange(16, dtype=jnp.int32), (2, 16))
    np.testing.assert_array_equal(
        reference.embedding_layernorm(ids, tt, word, position, types, *ln, **kw, position_ids=arange),
        reference.embedding_layernorm(ids, tt, word, position[:16], types, *ln, **kw))
    with pytest.raises(ValueError, match="position_ids.shape"):
        embedding.embedding_layernorm(ids, tt, word, position, types, *ln, **kw, position_ids=pos_ids[:, :8])
