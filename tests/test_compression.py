"""Compressed gradient exchange (jaxformer/compression): the format, the selections, both exchanges on 8 virtual CPU
devices, and the compressed train step against the dense one (equal at density 1, no dense all-reduce, resumable).
"""

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxformer import sharding
from jaxformer.compression import CompressedSteps, CompressionConfig, sparse_allreduce, state_shardings
from jaxformer.compression import format as fmt
from jaxformer.compression.selection import compact, select
from jaxformer.compression.steps import _Levels, kernels_run_inside_manual_data
from jaxformer.config import BertConfig, MeshConfig, TrainConfig
from jaxformer.data import synthetic_batch
from jaxformer.hlo_analysis import analyze, nbytes
from jaxformer.outputs import Checkpointer
from jaxformer.steps import Steps, build_model, make_optimizer


def heavy(key, shape):
    """Heavy-tailed random values, as gradients are."""
    a, b = jax.random.split(key)
    return np.asarray(jax.random.normal(a, shape) * jnp.exp(jax.random.normal(b, shape)), np.float32)


# ----------------------------------------------------------------------------------------------- options
@pytest.mark.parametrize("field, value, named", [
    ("density", 0.0, "density=0.0"), ("density", 1.5, "density=1.5"), ("exchange", "ring", "exchange='ring'"),
    ("selection", "approx", "selection='approx'"), ("value_dtype", "float16", "value_dtype='float16'"),
    ("momentum", 1.0, "momentum=1.0"), ("clip_norm", 0.0, "clip_norm=0.0"), ("min_size", 0, "min_size=0"),
    ("warmup_steps", -1, "warmup_steps=-1"), ("send_slack", 0.5, "send_slack=0.5"),
    ("refresh_every", 0, "refresh_every=0"), ("sample_fraction", 0.0, "sample_fraction=0.0"),
    ("freeze_variance_after", -1, "freeze_variance_after=-1"), ("freeze_variance_after", 2.5,
                                                                 "freeze_variance_after=2.5"),
])
def test_options_name_field_and_value(field, value, named):
    with pytest.raises(ValueError, match=re.escape(named)):
        CompressionConfig(**{field: value})


@pytest.mark.slow
def test_compression_needs_a_data_axis_of_two_or_more():
    with pytest.raises(ValueError, match="axis='data'.*tensor=8"):
        CompressionConfig().check_mesh(sharding.make_mesh("tensor=8"))
    with pytest.raises(ValueError, match="axis='data'.*data=1,fsdp=4"):  # the trainer's check, before any data work
        CompressionConfig().check_mesh(MeshConfig.parse("fsdp=4"))
    CompressionConfig().check_mesh(MeshConfig.parse("data=2,tensor=4"))
    model, _ = _model()
    with pytest.raises(ValueError, match="data axis"):
        CompressedSteps(model, make_optimizer(TC), TC, None, CompressionConfig())
    with pytest.raises(ValueError, match="axis='fsdp'.*'data' axis only"):
        CompressedSteps(model, make_optimizer(TC), TC, sharding.make_mesh("fsdp=8"), CompressionConfig(axis="fsdp"))


def test_warm_up_levels_quarter_the_density_down_to_the_target():
    cfg = CompressionConfig(density=0.001, warmup_steps=100)
    assert cfg.levels() == ((0, 0.25), (25, 0.0625), (50, 0.015625), (75, 0.00390625), (100, 0.001))
    assert cfg.density_at(0) == 0.25 and cfg.density_at(74) == 0.015625 and cfg.density_at(10 ** 6) == 0.001
    assert CompressionConfig(density=0.01).levels() == ((0, 0.01),)


def test_a_frozen_variance_starts_with_a_dense_level():
    cfg = CompressionConfig(density=0.01, freeze_variance_after=50)
    assert cfg.levels() == ((0, 1.0), (50, 0.01)) and cfg.steady_step == 50
    warm = cfg.replace(warmup_steps=10)
    assert warm.levels() == ((0, 1.0), (50, 0.25), (53, 0.0625), (56, 0.015625), (60, 0.01))
    assert warm.steady_step == 60
    with pytest.raises(ValueError, match="momentum=0.9 with freeze_variance_after=50"):
        cfg.replace(momentum=0.9)


def test_frozen_variance_adam_is_adam_then_linear_in_the_gradient():
    """The first updates are optax's Adam exactly; after the freeze a gradient delivered in one burst (error
    feedback's way: a coordinate's residual once every few steps) moves the parameters as far as the same gradient
    spread over those steps, where Adam's adaptive second moment divides the burst down."""
    from jaxformer.compression.frozen import scale_by_adam_frozen_variance
    rng = np.random.default_rng(0)
    # 100 steps: the first moment's bias correction (1 - 0.9^t) is 1 by then, so only the second moment matters.
    warm = [{"w": jnp.asarray(rng.normal(size=64), jnp.float32)} for _ in range(100)]
    frozen, adam = scale_by_adam_frozen_variance(0.9, 0.999, 1e-6, 100), optax.scale_by_adam(0.9, 0.999, 1e-6)
    sf, sa = frozen.init(warm[0]), adam.init(warm[0])
    for g in warm:
        uf, sf = jax.jit(frozen.update)(g, sf)
        ua, sa = jax.jit(adam.update)(g, sa)
        np.testing.assert_array_equal(uf["w"], ua["w"])

    def movement(opt, state, grads):
        total, update = 0.0, jax.jit(opt.update)
        for g in grads + [{"w": jnp.zeros(64)}] * 200:  # until the first moment has decayed
            u, state = update(g, state)
            total = total + u["w"]
        return np.asarray(total), state

    g = {"w": jnp.asarray(rng.normal(size=64), jnp.float32)}
    spread = [g] * 200  # 20 periods of 10 steps: each step's gradient, or the period's sum on its first step
    burst = ([jax.tree.map(lambda x: 10 * x, g)] + [{"w": jnp.zeros(64)}] * 9) * 20
    a, end = movement(frozen, sf, spread)
    b, _ = movement(frozen, sf, burst)
    np.testing.assert_allclose(b, a, rtol=1e-4)
    np.testing.assert_array_equal(end.nu["w"], sf.nu["w"])  # frozen
    a, _ = movement(adam, sa, spread)
    b, _ = movement(adam, sa, burst)
    assert np.median(np.abs(b) / np.abs(a)) < 0.6  # the adaptive second moment loses much of the bursts


def test_levels_pick_the_step_of_the_step_count():
    calls = []

    def level(name):
        def fn(state, batch):
            calls.append(name)
            return dataclasses.replace(state, step=state.step + 1), {}
        return fn

    @dataclasses.dataclass
    class State:
        step: int

    steps = _Levels([(0, level("a")), (2, level("b"))])
    state = State(0)
    for _ in range(3):
        state, _ = steps(state, None)
    assert calls == ["a", "a", "b"]
    steps(State(1), None)  # not the state it returned: the count is read from it
    assert calls[-1] == "a"


# ----------------------------------------------------------------------------------------------- format, selection
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_encode_decode_round_trip(dtype):
    rng = np.random.default_rng(0)
    space, k, n = 300_000, 700, 640  # five count blocks, padding after n
    index = np.sort(rng.choice(space, n, replace=False)).astype(np.int32)
    value = heavy(jax.random.key(1), (n,))
    padded_i = np.concatenate([index, np.full(k - n, 7, np.int32)])
    padded_v = np.concatenate([value, np.ones(k - n, np.float32)])
    packed = jax.jit(fmt.encode, static_argnums=(3, 4))(padded_i, padded_v, n, space, jnp.dtype(dtype))
    words = fmt.pack_words(packed)
    assert words.dtype == jnp.uint16 and 2 * words.size == fmt.nbytes(k, space, dtype)
    unpacked, rest = fmt.unpack_words(words, k, space, dtype)
    assert rest.size == 0
    got_i, got_v = jax.jit(fmt.decode, static_argnums=1)(unpacked, space)
    np.testing.assert_array_equal(got_i[:n], index)
    np.testing.assert_array_equal(got_v[:n], np.asarray(jnp.asarray(value).astype(dtype).astype(jnp.float32)))
    assert np.all(np.asarray(got_i[n:]) == space) and np.all(np.asarray(got_v[n:]) == 0)
    assert fmt.nbytes(10_000, 10 ** 7, "bfloat16") / 10_000 < 4.1  # bf16 + 16-bit offset + counts, index included


def test_compact_finds_the_true_entries_in_order():
    mask = np.random.default_rng(0).random(5000) < 0.05
    pos, n = jax.jit(compact, static_argnums=1)(mask, 300)
    want = np.flatnonzero(mask)
    assert int(n) == want.size and want.size < 300
    np.testing.assert_array_equal(pos[:want.size], want)
    assert np.all(np.asarray(pos[want.size:]) == mask.size)


MAGS = [np.abs(heavy(jax.random.key(i), s)) for i, s in enumerate([(3, 20_000), (1, 50_000), (2, 9_000)])]
KS = [200, 500, 90]


def _chosen_per_row(index):
    index = np.asarray(index)
    rows, start = [], 0
    for m in MAGS:
        for r in range(m.shape[0]):
            lo = start + r * m.shape[1]
            rows.append(set((index[(index >= lo) & (index < lo + m.shape[1])] - lo).tolist()))
        start += m.size
    return rows


def _true_top_k():
    return [set(np.argsort(-row)[:k].tolist()) for m, k in zip(MAGS, KS) for row in m]


def test_exact_selection_is_each_rows_top_k():
    index, n, _ = jax.jit(lambda m: select(m, KS, "exact", [], step=0, key=jax.random.key(0)))(MAGS)
    assert int(n) == sum(m.shape[0] * k for m, k in zip(MAGS, KS))
    assert np.all(np.diff(np.asarray(index)) > 0)
    assert _chosen_per_row(index) == _true_top_k()


@pytest.mark.parametrize("method", ["sampled", "reused"])
def test_estimated_selections_find_the_top_k(method):
    thresholds = [jnp.full(m.shape[0], -1.0) for m in MAGS]  # "reused": computed afresh at the first step
    run = jax.jit(lambda m, t, step: select(m, KS, method, t, step=step, key=jax.random.key(3)))
    _, _, thresholds = run(MAGS, thresholds, 0)
    drifted = [m * np.float32(1.05) for m in MAGS]  # the next step's magnitudes, a little larger
    index, n, _ = run(drifted, thresholds, 1)
    rows = _chosen_per_row(index)
    for got, want, k in zip(rows, _true_top_k(), [k for m, k in zip(MAGS, KS) for _ in range(m.shape[0])]):
        assert len(got) <= k and len(got & want) >= 0.95 * k, (len(got), len(got & want), k)


@pytest.mark.parametrize("method", ["exact", "sampled", "reused"])
def test_every_selection_takes_whole_rows_at_density_one(method):
    """k equal to a row's length (density 1): every nonzero entry is chosen, whatever a sample would estimate."""
    ks = [m.shape[1] for m in MAGS]
    thresholds = [jnp.full(m.shape[0], -1.0) for m in MAGS]
    index, n, _ = jax.jit(lambda m, t: select(m, ks, method, t, step=0, key=jax.random.key(5)))(MAGS, thresholds)
    nonzero = sum(int(np.count_nonzero(np.asarray(m))) for m in MAGS)
    assert int(n) == nonzero and len(set(np.asarray(index)[:int(n)].tolist())) == nonzero


# ----------------------------------------------------------------------------------------------- the exchanges
SHAPES = [(64, 512), (2, 64, 128), (64,)]  # a matrix, a stacked (per-layer) weight, a small dense vector
STACKED = [False, True, False]


@functools.cache
def _exchanger(cfg, mesh, shapes, specs, density=None):
    """The transform, its state shardings and one jitted exchange of per-rank gradients (compiled once per case)."""
    tx = sparse_allreduce(cfg, mesh, list(specs), STACKED, density=density)
    like = [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes]
    shardings = state_shardings(cfg, mesh, like, list(specs))
    init = jax.jit(lambda: tx.init(like), out_shardings=shardings)
    ranked = jax.tree.map(lambda x: P(cfg.axis) if x.ndim else P(), jax.eval_shape(init))
    manual = [P(cfg.axis)] * len(specs)  # the shard_map names only its manual axis; the arrays carry the rest

    def body(g, s):
        u, s = tx.update([x[0] for x in g], s)
        return [x[None] for x in u], s

    fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(manual, ranked), out_specs=(manual, ranked),
                               axis_names={cfg.axis}, check_vma=False))
    return init, fn, [P(cfg.axis, *s) for s in specs]


def _step(cfg, mesh, grads, state=None, specs=None, density=None):
    """One exchange of per-rank `grads` ((ranks, *shape) each): (per-rank updates, new state)."""
    specs = tuple(specs or [P()] * len(grads))
    init, fn, rank_specs = _exchanger(cfg, mesh, tuple(g.shape[1:] for g in grads), specs, density)
    grads = [jax.device_put(g, NamedSharding(mesh, s)) for g, s in zip(grads, rank_specs)]
    with jax.set_mesh(mesh):
        updates, state = fn(grads, init() if state is None else state)
    return [np.asarray(u) for u in updates], state


def _grads(seed, ranks=8, shapes=SHAPES):
    return [np.array(heavy(jax.random.key(seed * 10 + i), (ranks, *s))) for i, s in enumerate(shapes)]


def _check_conserved(grads, old_residual, updates, state):
    """Every rank applies the same update, and update + the ranks' residuals = the ranks' gradients + residuals (up
    to the float32 rounding of a sum of as many terms as ranks)."""
    new = [np.asarray(r, np.float64) for r in jax.tree.leaves(state.residual)]
    for g, r0, u, r in zip(grads, old_residual, updates, new):
        assert np.all(u == u[:1]), "the ranks disagree on the update"
        acc = g.astype(np.float64) + r0
        eps = 2 * len(acc) * np.finfo(np.float32).eps * np.abs(acc).max()
        np.testing.assert_allclose(u[0] + r.sum(0), acc.sum(0), rtol=0, atol=eps)
    return [np.asarray(g, np.float64) + r0 - r for g, r0, r in zip(grads, old_residual, new)]  # what each sent


@pytest.mark.slow
@pytest.mark.parametrize("exchange", ["allgather", "balanced"])
def test_exchange_sums_what_each_rank_sent_of_its_top_k(exchange):
    cfg = CompressionConfig(density=0.05, exchange=exchange, min_size=4096, value_dtype="float32",
                            gather_factor=16.0)  # the owners return every reduced entry: the update is the sum
    mesh = sharding.make_mesh("data=8")
    grads = _grads(0)
    updates, state = _step(cfg, mesh, grads)
    sent = _check_conserved(grads, [0.0] * 3, updates, state)
    for s, u in zip(sent, updates):
        np.testing.assert_allclose(u[0], s.sum(0), rtol=1e-6, atol=1e-6)
    # Each rank sent exactly its top 5% of every row of the two large leaves (per layer for the stacked one), and
    # the small leaf whole.
    for g, s, (rows, cols) in zip(grads[:2], sent[:2], [(1, 64 * 512), (2, 64 * 128)]):
        for rank in range(8):
            for gr, sr in zip(g[rank].reshape(rows, cols), s[rank].reshape(rows, cols)):
                k = int(np.ceil(0.05 * cols))
                assert set(np.flatnonzero(sr)) == set(np.argsort(-np.abs(gr))[:k])
    np.testing.assert_allclose(sent[2], grads[2], rtol=1e-6)
    # A second step adds the new gradients to what stayed behind.
    residual = [np.asarray(r, np.float64) for r in jax.tree.leaves(state.residual)]
    grads2 = _grads(1)
    updates2, state2 = _step(cfg, mesh, grads2, state)
    _check_conserved(grads2, residual, updates2, state2)


@pytest.mark.slow
@pytest.mark.parametrize("exchange, selection", [("allgather", "sampled"), ("balanced", "reused")])
def test_bfloat16_exchange_keeps_its_rounding_in_the_residual(exchange, selection):
    cfg = CompressionConfig(density=0.02, exchange=exchange, selection=selection, min_size=4096)
    mesh = sharding.make_mesh("data=8")
    state, residual = None, [0.0] * 3
    for seed in range(3):
        grads = _grads(seed)
        updates, state = _step(cfg, mesh, grads, state)
        _check_conserved(grads, residual, updates, state)
        residual = [np.asarray(r, np.float64) for r in jax.tree.leaves(state.residual)]
        assert all(np.any(u != 0) for u in updates)
    assert int(state.count) == 3


@pytest.mark.slow
def test_balanced_overflow_stays_in_the_residual_and_rebalancing_follows_the_entries():
    cfg = CompressionConfig(density=0.02, exchange="balanced", min_size=4096, send_slack=1.0, rebalance_every=1,
                            value_dtype="float32", gather_factor=16.0)
    mesh = sharding.make_mesh("data=8")
    n_sparse = 64 * 512 + 2 * 64 * 128

    def skewed(seed):  # the largest entries all in the first eighth of the sparse space
        g = _grads(seed)
        g[0][:, :8] *= 100.0  # rows 0-7 of the (64, 512) leaf: 4096 of its 32768 entries
        return g

    grads = skewed(0)
    updates, state = _step(cfg, mesh, grads)
    stats = np.asarray(state.stats).reshape(8, 4)  # selected, overflowed, reduced, sent back
    assert np.all(stats[:, 1] > 0), stats  # region 0 got more than its buffer holds
    sent = _check_conserved(grads, [0.0] * 3, updates, state)
    acc = grads[0][0].reshape(-1)
    top = np.argsort(-np.abs(acc))[:int(np.ceil(0.02 * acc.size))]
    unsent = top[sent[0][0].reshape(-1)[top] == 0]
    assert unsent.size == stats[0, 1]  # the overflow: top entries rank 0 selected and could not send ...
    residual = np.asarray(jax.tree.leaves(state.residual)[0])[0].reshape(-1)
    np.testing.assert_array_equal(residual[unsent], acc[unsent])  # ... are all still in its residual
    bounds = np.asarray(state.boundaries).reshape(8, 9)
    assert np.all(bounds == bounds[:1]) and bounds[0, 0] == 0 and bounds[0, -1] == n_sparse
    assert bounds[0, 1] < n_sparse // 8  # region 0 shrank to where the entries are
    residual = [np.asarray(r, np.float64) for r in jax.tree.leaves(state.residual)]
    grads2 = skewed(1)
    updates2, state2 = _step(cfg, mesh, grads2, state)
    _check_conserved(grads2, residual, updates2, state2)
    assert np.asarray(state2.stats).reshape(8, 4)[:, 1].sum() < stats[:, 1].sum()


@pytest.mark.slow
def test_momentum_correction_and_local_clipping():
    mesh = sharding.make_mesh("data=8")
    cfg = CompressionConfig(density=1.0, exchange="allgather", min_size=4096, value_dtype="float32", momentum=0.9)
    g1, g2 = _grads(0), _grads(1)
    u1, state = _step(cfg, mesh, g1)
    u2, state = _step(cfg, mesh, g2, state)
    # Sparse leaves (everything sent): momentum masked where sent, so the second update is the new gradient; the
    # small dense leaf keeps plain momentum.
    for i in range(2):
        np.testing.assert_allclose(u2[i][0], g2[i].sum(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(u2[2][0], (0.9 * g1[2] + g2[2]).sum(0), rtol=1e-5, atol=1e-5)
    sparse_cfg = cfg.replace(density=0.1)
    _, state = _step(sparse_cfg, mesh, g1)
    mom, res = np.asarray(jax.tree.leaves(state.momentum)[0]), np.asarray(jax.tree.leaves(state.residual)[0])
    assert np.all((mom == 0) | (mom == g1[0])) and np.mean(mom == 0) == pytest.approx(0.1, abs=0.01)
    np.testing.assert_array_equal(res, mom)  # unsent: v = u = g; sent: both cleared
    clip = CompressionConfig(density=1.0, exchange="allgather", min_size=4096, value_dtype="float32", clip_norm=1.0)
    u, _ = _step(clip, mesh, g1)
    norms = np.sqrt(sum((g.reshape(8, -1).astype(np.float64) ** 2).sum(1) for g in g1))
    scale = np.minimum(1.0, 1.0 / np.sqrt(8) / norms)
    for g, ui in zip(g1, u):
        np.testing.assert_allclose(ui[0], (g * scale.reshape(-1, *[1] * (g.ndim - 1))).sum(0), rtol=1e-5, atol=1e-6)


def test_a_warm_up_level_dearer_than_dense_runs_the_dense_all_reduce():
    """At density 0.25 over 8 ranks the all-gather would move more than a dense all-reduce: that level sends the
    gradient plus the residual whole and empties the residual; the target level stays sparse."""
    mesh = sharding.make_mesh("data=8")
    cfg = CompressionConfig(density=0.01, exchange="allgather", min_size=4096, warmup_steps=10)
    assert cfg.levels()[0] == (0, 0.25)
    _, state = _step(cfg, mesh, _grads(0))  # the target level: sparse, leaves a residual
    residual = [np.asarray(r, np.float64) for r in jax.tree.leaves(state.residual)]
    assert all(np.any(r != 0) for r in residual[:2])
    grads = _grads(1)
    updates, state = _step(cfg, mesh, grads, state, density=0.25)
    for u, g, r in zip(updates, grads, residual):
        np.testing.assert_allclose(u[0], (g + r).sum(0), rtol=1e-5, atol=1e-5)
    assert all(np.all(np.asarray(r) == 0) for r in jax.tree.leaves(state.residual))


@pytest.mark.slow
def test_exchange_works_on_each_devices_shards_of_tensor_and_pipeline():
    mesh = sharding.make_mesh("data=2,tensor=2,pipeline=2")
    specs = [P("tensor", None), P("pipeline", None, "tensor"), P()]
    cfg = CompressionConfig(density=0.05, exchange="balanced", min_size=1024, value_dtype="float32",
                            gather_factor=16.0)
    grads = _grads(0, ranks=2)
    updates, state = _step(cfg, mesh, grads, specs=specs)
    sent = _check_conserved(grads, [0.0] * 3, updates, state)
    for s, u in zip(sent, updates):
        np.testing.assert_allclose(u[0], s.sum(0), rtol=1e-6, atol=1e-6)
    # Selection is per device shard and per layer: each (tensor shard of a) layer row sends its own top 5%.
    stacked = sent[1][0]  # rank 0's (2, 64, 128): layer l on pipeline stage l, columns split over tensor
    for layer in range(2):
        for half in (stacked[layer, :, :64], stacked[layer, :, 64:]):
            assert np.count_nonzero(half) == int(np.ceil(0.05 * half.size))
    residual = state.residual[1]
    assert residual.sharding.spec == P("data", "pipeline", None, "tensor")


# ----------------------------------------------------------------------------------------------- the train step
CFG = BertConfig(vocab_size=200, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                 max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                 dtype="float32", kernels="xla")
TC = TrainConfig(batch_size=16, seq_len=16, steps=10, warmup_steps=1, lr=1e-3, dropout=0.0, dtype="float32",
                 kernels="xla")
BATCHES = [synthetic_batch(CFG.vocab_size, 16, 16, 3, seed=i) for i in range(4)]


@functools.cache
def _model():
    model = build_model(CFG, 0)
    return model, jax.device_get(Steps(model, make_optimizer(TC), TC).init_state(model, 0))


def _params_close(a, b, **tol):
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(jax.device_get(a)), jax.tree.leaves(b)):
        np.testing.assert_allclose(x, y, err_msg=jax.tree_util.keystr(path), **tol)


@pytest.mark.slow
def test_density_one_trains_as_the_dense_step_on_a_tensor_and_pipeline_mesh():
    """Everything sent in float32: the compressed step (per-rank gradients in a shard_map over data, the balanced
    exchange on each device's tensor and pipeline shards) gives the dense step's losses and parameters."""
    tc = dataclasses.replace(TC, microbatches=2)
    model, host = _model()
    mesh = sharding.make_mesh("data=2,tensor=2,pipeline=2")
    dense = Steps(model, make_optimizer(tc), tc, mesh)
    comp = CompressedSteps(model, make_optimizer(tc), tc, mesh,
                           CompressionConfig(density=1.0, value_dtype="float32", min_size=1024))
    a, b = dense.place(host), comp.place(jax.device_get(comp.init_state(model, 0)))
    for batch in BATCHES[:3]:
        a, ma = dense.train_step(a, dense.place_batch(batch))
        b, mb = comp.train_step(b, comp.place_batch(batch))
        for key in ("loss", "mlm_loss", "nsp_loss", "mlm_correct", "n_masked", "nsp_correct", "grad_norm", "lr"):
            np.testing.assert_allclose(float(mb[key]), float(ma[key]), rtol=1e-6, err_msg=key)
    _params_close(b.params, jax.device_get(a.params), rtol=1e-5, atol=1e-7)  # as tests/test_sharding.py's meshes
    assert not np.allclose(jax.device_get(b.params)["pooler"]["kernel"], host.params["pooler"]["kernel"])
    assert np.all(np.asarray(b.opt_state[0].stats)[..., 1] == 0)  # nothing overflowed
    # The state's shardings: the residual split over data (one entry per rank) and as its parameter over the rest.
    qkv = b.opt_state[0].residual["encoder"]["layers"]["attention"]["qkv_kernel"]
    assert qkv.shape == (2, *host.params["encoder"]["layers"]["attention"]["qkv_kernel"].shape)
    assert qkv.sharding.spec == P("data", *b.params["encoder"]["layers"]["attention"]["qkv_kernel"].sharding.spec)


SPARSE = CompressionConfig(density=0.1, min_size=1024, selection="reused", rebalance_every=1)


@functools.cache
def _sparse_steps():
    model, _ = _model()
    return CompressedSteps(model, make_optimizer(TC), TC, sharding.make_mesh("data=2", jax.devices()[:2]), SPARSE)


@pytest.mark.slow
def test_compressed_step_has_no_dense_all_reduce():
    steps = _sparse_steps()
    state = steps.place(jax.device_get(steps.init_state(_model()[0], 0)))
    hlo = steps.train_step.at(0).compile(state, steps.place_batch(BATCHES[0])).as_text()
    ops = [op for op in analyze(hlo).ops if op.cls == "collective"]
    kinds = {op.kind for op in ops}
    assert {"all-to-all", "all-gather"} <= kinds, kinds
    grad_bytes = 4 * sum(x.size for x in jax.tree.leaves(state.params))
    reduced = sum(nbytes(op.shape) for op in ops if op.kind == "all-reduce")
    assert reduced < 256, f"{reduced} bytes all-reduced: only the loss sums and counts should be"
    moved = sum(nbytes(op.shape) for op in ops)
    assert moved < 0.5 * grad_bytes


@pytest.mark.slow
def test_checkpoint_round_trip_gives_identical_next_steps(tmp_path):
    steps = _sparse_steps()
    state = steps.place(jax.device_get(steps.init_state(_model()[0], 0)))
    for batch in BATCHES[:2]:
        state, _ = steps.train_step(state, steps.place_batch(batch))
    ckpt = Checkpointer(tmp_path / "ckpt")
    ckpt.save(2, state, dict(step=2))
    like = steps.place(jax.device_get(steps.init_state(_model()[0], 0)))
    restored = ckpt.restore(2, like)
    ckpt.close()
    placed = jax.tree.leaves(jax.tree.map(lambda x, s: x.sharding == s, restored, steps.state_shardings))
    assert placed and all(placed)
    outs = []
    for s in (state, restored):
        for batch in BATCHES[2:]:
            s, m = steps.train_step(s, steps.place_batch(batch))
        outs.append((jax.device_get(s), float(m["loss"])))
    (a, la), (b, lb) = outs
    assert la == lb
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(x, y)
    assert np.any(np.asarray(a.opt_state[0].thresholds) > 0)  # the reused thresholds travelled too


@pytest.mark.slow
def test_frozen_variance_runs_dense_steps_then_compressed_ones_with_the_second_moment_fixed():
    """`compression_freeze_variance_after=2`: steps 1-2 all-reduce the dense gradient (the dense step's parameters,
    no residual), step 3 is compressed (a residual) and leaves Adam's second moment as step 2 left it."""
    tc = dataclasses.replace(TC, grad_compression="topk-balanced", density=0.1, compression_min_size=1024,
                             compression_freeze_variance_after=2, clip_norm=0.0)
    model, _ = _model()
    mesh = sharding.make_mesh("data=2", jax.devices()[:2])
    dense = Steps(model, make_optimizer(tc), tc, mesh)
    comp = CompressedSteps(model, make_optimizer(tc), tc, mesh, tc.compression_config())
    a = dense.place(jax.device_get(dense.init_state(model, 0)))
    b = comp.place(jax.device_get(comp.init_state(model, 0)))
    for batch in BATCHES[:2]:
        a, _ = dense.train_step(a, dense.place_batch(batch))
        b, _ = comp.train_step(b, comp.place_batch(batch))
    _params_close(b.params, jax.device_get(a.params), rtol=1e-5, atol=1e-7)
    assert all(np.all(np.asarray(r) == 0) for r in jax.tree.leaves(b.opt_state[0].residual))
    nu = jax.device_get(b.opt_state[1][1][0].nu)
    b, _ = comp.train_step(b, comp.place_batch(BATCHES[2]))
    assert any(np.any(np.asarray(r) != 0) for r in jax.tree.leaves(b.opt_state[0].residual))
    for x, y in zip(jax.tree.leaves(jax.device_get(b.opt_state[1][1][0].nu)), jax.tree.leaves(nu)):
        np.testing.assert_array_equal(x, y)
    assert int(b.opt_state[1][1][0].count) == 3


def test_pallas_kernels_inside_the_manual_data_axis_are_checked():
    """The kernels' batch_shard_map must leave the manual data axis alone; until it does, a clear error."""
    mesh = sharding.make_mesh("data=2", jax.devices()[:2])
    model = build_model(CFG.replace(kernels="pallas"), 0)
    tc = dataclasses.replace(TC, kernels="pallas")
    if kernels_run_inside_manual_data(mesh):
        CompressedSteps(model, make_optimizer(tc), tc, mesh, CompressionConfig())
    else:
        with pytest.raises(ValueError, match="kernels='pallas'.*batch_shard_map"):
            CompressedSteps(model, make_optimizer(tc), tc, mesh, CompressionConfig())
