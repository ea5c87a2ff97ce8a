"""The train step differentiates with respect to a compute-dtype copy of the encoder's stacked weights: the same
gradients, bit for bit on one device, with the weight tensors (not the 1-D parameters) in bf16. The initial state
computed in its shardings equals the one built on one device and placed."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxformer import sharding
from jaxformer.config import BertConfig, TrainConfig
from jaxformer.data import synthetic_batch
from jaxformer.losses import pretraining_losses
from jaxformer.steps import Steps, _forward, build_model, make_optimizer

CFG = BertConfig(vocab_size=200, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                 max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, kernels="xla")
TC = TrainConfig(batch_size=8, seq_len=16, steps=10, warmup_steps=1, dropout=0.0)


@pytest.mark.slow
def test_gradients_through_the_compute_copy_equal_the_float32_ones():
    model = build_model(CFG, 0)
    steps = Steps(model, make_optimizer(TC), TC)
    params = steps.init_state(model, 0).params
    batch = synthetic_batch(CFG.vocab_size, 8, 16, 3, seed=1)

    def loss(p):
        return pretraining_losses(_forward(steps.graphdef, steps.rest, p, batch, deterministic=True), batch)[0]

    copy = steps._compute_copy(params)
    layers = copy["encoder"]["layers"]
    assert layers["attention"]["qkv_kernel"].dtype == jnp.bfloat16 and layers["feed_forward"]["in_kernel"].dtype == \
        jnp.bfloat16
    assert layers["attention"]["layer_norm"]["scale"].dtype == jnp.float32  # 1-D parameters stay float32
    assert copy["embeddings"]["word"].dtype == jnp.float32  # outside the layer stack: untouched
    ref = jax.jit(jax.grad(loss))(params)
    new = jax.jit(lambda p: jax.tree.map(lambda g, q: g.astype(q.dtype), jax.grad(loss)(steps._compute_copy(p)),
                                         p))(params)
    for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(new)):
        assert a.dtype == b.dtype == jnp.float32
        assert jnp.array_equal(a, b)
    assert any(float(jnp.abs(a).max()) > 0 for a in jax.tree.leaves(ref))  # not trivially zero
    # float32 compute: nothing to cast
    f32 = Steps(build_model(CFG.replace(dtype="float32"), 0), make_optimizer(TC), TC)
    assert f32._compute_copy(params) is params


def test_the_carried_compute_copy_gives_the_steps_of_casting_each_step():
    tc = dataclasses.replace(TC, dropout=0.1)
    model = build_model(CFG.replace(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1), 0)
    steps = Steps(model, make_optimizer(tc), tc)
    state = steps.init_state(model, 0)
    stacked = jax.device_get(state.compute)  # the state is donated to the step below
    assert steps.carries_copy() and "['attention']['qkv_kernel']" in stacked
    assert all(v.dtype == jnp.bfloat16 and v.ndim >= 3 for v in state.compute.values())
    assert "['attention']['layer_norm']['scale']" not in stacked  # 1-D parameters: none
    carried, cast = state, jax.tree.map(jnp.copy, steps.checkpointed(state))
    for i in range(3):
        batch = synthetic_batch(CFG.vocab_size, 8, 16, 3, seed=10 + i)
        carried, m1 = steps.train_step(carried, batch)
        cast, m2 = steps.train_step(steps.checkpointed(cast), batch)  # no copy: the step casts the weights
        assert float(m1["loss"]) == float(m2["loss"])
    for a, b in zip(jax.tree.leaves(carried), jax.tree.leaves(cast)):
        assert a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b))
    layers = carried.params["encoder"]["layers"]
    assert np.array_equal(np.asarray(carried.compute["['feed_forward']['in_kernel']"]),
                          np.asarray(layers["feed_forward"]["in_kernel"].astype(jnp.bfloat16)))
    assert not np.array_equal(np.asarray(carried.compute["['feed_forward']['in_kernel']"]),
                              np.asarray(stacked["['feed_forward']['in_kernel']"]))  # the update wrote it
    # A checkpoint leaves the copy out; a restore recomputes it.
    saved = steps.checkpointed(carried)
    assert saved.compute == {} and saved.params is carried.params
    restored = steps.completed(jax.tree.map(jnp.copy, saved))
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(carried)):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    f32 = Steps(build_model(CFG.replace(dtype="float32"), 0), make_optimizer(TC), TC)
    assert not f32.carries_copy() and f32.init_state(model, 0).compute == {}
    # On a mesh the copy has its weights' shardings.
    tc = dataclasses.replace(TC, mesh="data=4,tensor=2")
    meshed = Steps(model, make_optimizer(tc), tc, sharding.make_mesh(sharding.validate(tc.mesh, CFG, tc)))
    placed = meshed.initial_state(0)
    for k, v in placed.compute.items():
        assert v.sharding == meshed.state_shardings.compute[k] and v.dtype == jnp.bfloat16
    assert placed.compute["['attention']['qkv_kernel']"].sharding == \
        placed.params["encoder"]["layers"]["attention"]["qkv_kernel"].sharding


def test_xla_opt_level_auto_raises_it_only_for_batch_parallel_layers_without_a_pipeline():
    from jaxformer import sharding
    from jaxformer.steps import BATCH_PARALLEL_OPT_LEVEL as ON
    model = build_model(CFG, 0)

    def options(mesh, **tc):
        tc = dataclasses.replace(TC, **tc)
        return Steps(model, make_optimizer(tc), tc, sharding.make_mesh(mesh) if mesh else None).optimization_level()

    assert ON in ("O1", "O2", "O3")
    assert options("data=8") == ON and options("fsdp=2,tensor=4") == ON
    assert options("data=8", xla_opt_level="default") is None
    assert options("tensor=8", xla_opt_level="O1") == "O1" and options(None, xla_opt_level="O3") == "O3"
    assert options(None) is None  # one device: nothing to reduce
    assert options("tensor=8") is None
    assert options("data=4,pipeline=2", microbatches=2) is None  # a pipeline: not measured better at O2


@pytest.mark.slow
def test_the_step_compiles_at_its_optimization_level(monkeypatch):
    """The level is a context read when XLA compiles: the first call and `Steps.train_step.compile` both compile
    inside it (a `lower(...).compile()` outside it would build, and cache, a default-level executable)."""
    from jax._src import compiler
    from jax._src import config as jax_config

    from jaxformer import sharding
    seen = []
    original = compiler.get_compile_options

    def recording(*args, **kwargs):
        seen.append(jax_config.optimization_level.value)
        return original(*args, **kwargs)

    monkeypatch.setattr(compiler, "get_compile_options", recording)
    tc = dataclasses.replace(TC, xla_opt_level="O1")
    for how in ("call", "compile"):  # a fresh Steps each: the call would reuse what `compile` built (and vice versa)
        model = build_model(CFG, 0)  # (the call donates the state)
        steps = Steps(model, make_optimizer(tc), tc, sharding.make_mesh("data=8"))
        state = steps.place(steps.init_state(model, 0))
        batch = steps.place_batch(synthetic_batch(CFG.vocab_size, 8, 16, 3, seed=1))
        seen.clear()
        steps.train_step(state, batch) if how == "call" else steps.train_step.compile(state, batch)
        assert seen and set(seen) == {"O1"}, (how, seen)


@pytest.mark.slow
@pytest.mark.parametrize("mesh", ["data=8", "data=2,fsdp=2,tensor=2"])
def test_initial_state_in_its_shardings_equals_the_placed_one(mesh):
    tc = dataclasses.replace(TC, mesh=mesh)
    mesh = sharding.make_mesh(sharding.validate(tc.mesh, CFG, tc))
    model = build_model(CFG, 5)
    placed = Steps(model, make_optimizer(tc), tc, mesh)
    placed = placed.place(placed.init_state(model, 5))
    abstract_model = build_model(CFG, 5, abstract=True)
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(nnx.state(abstract_model, nnx.Param)))
    steps = Steps(abstract_model, make_optimizer(tc), tc, mesh)
    state, abstract = steps.initial_state(5), steps.abstract_state(5)
    for a, b, c in zip(jax.tree.leaves(placed), jax.tree.leaves(state), jax.tree.leaves(abstract)):
        assert a.sharding == b.sharding == c.sharding and a.shape == b.shape == c.shape and a.dtype == b.dtype
        assert np.array_equal(np.asarray(a), np.asarray(b))
    assert not np.array_equal(np.asarray(state.params["pooler"]["kernel"]),
                              np.asarray(Steps(build_model(CFG, 6, abstract=True), make_optimizer(tc), tc,
                                               mesh).initial_state(6).params["pooler"]["kernel"]))



def test_per_layer_norm_and_clip_equal_optax():
    """The norm summed one layer at a time is optax's global norm, and the clip built on it clips as optax's does
    (same empty state), on a tree of stacked (L, ...) weights, matrices and vectors."""
    import optax

    from jaxformer.steps import clip_by_global_norm, global_norm, norms_per_layer
    keys = jax.random.split(jax.random.key(7), 4)
    tree = {"stacked": jax.random.normal(keys[0], (5, 8, 3, 4)), "qkv": jax.random.normal(keys[1], (5, 6, 3, 2, 4)),
            "matrix": jax.random.normal(keys[2], (9, 7)), "bias": 3.0 * jax.random.normal(keys[3], (11,))}
    want = optax.tree.norm(tree)
    for per_layer in (False, True):
        np.testing.assert_allclose(global_norm(tree, per_layer=per_layer), want, rtol=1e-6)
        for max_norm in (0.5 * float(want), 2.0 * float(want)):
            ours, theirs = clip_by_global_norm(max_norm, per_layer=per_layer), optax.clip_by_global_norm(max_norm)
            assert ours.init(tree) == theirs.init(tree)
            got, _ = ours.update(tree, ours.init(tree))
            ref, _ = theirs.update(tree, theirs.init(tree))
            jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), got, ref)
    assert norms_per_layer(TC) and not norms_per_layer(dataclasses.replace(TC, mesh="data=2,pipeline=2"))
