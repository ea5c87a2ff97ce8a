"""Pipeline parallelism (jaxformer/pipeline.py): same values and gradients as the plain scan on pipeline meshes,
collective-permutes in the compiled step, the schedule's keys and masks, bubble fractions, validation errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from jaxformer import BertConfig, BertForPreTraining
from jaxformer.hlo_analysis import analyze, parse_module, shapes
from jaxformer.pipeline import Pipeline, bubble_fraction
from jaxformer.sharding import make_mesh, param_shardings

TINY = dict(vocab_size=128, hidden_size=32, num_hidden_layers=8, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=16, dtype="float32", kernels="xla", hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0)
B, S = 8, 16
# Compile-time options for the tests only: LLVM's expensive passes double the CPU compile time of these tiny programs.
FAST_COMPILE = dict(xla_backend_optimization_level=0, xla_llvm_disable_expensive_passes=True)


def _inputs(vocab=128, b=B, s=S):
    rng = np.random.RandomState(0)
    ids = jnp.asarray(rng.randint(0, vocab, (b, s)), jnp.int32)
    types = jnp.asarray(rng.randint(0, 2, (b, s)), jnp.int32)
    mask = np.ones((b, s), np.int32)
    mask[1, s // 2:] = 0  # padding in one microbatch, not the others: the mask must travel with its microbatch
    mask[b - 1, 3:] = 0
    return ids, types, jnp.asarray(mask)


def _loss_and_grad(cfg):
    graphdef, params, rest = nnx.split(BertForPreTraining(cfg, rngs=nnx.Rngs(0)), nnx.Param, ...)
    ids, types, mask = _inputs()

    def loss(params, pipeline):
        out = nnx.merge(graphdef, params, rest)(ids, types, mask, pipeline=pipeline)
        # Weights that differ per position and example, so a misplaced microbatch or position changes the loss.
        w = jnp.cos(jnp.arange(out.mlm_logits.size, dtype=jnp.float32).reshape(out.mlm_logits.shape))
        return jnp.sum(out.mlm_logits * w) + jnp.sum(out.nsp_logits * jnp.array([1.0, -2.0]))

    return params, jax.value_and_grad(loss)


@pytest.fixture(scope="module")
def plain():
    """The plain scan's loss and gradients (no mesh): the ground truth."""
    params, grad = _loss_and_grad(BertConfig(**TINY))
    return params, jax.jit(lambda p: grad(p, None)).lower(params).compile(FAST_COMPILE)(params)


def _mesh(**axes):
    """The trainer's mesh (jaxformer.sharding.make_mesh: every axis present, Auto axes) over the first devices."""
    n = int(np.prod(list(axes.values())))
    return make_mesh(",".join(f"{k}={v}" for k, v in axes.items()), jax.devices()[:n])


def _place(params, mesh):
    """Parameters placed by the rules table: the stacked L axis split contiguously over `pipeline` (GPipe's stage
    assignment), N/F over `tensor`, the rest replicated."""
    placed = jax.device_put(nnx.to_pure_dict(params), param_shardings(params, mesh))
    params = jax.tree.map(lambda x: x, params)  # a copy to fill in
    nnx.replace_by_pure_dict(params, placed)
    return params


def _assert_close(got, want):
    (loss, grads), (loss0, grads0) = got, want
    np.testing.assert_allclose(loss, loss0, rtol=1e-5)
    flat, flat0 = jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(grads0)
    assert len(flat) == len(flat0)
    for (path, g), g0 in zip(flat, flat0):
        scale = float(np.abs(g0).max())
        assert scale > 0, path  # every parameter gets a gradient: the comparison is not against zeros
        np.testing.assert_allclose(g, g0, rtol=1e-5, atol=1e-5 * scale, err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize("axes, pipeline, remat", [
    (dict(pipeline=4, data=2), Pipeline(stages=4, microbatches=4), "none"),
    (dict(pipeline=4, data=2), Pipeline(stages=4, microbatches=8), "none"),
    (dict(pipeline=2, data=2, tensor=2), Pipeline(stages=2, microbatches=4), "full"),
    (dict(pipeline=4, data=2), Pipeline(stages=4, microbatches=4, repeats=2), "dots"),
], ids=["gpipe-m4", "gpipe-m8", "tensor-remat", "circular-r2"])
@pytest.mark.slow
def test_pipelined_model_matches_plain_scan(plain, axes, pipeline, remat):
    params0, want = plain
    params, grad = _loss_and_grad(BertConfig(**TINY, remat=remat))
    mesh = _mesh(**axes)
    placed = _place(params, mesh)
    with jax.set_mesh(mesh):
        step = jax.jit(lambda p: grad(p, pipeline)).lower(placed).compile(FAST_COMPILE)
        got = step(placed)
    _assert_close(got, want)
    if pipeline.repeats > 1 or len(axes) > 2:
        return
    hlo = step.as_text()
    # The shift between stages is a collective-permute ...
    assert analyze(hlo).collectives()["collective-permute"]["count"] > 0
    # ... and no device gathers a stacked [L, ...] weight (or its gradient): stage s keeps its L/p layers.
    stacked = {int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.to_pure_dict(params)["encoder"])}
    comps, _ = parse_module(hlo)
    gathered = [ins for body in comps.values() for ins in body if ins.opcode in ("all-gather", "all-gather-start")]
    for ins in gathered:
        assert not {int(np.prod(d)) for _, d in shapes(ins.type)} & stacked, ins.type


@pytest.mark.parametrize("pipeline", [Pipeline(4, 4), Pipeline(4, 2), Pipeline(2, 4, 2), Pipeline(1, 2, 2)])
def test_every_layer_runs_once_per_microbatch_with_its_key_and_mask(pipeline):
    """A layer that records, in column l, a uniform draw from its key plus 1000 x its row's mask: every layer must run
    exactly once on every microbatch, in order, with key fold_in(fold_in(key, l), microbatch) and that row's mask."""
    num_layers, b, m, key = 8, 8, pipeline.microbatches, jax.random.key(3)
    rows = b // m

    def layer(w, h, mask, key):
        draw = jax.random.uniform(key, (h.shape[0],)) + 1000.0 * mask[:, 0]
        return h * 1.5 + jax.nn.one_hot(w, num_layers)[None, :] * draw[:, None]  # x 1.5: order matters

    mask = jnp.arange(b)[:, None] % 3 == 0  # differs within and across microbatches
    out = jax.jit(lambda: pipeline.run(layer, jnp.arange(num_layers), jnp.zeros((b, num_layers)), mask, key=key))()

    def expected_draw(layer_id, micro):
        k = jax.random.fold_in(key, layer_id)
        return jax.random.uniform(jax.random.fold_in(k, micro) if m > 1 else k, (rows,))

    draws = jax.vmap(lambda i: jax.vmap(lambda mb: expected_draw(i, mb))(jnp.arange(m)))(jnp.arange(num_layers))
    # Microbatch i holds rows i, i + m, ... (strided), so row j is position j // m of microbatch j % m.
    draws = jnp.swapaxes(draws, 1, 2).reshape(num_layers, b).T + 1000.0 * mask  # (b, L)
    want = draws * 1.5 ** (num_layers - 1 - jnp.arange(num_layers))  # layer l's draw is scaled by the later layers
    np.testing.assert_allclose(out, want, rtol=1e-6)
    assert len(np.unique(np.asarray(draws) % 1000.0)) == b * num_layers  # independent across layers, microbatches


def test_each_layer_is_rematerialised_under_the_remat_policy():
    def layer(w, h, mask, key):
        return jnp.tanh(h * w)

    def jaxpr(policy):
        run = lambda w: Pipeline(2, 2).run(layer, w, jnp.ones((4, 3)), jnp.ones((4, 3)), key=jax.random.key(0),  # noqa
                                           remat_policy=policy).sum()
        return str(jax.make_jaxpr(jax.grad(run))(jnp.ones(4)))

    assert "policy=<function nothing_saveable" in jaxpr(jax.checkpoint_policies.nothing_saveable)  # a remat equation
    assert "nothing_saveable" not in jaxpr(None)


@pytest.mark.slow
def test_dropout_masks_differ_across_microbatches_and_match_the_scan_with_one():
    cfg = BertConfig(**dict(TINY, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, num_hidden_layers=2))
    model = BertForPreTraining(cfg, rngs=nnx.Rngs(0))
    ids, types, mask = _inputs(b=4)
    # Rows 0, 0, 1, 1: microbatches (strided: rows 0, 2 and rows 1, 3) are identical.
    ids, types, mask = (jnp.repeat(a[:2], 2, axis=0) for a in (ids, types, mask))
    key = jax.random.key(7)

    def run(pipeline):
        return model(ids, types, mask, deterministic=False, dropout_key=key, pipeline=pipeline).hidden_states

    two, one, plain = jax.jit(lambda: (run(Pipeline(2, 2)), run(Pipeline(2, 1)), run(None))).lower().compile(
        FAST_COMPILE)()
    assert not np.allclose(two[0::2], two[1::2], atol=1e-3)  # same inputs, different dropout masks
    # With one microbatch each layer keeps the plain scan's key fold_in(key, l): the same masks, the same output.
    np.testing.assert_allclose(one, plain, rtol=1e-5, atol=1e-5)


def test_bubble_fraction():
    assert bubble_fraction(1, 8) == 0.0
    assert bubble_fraction(4, 4) == pytest.approx(3 / 7)  # GPipe (p-1)/(m+p-1)
    assert bubble_fraction(4, 12) == pytest.approx(3 / 15)
    assert bubble_fraction(4, 4, 2) == pytest.approx(3 / 11)  # interleaved (p-1)/(r m+p-1)
    assert bubble_fraction(8, 16, 4) == pytest.approx(7 / 71)
    assert Pipeline(4, 8, 2).bubble_fraction == pytest.approx(3 / 19)
    with pytest.raises(ValueError, match="microbatches=0"):
        bubble_fraction(4, 0)


def test_validation_errors():
    for kw, match in [(dict(stages=0), "stages=0"), (dict(microbatches=-1), "microbatches=-1"),
                      (dict(repeats=1.5), "repeats=1.5"), (dict(stages=True), "stages=True"),
                      (dict(stages=4, microbatches=2, repeats=2), "microbatches=2 must be >= stages=4")]:
        with pytest.raises(ValueError, match=match):
            Pipeline(**kw)
    with pytest.raises(ValueError, match=r"num_hidden_layers=6 must be divisible by stages\*repeats=4"):
        Pipeline(2, 2, 2).check(6, 8)
    with pytest.raises(ValueError, match="batch size 6 must be divisible by microbatches=4"):
        Pipeline(2, 4).check(8, 6)
    model = BertForPreTraining(BertConfig(**dict(TINY, num_hidden_layers=2)), rngs=nnx.Rngs(0))
    ids, types, mask = _inputs(b=6)
    with pytest.raises(ValueError, match="microbatches=4"):  # raised by the model before anything is traced
        model(ids, types, mask, pipeline=Pipeline(2, 4))
    with pytest.raises(ValueError, match="num_hidden_layers=2"):
        model(ids, types, mask, pipeline=Pipeline(4, 6))
    with jax.set_mesh(_mesh(pipeline=4, data=2)), pytest.raises(ValueError, match=r"stages=2 must equal .*\(4\)"):
        model(ids, types, mask, pipeline=Pipeline(2, 2))
    explicit = jax.make_mesh((2, 2), ("pipeline", "data"), (jax.sharding.AxisType.Explicit,) * 2,
                             devices=jax.devices()[:4])
    with jax.set_mesh(explicit), pytest.raises(ValueError, match="'pipeline' axis is Explicit"):
        Pipeline(2, 2).run(lambda w, h, mask, key: h, jnp.zeros(2), jnp.zeros((4, 3)), jnp.ones((4, 3)),
                           key=jax.random.key(0))


@pytest.mark.slow
def test_pallas_kernels_run_per_stage_and_batch_shard_inside_the_pipeline():
    """kernels="pallas" (interpret mode) inside the pipeline on a pipeline=2, data=2 mesh: the kernels' batch
    shard_map, vmapped over stages with spmd_axis_name="pipeline", runs per (stage, batch shard); values and
    gradients (replicated layernorm/bias parameters included: summed over batch shards once) equal the XLA scan."""
    small = dict(TINY, num_hidden_layers=2, vocab_size=64)
    params, grad_xla = _loss_and_grad(BertConfig(**small))
    _, grad_pallas = _loss_and_grad(BertConfig(**dict(small, kernels="pallas")))
    want = jax.jit(lambda p: grad_xla(p, None)).lower(params).compile(FAST_COMPILE)(params)
    mesh = _mesh(pipeline=2, data=2)
    placed = _place(params, mesh)
    with jax.set_mesh(mesh):
        step = jax.jit(lambda p: grad_pallas(p, Pipeline(2, 2))).lower(placed).compile(FAST_COMPILE)
        got = step(placed)
    _assert_close(got, want)
    # Nothing is gathered: had the kernels' shard_map not carried the stage axis, the stage-stacked activations
    # would be all-gathered over `pipeline` around every kernel.
    assert analyze(step.as_text()).collectives()["all-gather"]["count"] == 0


def test_opaque_kernel_runs_per_stage_on_a_pipeline_only_mesh():
    """On a mesh with only a `pipeline` axis (no batch axis to shard_map over) a kernel with no sharding rule still
    runs on its own stage's devices under the stage vmap. `pure_callback` stands in for a compiled pallas_call here
    (interpret-mode Pallas lowers to ordinary, partitionable ops on the CPU): called bare it makes XLA all-gather
    the stage axis (as the GPU pipeline did: 1200 all-gathers per step, benchmarks/results/distributed-2xh200.md)."""
    from pallas_kernels.mesh import batch_shard_map

    def opaque(row_offset, x):
        return jax.pure_callback(np.tanh, jax.ShapeDtypeStruct(x.shape, x.dtype), x, vmap_method="sequential")

    mesh = _mesh(pipeline=8)
    x = jax.random.normal(jax.random.key(0), (8, 4, 16), jnp.float32)
    with jax.set_mesh(mesh):
        xs = jax.device_put(x, jax.sharding.NamedSharding(mesh, P("pipeline")))
        step = jax.jit(jax.vmap(batch_shard_map(opaque, n_batched=1), spmd_axis_name="pipeline")).lower(xs).compile()
        got = step(xs)
    np.testing.assert_allclose(np.asarray(got), np.tanh(np.asarray(x)), rtol=1e-6)
    assert analyze(step.as_text()).collectives()["all-gather"]["count"] == 0


@pytest.mark.gpu
def test_pallas_kernels_inside_the_pipeline_on_two_gpus():
    """The same as above with the kernels compiled (Triton) on a pipeline=2 mesh of two GPUs."""
    if jax.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    small = dict(TINY, num_hidden_layers=2)
    with jax.default_matmul_precision("highest"):  # fp32 products: TF32 rounding would swamp the comparison
        params, grad_xla = _loss_and_grad(BertConfig(**small))
        _, grad_pallas = _loss_and_grad(BertConfig(**dict(small, kernels="pallas")))
        want = jax.jit(lambda p: grad_xla(p, None))(params)
        mesh = _mesh(pipeline=2)
        placed = _place(params, mesh)
        with jax.set_mesh(mesh):
            got = jax.jit(lambda p: grad_pallas(p, Pipeline(2, 2)))(placed)
    _assert_close(got, want)
