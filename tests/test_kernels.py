"""Fused Pallas kernels against their jax.numpy references: forward and VJP, fp32 and bf16, odd widths, dropout.

On the CPU the kernels run in interpret mode (the math); the `gpu`-marked tests compile them through Triton.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import pallas_kernels._pallas as pk
import pallas_kernels.bias_dropout_residual_layernorm as bdrln
import pallas_kernels.bias_gelu as bias_gelu
import pallas_kernels.embedding_layernorm as embedding_ln
import pallas_kernels.softmax as softmax
from jaxformer import BertConfig, BertForPreTraining
from pallas_kernels.dropout import seed_from_key

TOL = {jnp.float32: 2e-5, jnp.bfloat16: 2e-2}


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.isfinite(a).all()
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


def _check_vjp(fused, ref, args, dtype, key, interpret=None):
    """Forward and VJP (random cotangent) of `fused` equal `ref`'s on `args`."""
    with jax.default_matmul_precision("highest"):
        y, vjp = jax.vjp(fused, *args)
        y_ref, vjp_ref = jax.vjp(ref, *args)
        g = jax.random.normal(key, y.shape, y.dtype)
        grads, grads_ref = vjp(g), vjp_ref(g)
    assert y.dtype == y_ref.dtype and y.shape == y_ref.shape
    assert _rel(y, y_ref) < TOL[dtype], "forward"
    for i, (a, b) in enumerate(zip(grads, grads_ref)):
        assert a.shape == b.shape and a.dtype == b.dtype, i
        assert _rel(a, b) < TOL[dtype], f"gradient {i}: {_rel(a, b)}"


def _bdrln_case(shape, dtype, rate, seed, interpret=None, **backend):
    k = jax.random.split(jax.random.key(seed), 8)
    d = shape[-1]
    x, res = (jax.random.normal(k[i], shape, dtype) for i in (0, 1))
    bias, shift = (jax.random.normal(k[i], (d,)) for i in (2, 3))
    scale = 1 + 0.2 * jax.random.normal(k[4], (d,))
    drop_seed = seed_from_key(k[5])
    kw = dict(seed=drop_seed, rate=rate, eps=1e-12)
    _check_vjp(lambda *a: bdrln.bias_dropout_residual_layernorm(*a, **kw, interpret=interpret, **backend),
               lambda *a: bdrln.reference.bias_dropout_residual_layernorm(*a, **kw),
               (x, bias, res, scale, shift), dtype, k[6])


def _column_sums_case(g, d, interpret=None):
    """`column_sums` of three fresh (g, d) float32 arrays (one absent) against float64 sums; twice, bit-equal."""
    ps = [jax.random.normal(k, (g, d), jnp.float32) for k in jax.random.split(jax.random.key(g * d), 3)]
    interpret = pk.resolve_interpret(interpret)
    out = pk.column_sums(ps[0], None, ps[1], ps[2], interpret=interpret)
    assert out[1] is None and len(out) == 4
    for o, p in zip(out[:1] + out[2:], ps):
        assert o.shape == (1, d) and o.dtype == jnp.float32
        ref = np.asarray(p, np.float64).sum(0, keepdims=True)
        assert np.abs(np.asarray(o) - ref).max() <= 1e-6 * max(np.abs(ref).max(), 1.0) * np.sqrt(g)
    again = pk.column_sums(ps[0], None, ps[1], ps[2], interpret=interpret)
    for a, b in zip(out[:1] + out[2:], again[:1] + again[2:]):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # a fixed order: deterministic


@pytest.mark.parametrize("g,d", [(7, 1000), (130, 40), (256, 768)])
def test_column_sums_match_numpy(g, d):
    _column_sums_case(g, d)


def test_column_sums_names_mismatched_partials():
    with pytest.raises(ValueError, match="float32"):
        pk.column_sums(jnp.zeros((4, 8)), jnp.zeros((4, 9)), interpret=True)


@pytest.mark.parametrize("shape,dtype,rate", [
    ((2, 5, 96), jnp.float32, 0.0),       # rows not a multiple of the tile, width not a power of two
    ((3, 7, 40), jnp.float32, 0.3),
    ((2, 8, 768), jnp.bfloat16, 0.1),      # BERT-base width
    ((16, 1024), jnp.bfloat16, 0.0),       # BERT-large width
])
def test_bdrln_matches_reference(shape, dtype, rate):
    _bdrln_case(shape, dtype, rate, seed=len(shape) + shape[-1])


def test_layer_norm_matches_reference():
    k = jax.random.split(jax.random.key(7), 3)
    x = jax.random.normal(k[0], (3, 6, 96)) * 3 + 1
    scale, shift = 1 + 0.2 * jax.random.normal(k[1], (96,)), jax.random.normal(k[2], (96,))
    _check_vjp(lambda *a: bdrln.layer_norm(*a, eps=1e-12), lambda *a: bdrln.reference.layer_norm(*a, eps=1e-12),
               (x, scale, shift), jnp.float32, k[0])


def _bias_gelu_case(shape, dtype, rate, seed, interpret=None, **backend):
    k = jax.random.split(jax.random.key(seed), 4)
    x = 2 * jax.random.normal(k[0], shape, dtype)
    bias = jax.random.normal(k[1], (shape[-1],))
    kw = dict(seed=seed_from_key(k[2]), rate=rate)
    _check_vjp(lambda *a: bias_gelu.bias_gelu(*a, **kw, interpret=interpret, **backend),
               lambda *a: bias_gelu.reference.bias_gelu(*a, **kw), (x, bias), dtype, k[3])


@pytest.mark.parametrize("shape,dtype,rate", [
    ((3, 5, 96), jnp.float32, 0.0),
    ((37, 40), jnp.float32, 0.3),
    ((2, 8, 3072), jnp.bfloat16, 0.1),    # BERT-base FF: three 1024-wide column blocks
])
def test_bias_gelu_matches_reference(shape, dtype, rate):
    _bias_gelu_case(shape, dtype, rate, seed=shape[-1])


def _softmax_case(shape, dtype, rate, seed, interpret=None):
    b, n, s, t = shape
    k = jax.random.split(jax.random.key(seed), 4)
    x = 4 * jax.random.normal(k[0], shape, dtype)
    lengths = jnp.array([t, t - 3, 1, 0][:b])  # full, padded, one key, no key at all (uniform, never NaN)
    mask = jnp.arange(t)[None, :] < lengths[:, None]
    kw = dict(scale=s ** -0.5, seed=seed_from_key(k[1]), rate=rate)
    _check_vjp(lambda x: softmax.scaled_masked_softmax(x, mask, **kw, interpret=interpret),
               lambda x: softmax.reference.scaled_masked_softmax(x, mask, **kw), (x,), dtype, k[2])


@pytest.mark.parametrize("shape,dtype,rate", [
    ((4, 3, 4, 6), jnp.float32, 0.0),
    ((2, 3, 8, 40), jnp.float32, 0.3),
    ((2, 2, 16, 128), jnp.bfloat16, 0.1),
])
def test_softmax_matches_reference(shape, dtype, rate):
    _softmax_case(shape, dtype, rate, seed=shape[-1])


def _embedding_case(batch, seq, d, vocab, types, dtype, rate, seed, table_dtype=jnp.float32, interpret=None,
                    blocks=None):
    """The fused embedding block (tables gathered in the kernel) against the reference: forward and the gradients of
    the three tables and the LN parameters, fresh random ids, tables and cotangent."""
    k = jax.random.split(jax.random.key(seed), 9)
    ids = jax.random.randint(k[0], (batch, seq), 0, vocab)
    tt = jax.random.randint(k[1], (batch, seq), 0, types)
    tables = tuple(jax.random.normal(k[i], (n, d), table_dtype) for i, n in ((2, vocab), (3, seq), (4, types)))
    scale, shift = 1 + 0.2 * jax.random.normal(k[5], (d,)), jax.random.normal(k[6], (d,))
    kw = dict(seed=seed_from_key(k[7]), rate=rate, eps=1e-12, dtype=dtype)
    _check_vjp(lambda *a: embedding_ln.embedding_layernorm(ids, tt, *a, **kw, interpret=interpret, blocks=blocks),
               lambda *a: embedding_ln.reference.embedding_layernorm(ids, tt, *a, **kw),
               (*tables, scale, shift), dtype, k[8])


@pytest.mark.parametrize("batch,seq,d,vocab,types,dtype,rate,blocks", [
    (3, 8, 96, 50, 2, jnp.float32, 0.0, None),
    (4, 16, 128, 37, 3, jnp.bfloat16, 0.1, None),
    (5, 4, 1000, 40, 1, jnp.float32, 0.1,    # a padded width; 5 batch rows in programs of 2 (a ragged last)
     embedding_ln.kernel.Blocks(bwd_batch_per_program=2, bwd_block_rows=2)),
    (4, 8, 768, 64, 2, jnp.bfloat16, 0.1,    # the forward's one-tile programs
     embedding_ln.kernel.Blocks(block_rows=2, tiles_per_program=1, bwd_batch_per_program=2)),
    (7, 8, 96, 30, 2, jnp.float32, 0.1,      # the backward's chunks without prefetch; the forward's 3 tiles per
     embedding_ln.kernel.Blocks(bwd_batch_per_program=4, bwd_block_rows=2, bwd_prefetch=False,  # program, a ragged
                                block_rows=4, tiles_per_program=3)),                          # last one
])
def test_embedding_layernorm_matches_reference(batch, seq, d, vocab, types, dtype, rate, blocks):
    _embedding_case(batch, seq, d, vocab, types, dtype, rate, seed=d + batch, blocks=blocks)


def test_embedding_layernorm_bf16_tables_and_repeated_ids():
    """bf16 tables (parameter_dtype bfloat16) and ids that repeat within the batch (the word gradient adds them)."""
    _embedding_case(2, 16, 64, 3, 2, jnp.bfloat16, 0.1, seed=5, table_dtype=jnp.bfloat16)


def test_embedding_layernorm_ids_out_of_range_as_jnp_take():
    """Negative ids count from the end and ids past the table give NaN rows, as the reference's jnp.take."""
    ids = jnp.array([[0, -1, 5, 2], [7, 1, -9, 3]])
    tt = jnp.array([[0, 1, 1, 0], [0, -1, 0, 2]])
    k = jax.random.split(jax.random.key(3), 3)
    word, pos, typ = (jax.random.normal(k[i], (n, 64)) for i, n in ((0, 6), (1, 4), (2, 2)))
    kw = dict(seed=None, rate=0.0, eps=1e-12)
    got = np.asarray(embedding_ln.embedding_layernorm(ids, tt, word, pos, typ, jnp.ones(64), jnp.zeros(64), **kw))
    ref = np.asarray(embedding_ln.reference.embedding_layernorm(ids, tt, word, pos, typ, jnp.ones(64), jnp.zeros(64),
                                                                **kw))
    nan_rows = np.isnan(ref).all(-1)
    assert nan_rows.tolist() == [[False] * 4, [True, False, True, True]]
    np.testing.assert_array_equal(np.isnan(got).all(-1), nan_rows)
    np.testing.assert_allclose(got[~nan_rows], ref[~nan_rows], rtol=1e-5, atol=1e-5)


def test_embedding_layernorm_bad_shapes_are_named():
    ids = jnp.zeros((2, 4), jnp.int32)
    word, pos, typ, ones = jnp.ones((10, 8)), jnp.ones((4, 8)), jnp.ones((2, 8)), jnp.ones(8)
    kw = dict(seed=None, rate=0.0, eps=1e-12)
    with pytest.raises(ValueError, match="position.shape"):
        embedding_ln.embedding_layernorm(ids, ids, word, jnp.ones((5, 8)), typ, ones, ones, **kw)
    with pytest.raises(ValueError, match="token_type_ids.shape"):
        embedding_ln.embedding_layernorm(ids, ids[:1], word, pos, typ, ones, ones, **kw)
    with pytest.raises(ValueError, match="token_type.shape"):
        embedding_ln.embedding_layernorm(ids, ids, word, pos, jnp.ones((2, 9)), ones, ones, **kw)
    with pytest.raises(ValueError, match="scale.shape"):
        embedding_ln.embedding_layernorm(ids, ids, word, pos, typ, jnp.ones(9), ones, **kw)
    with pytest.raises(ValueError, match="input_ids.dtype"):
        embedding_ln.embedding_layernorm(ids.astype(jnp.float32), ids, word, pos, typ, ones, ones, **kw)
    with pytest.raises(ValueError, match="needs a seed"):
        embedding_ln.embedding_layernorm(ids, ids, word, pos, typ, ones, ones, seed=None, rate=0.1, eps=1e-12)


@pytest.mark.skipif(len(jax.devices()) < 4, reason="needs 4 devices (the CPU's 8 virtual ones)")
@pytest.mark.parametrize("axes", [("data",), ("data", "tensor")])
def test_embedding_layernorm_per_batch_shard(axes):
    """On a data mesh the kernels run per batch shard (shard_map) and draw the unsharded masks; where a mesh splits
    the tables (tensor here) the operator is the reference. Values and every gradient as the reference's. The
    trainer's mesh (auto axes): with explicit axes the reference's own gather of a replicated table at batch-sharded
    ids asks for an out_sharding."""
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
    expected = grad(embedding_ln.reference.embedding_layernorm, *args)
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    ids_, tt_ = jax.device_put(ids, sharding), jax.device_put(tt, sharding)
    with jax.set_mesh(mesh):
        got = grad(embedding_ln.embedding_layernorm, *args)
        jaxpr = str(jax.make_jaxpr(lambda *a: loss(embedding_ln.embedding_layernorm, *a))(*args))
    assert ("pallas_call" in jaxpr) == (axes == ("data",))
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-5)
    for a, b in zip(got[1], expected[1]):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


def test_kernel_dropout_keeps_the_rate_and_differs_across_seeds():
    x = jnp.ones((64, 512), jnp.float32)
    bias = jnp.zeros((512,))
    kept = [np.asarray(bias_gelu.bias_gelu(x + 3.0, bias, seed=seed_from_key(jax.random.key(i)), rate=0.25)) != 0
            for i in range(2)]
    for m in kept:
        assert abs(m.mean() - 0.75) < 0.01
    assert abs(np.corrcoef(kept[0].ravel(), kept[1].ravel())[0, 1]) < 0.02


def test_bad_shapes_are_named():
    x = jnp.ones((4, 8))
    with pytest.raises(ValueError, match="bias.shape"):
        bdrln.bias_dropout_residual_layernorm(x, jnp.ones(7), x, jnp.ones(8), jnp.ones(8), seed=None, rate=0.0,
                                              eps=1e-12)
    with pytest.raises(ValueError, match="residual.shape"):
        bdrln.bias_dropout_residual_layernorm(x, jnp.ones(8), x[:2], jnp.ones(8), jnp.ones(8), seed=None, rate=0.0,
                                              eps=1e-12)
    with pytest.raises(ValueError, match="mask.shape"):
        softmax.scaled_masked_softmax(jnp.ones((2, 2, 4, 4)), jnp.ones((2, 5), bool), scale=1.0)


@pytest.mark.parametrize("axis_types", ["explicit", "auto"])  # make_mesh's default, and Mesh()'s (the trainer's)
def test_kernels_run_per_batch_shard_under_a_mesh(axis_types):
    """Under a data mesh the kernels run inside shard_map: same values and parameter gradients, no double counting."""
    if axis_types == "explicit":
        mesh = jax.make_mesh((4,), ("data",))
    else:
        mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]), ("data",))
    k = jax.random.split(jax.random.key(11), 6)
    x, res = jax.random.normal(k[0], (8, 4, 96)), jax.random.normal(k[1], (8, 4, 96))
    bias, shift, scale = jax.random.normal(k[2], (96,)), jax.random.normal(k[3], (96,)), jnp.ones(96)
    seed = seed_from_key(k[4])

    def loss(fn, x, bias, res, scale, shift):
        y = fn(x, bias, res, scale, shift, seed=seed, rate=0.2, eps=1e-12)
        return jnp.sum(y * jnp.cos(jnp.arange(y.size).reshape(y.shape)))

    grad = jax.jit(jax.value_and_grad(loss, argnums=(1, 2, 3, 4, 5)), static_argnums=0)
    expected = grad(bdrln.reference.bias_dropout_residual_layernorm, x, bias, res, scale, shift)
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    with jax.set_mesh(mesh):
        got = grad(bdrln.bias_dropout_residual_layernorm, jax.device_put(x, sharding), bias,
                   jax.device_put(res, sharding), scale, shift)
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-5)
    for a, b in zip(got[1], expected[1]):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("op", ["bias_gelu", "softmax", "layer_norm"])
def test_other_kernels_run_per_batch_shard(op):
    """Each kernel is called inside shard_map under a data mesh (no gathered inputs), with unsharded results."""
    mesh = jax.make_mesh((4,), ("data",))
    k = jax.random.split(jax.random.key(13), 3)
    seed = seed_from_key(k[2])
    if op == "bias_gelu":
        x, bias = jax.random.normal(k[0], (8, 4, 96)), jax.random.normal(k[1], (96,))
        fused = lambda x, b: bias_gelu.bias_gelu(x, b, seed=seed, rate=0.2)  # noqa: E731
        ref = lambda x, b: bias_gelu.reference.bias_gelu(x, b, seed=seed, rate=0.2)  # noqa: E731
        args = (x, bias)
    elif op == "layer_norm":  # absent bias, residual and seed: static Nones through the per-shard call
        x, scale = jax.random.normal(k[0], (8, 4, 96)), 1 + 0.1 * jax.random.normal(k[1], (96,))
        fused = lambda x, s: bdrln.layer_norm(x, s, s, eps=1e-12)  # noqa: E731
        ref = lambda x, s: bdrln.reference.layer_norm(x, s, s, eps=1e-12)  # noqa: E731
        args = (x, scale)
    else:
        x = jax.random.normal(k[0], (8, 2, 4, 16))
        mask = jnp.arange(16)[None, :] < jnp.arange(2, 18, 2)[:, None]
        fused = lambda x: softmax.scaled_masked_softmax(x, mask, scale=0.5, seed=seed, rate=0.2)  # noqa: E731
        ref = lambda x: softmax.reference.scaled_masked_softmax(x, mask, scale=0.5, seed=seed, rate=0.2)  # noqa: E731
        args = (x,)

    def loss(f, *a):
        y = f(*a)
        return jnp.sum(y * jnp.sin(jnp.arange(y.size).reshape(y.shape)))

    grad = jax.jit(jax.value_and_grad(loss, argnums=tuple(range(1, len(args) + 1))), static_argnums=0)
    expected = grad(ref, *args)
    sharded = (jax.device_put(args[0], jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))),)
    with jax.set_mesh(mesh):
        got = grad(fused, *sharded, *args[1:])
        assert "shard_map" in str(jax.make_jaxpr(lambda *a: loss(fused, *a))(*sharded, *args[1:]))
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-5)
    for a, b in zip(got[1], expected[1]):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


def test_batch_not_divisible_by_the_mesh_is_named():
    mesh = jax.make_mesh((4,), ("data",))
    with jax.set_mesh(mesh), pytest.raises(ValueError, match="does not divide"):
        bias_gelu.bias_gelu(jnp.ones((6, 8)), jnp.ones(8))


def test_flash_attention_per_batch_shard_draws_the_unsharded_masks():
    from pallas_kernels.attention import attention, sharded_flash_attention
    mesh = jax.make_mesh((4,), ("data",))
    k = jax.random.split(jax.random.key(12), 4)
    q, kk, v = (jax.random.normal(k[i], (8, 32, 2, 16)) for i in range(3))
    mask = jnp.arange(32)[None, :] < jnp.arange(8, 40, 4)[:, None]
    seed = seed_from_key(k[3])
    f = jax.jit(lambda q, k, v: sharded_flash_attention(q, k, v, mask, seed=seed, rate=0.3))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    with jax.default_matmul_precision("highest"):
        expected = attention(q, kk, v, mask, seed=seed, rate=0.3)
        with jax.set_mesh(mesh):
            got = f(*(jax.device_put(a, sharding) for a in (q, kk, v)))
    assert _rel(got, expected) < 1e-5


def test_model_pallas_equals_xla():
    """The whole model with kernels='pallas' equals kernels='xla': outputs and gradients with dropout off,
    and, with dropout on, the same masks (the kernels draw the references' counter-based masks)."""
    ids = jax.random.randint(jax.random.key(0), (2, 16), 0, 97)
    types = jnp.zeros_like(ids)
    mask = jnp.ones_like(ids).at[1, 9:].set(0)
    models = {k: BertForPreTraining(BertConfig.preset("tiny", dtype="float32", vocab_size=97,
                                                      max_position_embeddings=32, kernels=k), rngs=nnx.Rngs(0))
              for k in ("xla", "pallas")}

    def loss(model, deterministic):
        out = model(ids, types, mask, deterministic=deterministic, dropout_key=jax.random.key(5))
        return jnp.sum(out.mlm_logits * 1e-2) + jnp.sum(out.nsp_logits)

    with jax.default_matmul_precision("highest"):
        for deterministic in (True, False):
            res = {k: nnx.value_and_grad(loss)(m, deterministic) for k, m in models.items()}
            assert _rel(res["pallas"][0], res["xla"][0]) < 1e-5
            leaves = zip(jax.tree.leaves(nnx.state(res["pallas"][1])), jax.tree.leaves(nnx.state(res["xla"][1])))
            for a, b in leaves:
                assert _rel(a, b) < 1e-4


def test_model_mlm_cross_entropy_pallas_equals_xla_and_logits():
    """The train step's MLM loss (the model called with masked_labels): the cross-entropy of kernels='pallas' (in
    float32 the chunked loss; the fused kernels' case is the next test) equals kernels='xla' and the loss on the logits (values, predictions, gradients), and its program holds no
    (B, P, V) logits as the reference's does. V = 200 is padded to 256: the padded columns must stay out of both."""
    ids = jax.random.randint(jax.random.key(0), (2, 16), 0, 200)
    types, mask = jnp.zeros_like(ids), jnp.ones_like(ids).at[1, 9:].set(0)
    pos = jnp.array([[1, 4, 8, 15], [0, 2, 3, 8]])
    labels = jnp.array([[199, 0, 5, 50], [7, 198, 199, 1]])
    weights = jnp.array([[1.0, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    models = {k: BertForPreTraining(BertConfig.preset("tiny", dtype="float32", vocab_size=200,
                                                      max_position_embeddings=32, kernels=k), rngs=nnx.Rngs(0))
              for k in ("xla", "pallas")}

    def loss(model, via_labels):
        if via_labels:
            out = model(ids, types, mask, pos, masked_labels=labels)
            nll, pred = out.mlm_nll, out.mlm_predictions
            assert out.mlm_logits is None
        else:
            logits = model(ids, types, mask, pos).mlm_logits
            nll = jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, labels[..., None], -1)[..., 0]
            pred = jnp.argmax(logits, -1)
        return jnp.sum(nll * weights), pred

    with jax.default_matmul_precision("highest"):
        ref = nnx.value_and_grad(loss, has_aux=True)(models["xla"], False)
        for k, via in (("xla", True), ("pallas", True)):
            (val, pred), grads = nnx.value_and_grad(loss, has_aux=True)(models[k], via)
            assert _rel(val, ref[0][0]) < 1e-5, k
            np.testing.assert_array_equal(pred, ref[0][1])
            for a, b in zip(jax.tree.leaves(nnx.state(grads)), jax.tree.leaves(nnx.state(ref[1]))):
                assert _rel(a, b) < 1e-4, k

    def shapes(kernels):
        graphdef, state = nnx.split(models[kernels])
        jaxpr = jax.make_jaxpr(lambda st: nnx.merge(graphdef, st)(ids, types, mask, pos, masked_labels=labels))(state)
        return {tuple(v.aval.shape) for eqn in jaxpr.jaxpr.eqns for v in eqn.outvars}
    assert (2, 4, 256) in shapes("xla") and (2, 4, 256) not in shapes("pallas")


def test_model_mlm_cross_entropy_fused_in_bf16():
    """In bfloat16 (the default compute dtype) kernels='pallas' runs the fused MLM kernels (interpret mode here): the
    loss, its gradients and the predictions against kernels='xla' on the same weights, V = 200 padded to 256."""
    ids = jax.random.randint(jax.random.key(1), (2, 16), 0, 200)
    types, mask = jnp.zeros_like(ids), jnp.ones_like(ids)
    pos = jnp.array([[1, 4, 8, 15], [0, 2, 3, 8]])
    labels = jnp.array([[199, 0, 5, 50], [7, 198, 199, 1]])
    models = {k: BertForPreTraining(BertConfig.preset("tiny", dtype="bfloat16", vocab_size=200,
                                                      max_position_embeddings=32, kernels=k), rngs=nnx.Rngs(0))
              for k in ("xla", "pallas")}

    def loss(model):
        out = model(ids, types, mask, pos, masked_labels=labels)
        return jnp.sum(out.mlm_nll), (out.mlm_nll, out.mlm_predictions)

    res = {k: nnx.value_and_grad(loss, has_aux=True)(m) for k, m in models.items()}
    (_, (nll, pred)), grads = res["pallas"]
    (_, (nll_ref, pred_ref)), grads_ref = res["xla"]
    assert _rel(nll, nll_ref) < 5e-4  # measured 9e-5: the layers' bf16 kernels differ in rounding, not the loss
    np.testing.assert_array_equal(np.asarray(pred), np.asarray(pred_ref))
    for a, b in zip(jax.tree.leaves(nnx.state(grads)), jax.tree.leaves(nnx.state(grads_ref))):
        assert _rel(a, b) < 3e-2  # measured at most 9e-3


# --- compiled for real on a GPU (skipped without one) --------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("rows,width", [(8192, 768), (8192, 1024), (4096, 1000)])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_gpu_bdrln(rows, width, dtype):
    _bdrln_case((rows, width), dtype, 0.1, seed=rows + width, interpret=False)
    _bdrln_case((rows, width), dtype, 0.0, seed=rows + width + 1, interpret=False)


@pytest.mark.gpu
@pytest.mark.parametrize("g,d", [(256, 768), (513, 1024), (7, 1000)])
def test_gpu_column_sums(g, d):
    _column_sums_case(g, d, interpret=False)


@pytest.mark.gpu
def test_gpu_bdrln_triton_many_rows():
    """BDRLN's Triton backward at 32768 rows, where it takes 64 rows per program (`bwd_rows_per_program`)."""
    assert bdrln.kernel.default_blocks(32768, 1024).bwd_rows_per_program == 64
    _bdrln_case((32768, 1024), jnp.bfloat16, 0.1, seed=3, interpret=False, backend="triton")


@pytest.mark.gpu
@pytest.mark.parametrize("rows,width", [(8192, 3072), (8192, 4096), (1000, 1000)])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_gpu_bias_gelu(rows, width, dtype):
    _bias_gelu_case((rows, width), dtype, 0.1, seed=rows + width, interpret=False)
    _bias_gelu_case((rows, width), dtype, 0.0, seed=rows + width + 1, interpret=False)


@pytest.mark.gpu
@pytest.mark.parametrize("batch,seq,d", [(64, 128, 1024), (16, 512, 1024), (64, 128, 768), (6, 40, 1000)])
def test_gpu_embedding_layernorm(batch, seq, d):
    """The embedding block's kernels compiled: BERT-large/base shapes with its vocabulary, and a ragged one."""
    _embedding_case(batch, seq, d, 30522, 2, jnp.bfloat16, 0.1, seed=seq + d, interpret=False)
    _embedding_case(batch, seq, d, 30522, 2, jnp.float32, 0.0, seed=seq + d + 1, interpret=False)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(4, 16, 128, 128), (4, 16, 512, 512), (3, 12, 128, 128)])
def test_gpu_softmax(shape):
    _softmax_case(shape, jnp.bfloat16, 0.1, seed=shape[-1], interpret=False)
    _softmax_case(shape, jnp.float32, 0.0, seed=shape[-1] + 1, interpret=False)
