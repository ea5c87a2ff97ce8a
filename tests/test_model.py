"""The Flax BERT: shapes, padding, gradients, dropout, remat and the scan over layers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.extend.core import jaxprs_in_params

from jaxformer import BertConfig, BertForPreTraining

SMALL = dict(vocab_size=97, max_position_embeddings=32)


def _inputs(b, s, vocab, seed=0):
    rng = np.random.RandomState(seed)
    ids = jnp.asarray(rng.randint(0, vocab, (b, s)), jnp.int32)
    types = jnp.asarray(rng.randint(0, 2, (b, s)), jnp.int32)
    mask = np.ones((b, s), np.int32)
    mask[0, s // 2:] = 0  # the first sequence is half padding
    return ids, types, jnp.asarray(mask)


@pytest.fixture(scope="module")
def tiny32():
    return BertForPreTraining(BertConfig.preset("tiny", dtype="float32", **SMALL), rngs=nnx.Rngs(0))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tiny", "mini"])
def test_preset_shapes_run(name):
    cfg = BertConfig.preset(name)
    model = BertForPreTraining(cfg, rngs=nnx.Rngs(0))
    ids, types, mask = _inputs(2, 16, cfg.vocab_size)
    out = model(ids, types, mask)
    assert out.mlm_logits.shape == (2, 16, cfg.vocab_size) and out.mlm_logits.dtype == jnp.float32
    assert out.nsp_logits.shape == (2, 2) and out.hidden_states.shape == (2, 16, cfg.hidden_size)
    assert out.hidden_states.dtype == jnp.bfloat16
    assert np.isfinite(np.asarray(out.mlm_logits)).all()
    out = model(ids, types, mask, masked_positions=jnp.array([[1, 3, 5], [0, 2, 4]]))
    assert out.mlm_logits.shape == (2, 3, cfg.vocab_size)


@pytest.mark.parametrize("name", ["base", "large"])
def test_large_preset_shapes_abstract(name):
    """base/large are checked abstractly (no memory, no compile): shapes and dtypes of a full forward."""
    cfg = BertConfig.preset(name)

    def run(ids, types, mask, positions):
        model = BertForPreTraining(cfg, rngs=nnx.Rngs(0))
        return model(ids, types, mask, positions)

    spec = jax.ShapeDtypeStruct
    out = jax.eval_shape(run, spec((2, 16), jnp.int32), spec((2, 16), jnp.int32), spec((2, 16), jnp.int32),
                         spec((2, 4), jnp.int32))
    assert out.mlm_logits.shape == (2, 4, 30522) and out.nsp_logits.shape == (2, 2)
    assert out.hidden_states.shape == (2, 16, cfg.hidden_size)


@pytest.mark.slow
def test_masked_positions_select_the_full_logits(tiny32):
    ids, types, mask = _inputs(2, 12, 97)
    full = tiny32(ids, types, mask).mlm_logits
    pos = jnp.array([[0, 5, 11], [2, 2, 7]])
    part = tiny32(ids, types, mask, masked_positions=pos).mlm_logits
    np.testing.assert_allclose(part, jnp.take_along_axis(full, pos[..., None], axis=1), rtol=1e-5, atol=1e-5)


def test_padding_does_not_change_real_positions(tiny32):
    ids, types, mask = _inputs(2, 12, 97)
    out = tiny32(ids, types, mask)
    ids2 = ids.at[0, 6:].set((ids[0, 6:] + 13) % 97)  # change only the padded tokens of sequence 0
    out2 = tiny32(ids2, types, mask)
    np.testing.assert_allclose(out.hidden_states[0, :6], out2.hidden_states[0, :6], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.nsp_logits, out2.nsp_logits, rtol=1e-5, atol=1e-6)
    # ... while the padded positions themselves did change (the test could fail).
    assert not np.allclose(out.hidden_states[0, 6:], out2.hidden_states[0, 6:])


@pytest.mark.slow
def test_fp32_gradient_matches_finite_differences(tiny32):
    # Full fp32 matmuls: on GPUs the default precision uses TF32, whose rounding swamps finite differences.
    with jax.default_matmul_precision("highest"):
        _check_gradient(tiny32)


def _check_gradient(tiny32):
    ids, types, mask = _inputs(2, 8, 97)
    graphdef, params, rest = nnx.split(tiny32, nnx.Param, ...)
    w = jax.random.normal(jax.random.key(7), (2, 8, 97))

    def loss(p):
        out = nnx.merge(graphdef, p, rest)(ids, types, mask)
        return jnp.sum(out.mlm_logits * w) / 100 + jnp.sum(out.nsp_logits)

    loss = jax.jit(loss)
    grads = jax.jit(jax.grad(loss))(params)
    leaves = jax.tree.leaves(params)
    keys = jax.random.split(jax.random.key(8), len(leaves))
    direction = jax.tree.unflatten(jax.tree.structure(params),
                                   [jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)])
    norm = jnp.sqrt(sum(jnp.sum(d * d) for d in jax.tree.leaves(direction)))
    direction = jax.tree.map(lambda d: d / norm, direction)
    eps = 1e-2
    plus = loss(jax.tree.map(lambda p, d: p + eps * d, params, direction))
    minus = loss(jax.tree.map(lambda p, d: p - eps * d, params, direction))
    numeric = (plus - minus) / (2 * eps)
    analytic = sum(jnp.sum(g * d) for g, d in zip(jax.tree.leaves(grads), jax.tree.leaves(direction)))
    assert abs(float(analytic)) > 1e-3  # a meaningful directional derivative
    np.testing.assert_allclose(float(analytic), float(numeric), rtol=2e-3)


def test_dropout_on_vs_off():
    cfg = BertConfig.preset("tiny", dtype="float32", **SMALL)
    model = BertForPreTraining(cfg, rngs=nnx.Rngs(0))
    ids, types, mask = _inputs(2, 12, 97)
    off1, off2 = model(ids, types, mask), model(ids, types, mask)
    np.testing.assert_array_equal(off1.hidden_states, off2.hidden_states)
    on1 = model(ids, types, mask, deterministic=False)
    on2 = model(ids, types, mask, deterministic=False)  # the model's dropout stream advanced: a new mask
    assert not np.allclose(on1.hidden_states, off1.hidden_states, atol=1e-3)
    assert not np.allclose(on1.hidden_states, on2.hidden_states, atol=1e-3)
    key = jax.random.key(11)
    a = model(ids, types, mask, deterministic=False, dropout_key=key)
    b = model(ids, types, mask, deterministic=False, dropout_key=key)
    np.testing.assert_array_equal(a.hidden_states, b.hidden_states)
    # Rate 0 with deterministic=False equals evaluation mode.
    cfg0 = cfg.replace(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model0 = BertForPreTraining(cfg0, rngs=nnx.Rngs(0))
    np.testing.assert_allclose(model0(ids, types, mask, deterministic=False).hidden_states,
                               off1.hidden_states, rtol=1e-6, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("remat", ["full", "dots"])
def test_remat_same_values_and_gradients(remat):
    cfg = BertConfig.preset("tiny", dtype="float32", **SMALL)
    ids, types, mask = _inputs(2, 8, 97)

    def grads(c):
        model = BertForPreTraining(c, rngs=nnx.Rngs(0))
        return nnx.grad(lambda m: jnp.sum(m(ids, types, mask).mlm_logits ** 2))(model)

    with jax.default_matmul_precision("highest"):  # no TF32 on GPUs: compare the math, not the rounding
        g0, g1 = grads(cfg), grads(cfg.replace(remat=remat))
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
        # Recomputation may reorder fp32 reductions: compare ||a - b|| / ||b|| (METHOD: fp32 lands far under 1e-3).
        assert float(jnp.linalg.norm(a - b)) <= 1e-5 * float(jnp.linalg.norm(b)) + 1e-7


@pytest.mark.slow
def test_program_size_does_not_grow_with_depth_under_scan_layers():
    """With scan_layers the layers run in a scan: the traced program of 2 and 12 layers has the same number of
    equations; the loop over the layers (the default, on one device and under a mesh) grows with depth."""
    ids, types, mask = _inputs(8, 8, 97)

    def n_eqns(layers, scan):
        cfg = BertConfig.preset("tiny", num_hidden_layers=layers, scan_layers=scan, **SMALL)
        model = BertForPreTraining(cfg, rngs=nnx.Rngs(0))
        graphdef, state = nnx.split(model)
        jaxpr = jax.make_jaxpr(lambda s: nnx.merge(graphdef, s)(ids, types, mask).mlm_logits)(state)
        return len(jaxpr.jaxpr.eqns)

    assert n_eqns(2, True) == n_eqns(12, True)
    assert n_eqns(12, False) > n_eqns(2, False)
    assert BertConfig.preset("tiny").scan_layers is False
    with jax.set_mesh(jax.make_mesh((jax.device_count(),), ("data",), axis_types=(jax.sharding.AxisType.Auto,))):
        assert jax.device_count() > 1 and n_eqns(12, False) > n_eqns(2, False)  # several devices: the loop too


def _eqns(jaxpr):
    """Every equation of a jaxpr, those of its sub-jaxprs (jit, custom_vjp, checkpoint) included."""
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in jaxprs_in_params(eqn.params):
            yield from _eqns(sub)


def test_layer_loop_gradient_is_one_concatenate_per_parameter():
    """The loop's gradient of each stacked (L, ...) parameter is one concatenate of the L layers' gradients, not L
    zero-pads summed (what slicing `a[i]` transposes to: XLA left that as an L-way pad+add chain on the GPU)."""
    layers = 3
    cfg = BertConfig.preset("tiny", dtype="float32", num_hidden_layers=layers, **SMALL)
    ids, types, mask = _inputs(2, 8, 97)
    model = BertForPreTraining(cfg, rngs=nnx.Rngs(0))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    loss = lambda p: jnp.sum(nnx.merge(graphdef, p, rest)(ids, types, mask).mlm_logits ** 2)  # noqa: E731
    eqns = list(_eqns(jax.make_jaxpr(jax.grad(loss))(params).jaxpr))
    stacked = {tuple(a.shape) for a in jax.tree.leaves(nnx.state(model.encoder)) if a.shape[:1] == (layers,)}
    assert len(stacked) >= 4
    made = lambda prim: [tuple(v.aval.shape) for e in eqns if e.primitive.name == prim for v in e.outvars]  # noqa
    assert not stacked & set(made("pad")) and not stacked & set(made("add_any"))
    assert stacked <= set(made("concatenate"))


@pytest.mark.slow
@pytest.mark.parametrize("kernels", ["xla", "pallas"])
def test_layer_loop_equals_scan(kernels):
    """The default loop over the layers and `scan_layers=True` compute the same function: outputs with dropout on
    (layer l's masks from fold_in(key, l) either way) and every parameter's gradient, fp32, 3 layers."""
    cfg = BertConfig.preset("tiny", dtype="float32", num_hidden_layers=3, kernels=kernels, **SMALL)
    ids, types, mask = _inputs(2, 16, 97)
    key = jax.random.key(5)

    def run(c):
        model = BertForPreTraining(c, rngs=nnx.Rngs(0))
        loss = lambda m: jnp.sum(m(ids, types, mask, deterministic=False, dropout_key=key).mlm_logits ** 2)  # noqa
        return nnx.value_and_grad(loss)(model)

    with jax.default_matmul_precision("highest"):
        (l0, g0), (l1, g1) = run(cfg), run(cfg.replace(scan_layers=True))
    np.testing.assert_allclose(float(l0), float(l1), rtol=1e-6)
    leaves0, leaves1 = jax.tree.leaves(g0), jax.tree.leaves(g1)
    assert len(leaves0) == len(leaves1)
    for a, b in zip(leaves0, leaves1):
        assert float(jnp.linalg.norm(a - b)) <= 1e-5 * float(jnp.linalg.norm(b)) + 1e-7


def test_invalid_inputs_are_named():
    model = BertForPreTraining(BertConfig.preset("tiny", **SMALL), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="max_position_embeddings=32"):
        model(jnp.zeros((1, 40), jnp.int32))
    with pytest.raises(ValueError, match="input_ids"):
        model(jnp.zeros((40,), jnp.int32))


@pytest.mark.slow
@pytest.mark.parametrize("scan_layers", [False, True])
def test_full_remat_lowers_the_compiled_peak(scan_layers):
    """remat='full' keeps only each layer's input: the compiled gradient needs less temporary memory than without
    remat, in the unrolled layer loop (where XLA would merge a recomputation it could CSE) and under the scan."""
    cfg = BertConfig.preset("tiny", dtype="float32", num_hidden_layers=4, hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0, scan_layers=scan_layers)
    ids, types, mask = _inputs(16, 64, 97)

    def temp_bytes(c):
        graphdef, params, rest = nnx.split(BertForPreTraining(c, rngs=nnx.Rngs(0)), nnx.Param, ...)
        loss = lambda p: jnp.sum(nnx.merge(graphdef, p, rest)(ids, types, mask).hidden_states ** 2)  # noqa: E731
        return jax.jit(jax.grad(loss)).lower(params).compile().memory_analysis().temp_size_in_bytes

    assert temp_bytes(cfg.replace(remat="full")) < 0.8 * temp_bytes(cfg)
