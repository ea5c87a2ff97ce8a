"""Data, FSDP and tensor parallelism on jax.sharding meshes (8 virtual CPU devices, tests/conftest.py).

Each mesh's train step is compiled once (`_compiled`) and shared by the equivalence, HLO and checkpoint tests.
"""

import functools
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import train as cli
from jaxformer import sharding
from jaxformer.config import BertConfig, MeshConfig, TrainConfig
from jaxformer.data import synthetic_batch
from jaxformer.hlo_analysis import analyze, shapes
from jaxformer.outputs import Checkpointer
from jaxformer.steps import Steps, build_model, make_optimizer

CFG = BertConfig(vocab_size=200, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                 max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                 dtype="float32", kernels="xla")
TC = TrainConfig(batch_size=16, seq_len=16, steps=10, warmup_steps=1, lr=1e-3, dropout=0.0, dtype="float32",
                 kernels="xla")
B, S, NP = 16, 16, 3  # batch, sequence, masked positions
BATCHES = [synthetic_batch(CFG.vocab_size, B, S, NP, seed=i) for i in range(3)]


def _model(cfg=CFG):
    return _model_cached(cfg)


@functools.cache  # keyed on the arguments as passed: the wrappers make _model() and _model(CFG) one entry
def _model_cached(cfg):
    model = build_model(cfg, 0)
    return model, jax.device_get(Steps(model, make_optimizer(TC), TC).init_state(model, 0))  # host copy


def _compiled(spec: str, n_devices: int = 8, cfg=CFG):
    return _compiled_cached(spec, n_devices, cfg)


@functools.cache
def _compiled_cached(spec, n_devices, cfg):
    """(steps, compiled train step) of `cfg` on the mesh `spec` over the first `n_devices` devices."""
    model, host_state = _model(cfg)
    mesh = sharding.make_mesh(spec, jax.devices()[:n_devices])
    steps = Steps(model, make_optimizer(TC), TC, mesh)
    return steps, steps.train_step.compile(steps.place(host_state), steps.place_batch(BATCHES[0]))


def _run(spec, n_devices=8, batches=BATCHES[:2], state=None):
    steps, step = _compiled(spec, n_devices)
    state = steps.place(_model()[1] if state is None else state)
    losses = []
    for b in batches:
        state, m = step(state, steps.place_batch(b))
        losses.append(float(m["loss"]))
    return np.array(losses), state


@functools.cache
def _reference():
    losses, state = _run("data=1", 1)
    return losses, jax.device_get(state)


def _assert_state_close(state, ref):
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(jax.device_get(state.params)),
                            jax.tree.leaves(ref.params)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7, err_msg=jax.tree_util.keystr(path))


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["data=8", "fsdp=8", "data=2,tensor=4", "fsdp=2,tensor=4"])
def test_meshes_match_one_device(spec):
    ref_losses, ref_state = _reference()
    losses, state = _run(spec)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    assert losses[1] != losses[0]  # the update happened
    _assert_state_close(state, ref_state)
    # Nothing silently replicated: the state comes back with the rules' shardings, optimizer moments included.
    steps, _ = _compiled(spec)
    m = MeshConfig.parse(spec)
    qkv = state.params["encoder"]["layers"]["attention"]["qkv_kernel"]  # L D C N H
    assert qkv.sharding.spec == P(None, "fsdp" if m.fsdp > 1 else None, None, "tensor" if m.tensor > 1 else None,
                                  None)
    mu = state.opt_state[1][0].mu["encoder"]["layers"]["attention"]["qkv_kernel"]
    assert mu.sharding == qkv.sharding
    word = state.params["embeddings"]["word"]  # V D: padded to 256 rows
    assert word.shape == (CFG.padded_vocab_size, 64) == (256, 64)
    assert word.sharding.spec == P("tensor" if m.tensor > 1 else None, "fsdp" if m.fsdp > 1 else None)


def _assert_steps_match_one_device(steps, host_state):
    """Two train steps of `steps` (built on some mesh) give the losses and parameters of one device."""
    state, losses = steps.place(host_state), []
    for b in BATCHES[:2]:
        state, m = steps.train_step(state, steps.place_batch(b))
        losses.append(float(m["loss"]))
    ref_losses, ref_state = _reference()
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    _assert_state_close(state, ref_state)


@pytest.mark.slow
def test_trainer_pipeline_mesh_matches_one_device():
    """The trainer's steps on `fsdp=2,tensor=2,pipeline=2` with 2 microbatches (the encoder runs through
    jaxformer/pipeline.py: Steps builds the schedule from the mesh and the flags) equal one device."""
    import dataclasses
    tc = dataclasses.replace(TC, microbatches=2)
    model, host_state = _model()
    steps = Steps(model, make_optimizer(tc), tc, sharding.make_mesh("fsdp=2,tensor=2,pipeline=2"))
    assert steps.pipeline is not None and (steps.pipeline.stages, steps.pipeline.microbatches) == (2, 2)
    _assert_steps_match_one_device(steps, host_state)
    with pytest.raises(ValueError, match="microbatches=1 must be >= stages=2"):
        sharding.validate("data=4,pipeline=2", CFG.replace(num_hidden_layers=4),
                          dataclasses.replace(TC, pipeline_repeats=2), 8)


def test_sequence_parallel_matches_one_device_and_reduce_scatters():
    """--sequence-parallel on data=2,tensor=4: same losses and parameters as one device, and the residual stream
    between blocks really is split on S: S is gathered again before each column-parallel projection (all-gathers
    that the plain tensor-parallel step does not have). On the CPU XLA leaves the row-parallel reductions as
    all-reduces (its GPU pipeline forms reduce-scatters from all-reduce + slice): not asserted here."""
    import dataclasses
    tc = dataclasses.replace(TC, sequence_parallel=True)
    model, host_state = _model()
    steps = Steps(model, make_optimizer(tc), tc, sharding.make_mesh("data=2,tensor=4"))
    _assert_steps_match_one_device(steps, host_state)
    text = steps.train_step.compile(steps.place(host_state), steps.place_batch(BATCHES[0])).as_text()
    with_sp = analyze(text).collectives()
    without = _collectives("data=2,tensor=4")[0]
    assert with_sp["all-gather"]["count"] >= without["all-gather"]["count"] + 2 * CFG.num_hidden_layers
    with pytest.raises(ValueError, match="seq_len=18 is not divisible by tensor=4"):
        sharding.validate("data=2,tensor=4", CFG, dataclasses.replace(tc, seq_len=18), 8)
    with pytest.raises(ValueError, match="kernels='pallas' with sequence_parallel"):
        sharding.validate("data=2,tensor=4", CFG, dataclasses.replace(tc, kernels="pallas"), 8)


def _collectives(spec, cfg=CFG):
    rep = analyze(_compiled(spec, 8, cfg)[1].as_text())
    return rep.collectives(), [op for op in rep.ops if op.cls == "collective"]


def _weight_shapes(cfg):
    """Full shapes of every parameter, stacked ([L, ...]) and per layer."""
    out = set()
    for leaf in jax.tree.leaves(_model(cfg)[1].params):
        out.add(tuple(leaf.shape))
        out.add(tuple(leaf.shape[1:]))
    return out


def _result_dims(op):
    return [dims for _, dims in shapes(op.shape)]


def test_data_parallel_all_reduces_gradients_and_gathers_no_weights():
    counts, _ = _collectives("data=8")
    assert counts["all-reduce"]["count"] > 0
    assert counts["all-gather"]["count"] == 0 and counts["reduce-scatter"]["count"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("scan", [False, True], ids=["loop", "scan"])
def test_fsdp_gathers_each_layer_and_reduces_gradients(scan):
    counts, ops = _collectives("fsdp=8", CFG.replace(scan_layers=scan))
    gathers = [(tuple(d), op.trips) for op in ops if op.kind == "all-gather" for d in _result_dims(op)]
    # ZeRO-3: each layer's weights are gathered for that layer (inside the scan: 2 trips of one gather; in the loop:
    # one gather per layer), never the whole (L, ...) stack at once.
    d, n, h, f = 64, 4, 16, 128
    for per_layer in [(d, 3, n, h), (n, h, d), (d, f), (f, d)]:
        trips = [t for dims, t in gathers if dims == per_layer]
        assert (2 in trips) if scan else len(trips) >= 2, (per_layer, trips)
        assert (2, *per_layer) not in {dims for dims, _ in gathers}
    assert counts["reduce-scatter"]["count"] + counts["all-reduce"]["count"] > 0


TP_CFG = CFG.replace(hidden_size=128, num_attention_heads=8, intermediate_size=256)


@pytest.mark.slow
def test_tensor_parallel_gathers_no_weight_and_no_logits():
    counts, ops = _collectives("tensor=8", TP_CFG)
    weights = {s for s in _weight_shapes(TP_CFG) if len(s) >= 2}
    for op in ops:
        if op.kind == "all-gather":
            for dims in _result_dims(op):
                assert tuple(dims) not in weights, f"a weight is gathered: {op.shape}"
                # vocabulary-parallel cross-entropy: the B*P*V logits (or their gradient) are never gathered
                assert int(np.prod(dims)) < B * NP * TP_CFG.padded_vocab_size, f"logits gathered: {op.shape}"
    # Megatron: the row-parallel projections end in all-reduces of B S D activations.
    reduced = [dims for op in ops if op.kind == "all-reduce" for dims in _result_dims(op)]
    assert (B, S, 128) in reduced
    assert counts["all-reduce"]["count"] >= 2


@pytest.mark.slow
def test_checkpoint_restores_onto_another_mesh(tmp_path):
    _, state = _run("data=8", batches=BATCHES[:1])
    ckpt = Checkpointer(tmp_path / "ckpt")
    ckpt.save(1, state, dict(step=1))
    host = jax.device_get(state)
    continued, a = _run("data=8", batches=BATCHES[1:], state=host)
    steps, _ = _compiled("data=4,tensor=2")
    restored = ckpt.restore(1, steps.place(_model()[1]))  # the target shardings come from the new mesh
    ckpt.close()
    placed = jax.tree.leaves(jax.tree.map(lambda x, s: x.sharding == s, restored, steps.state_shardings))
    assert placed and all(placed)
    resumed, b = _run("data=4,tensor=2", batches=BATCHES[1:], state=restored)
    np.testing.assert_allclose(resumed, continued, rtol=1e-5)
    _assert_state_close(b, jax.device_get(a))


# ----------------------------------------------------------------------------------------------- validation
@pytest.mark.parametrize("text, named", [
    ("data=2,model=4", "'model'"), ("data=two", "'data=two'"), ("data=2,data=4", "'data' appears twice"),
    ("data=0", "data=0"), ("fsdp=-2", "fsdp=-2"), ("data=-1,fsdp=-1", "at most one"), ("data", "'data'"),
])
def test_mesh_syntax_errors_name_the_piece(text, named):
    with pytest.raises(ValueError, match=re.escape(named)):
        MeshConfig.parse(text)
    with pytest.raises(ValueError, match=re.escape(named)):
        TrainConfig(mesh=text)


def test_mesh_parse_and_resolve():
    assert MeshConfig.parse("data=2,tensor=2,pipeline=2") == MeshConfig(data=2, tensor=2, pipeline=2)
    assert MeshConfig.parse("tensor=2,data=-1").resolve(8) == MeshConfig(data=4, tensor=2)
    with pytest.raises(ValueError, match="3 devices .* 8 devices"):
        MeshConfig.parse("data=3").resolve(8)
    with pytest.raises(ValueError, match="microbatches=0"):
        TrainConfig(microbatches=0)
    with pytest.raises(ValueError, match="pipeline_repeats=-1"):
        TrainConfig(pipeline_repeats=-1)


@pytest.mark.parametrize("mesh, cfg, tc, named", [
    ("data=4", CFG, TC, "4 devices"),
    ("tensor=8", CFG, TC, "num_attention_heads=4 is not divisible by tensor=8"),
    ("tensor=8", CFG.replace(num_attention_heads=8, intermediate_size=100), TC,
     "intermediate_size=100 is not divisible by tensor=8"),
    ("fsdp=8", CFG.replace(hidden_size=36, num_attention_heads=2), TC, "hidden_size=36 is not divisible by fsdp=8"),
    ("data=2,pipeline=4", CFG, TC, "num_hidden_layers=2 is not divisible by pipeline * pipeline_repeats"),
    ("data=4,pipeline=2", CFG, TrainConfig(pipeline_repeats=2), "num_hidden_layers=2 is not divisible"),
    ("data=8", CFG, TrainConfig(batch_size=12), "batch_size=12 is not divisible by data * fsdp * microbatches"),
    ("data=2,fsdp=4", CFG, TrainConfig(batch_size=16, microbatches=4), "batch_size=16 is not divisible"),
])
def test_validate_names_field_and_value(mesh, cfg, tc, named):
    with pytest.raises(ValueError, match=re.escape(named)):
        sharding.validate(mesh, cfg, tc, n_devices=8)


def test_validate_padded_vocab_and_a_good_mesh():
    odd = CFG.replace(num_attention_heads=3, hidden_size=48, intermediate_size=96)  # 256 rows do not split 3 ways
    with pytest.raises(ValueError, match="tensor=3 does not divide the padded vocabulary"):
        sharding.validate("data=-1,tensor=3", odd, TrainConfig(batch_size=6), n_devices=6)
    assert sharding.validate("data=2,tensor=4", CFG, TC, n_devices=8) == MeshConfig(data=2, tensor=4)


def test_cli_bad_mesh_exits_2(tmp_path, capsys):
    assert cli.main(["--out", str(tmp_path / "run"), "--mesh", "data=3", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "data=3" in err and "8 devices" in err
    assert cli.main(["--out", str(tmp_path / "run"), "--mesh", "data=2,tensor=4", "--no-progress"]) == 2
    assert "num_attention_heads=2 is not divisible by tensor=4" in capsys.readouterr().err  # tiny has 2 heads


@pytest.mark.slow
def test_cli_tensor_parallel_matches_data_parallel(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXFORMER_CACHE_DIR", str(tmp_path / "cache"))
    rng = np.random.RandomState(0)
    words = "the cat dog bird sees likes a red blue small big house tree river walks runs over and".split()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join("\n".join(" ".join(rng.choice(words, 8)) + "." for _ in range(5))
                                  for _ in range(30)))
    common = ["--data", str(corpus), "--seq-len", "32", "--batch-size", "8", "--vocab-size", "64", "--steps", "2",
              "--log-every", "1", "--eval-every", "2", "--save-every", "2", "--eval-batches", "1",
              "--warmup-steps", "1", "--dropout", "0", "--dtype", "float32", "--kernels", "xla", "--data-workers", "0",
              "--no-progress"]
    losses, vocab = {}, []
    for mesh in ("data=8", "data=4,tensor=2"):  # tiny has 2 heads: tensor=2 is the most it takes
        out = tmp_path / mesh.replace(",", "_").replace("=", "")
        assert cli.main(common + ["--out", str(out), "--mesh", mesh] + vocab) == 0
        vocab = ["--vocab", str(out / "tokenizer.json")]  # the same tokenizer for both (training it is not exact)
        records = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
        losses[mesh] = [r["loss"] for r in records]
    np.testing.assert_allclose(losses["data=4,tensor=2"], losses["data=8"], rtol=1e-5)
    # --resume onto another mesh: the checkpoint of the data=8 run continues on data=4,tensor=2.
    out = tmp_path / "data8"
    assert cli.main(common + ["--out", str(out), "--resume", "--mesh", "data=4,tensor=2", "--steps", "3"]) == 0
    record = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r][-1]
    assert record["step"] == 3 and np.isfinite(record["loss"])


# ----------------------------------------------------------------------------------------------- kernels
@pytest.mark.slow
def test_flash_attention_splits_heads_over_tensor_with_the_unsharded_dropout_mask():
    from pallas_kernels.attention import attention, sharded_flash_attention
    from pallas_kernels.dropout import seed_from_key

    b, s, n, h = 2, 16, 4, 16
    kq, kk, kv, kd = jax.random.split(jax.random.key(0), 4)
    q, k, v, do = (jax.random.normal(key, (b, s, n, h), jnp.float32) for key in (kq, kk, kv, kd))
    mask = jnp.arange(s)[None, :] < jnp.array([[s], [s - 5]])  # the second example has padded keys
    seed = seed_from_key(jax.random.key(1))

    def loss(fn, q, k, v):
        out = fn(q, k, v, mask, seed=seed, rate=0.25)
        return jnp.sum(out * do), out

    mesh = sharding.make_mesh("data=2,tensor=4")
    spec = jax.sharding.NamedSharding(mesh, P("data", None, "tensor"))
    with jax.set_mesh(mesh):
        grad_fn = jax.jit(jax.grad(functools.partial(loss, sharded_flash_attention), argnums=(0, 1, 2), has_aux=True))
        grads, out = grad_fn(*(jax.device_put(x, spec) for x in (q, k, v)))
        hlo = jax.jit(functools.partial(loss, sharded_flash_attention)).lower(q, k, v).compile().as_text()
    ref_grads, ref_out = jax.grad(functools.partial(loss, attention), argnums=(0, 1, 2), has_aux=True)(q, k, v)
    np.testing.assert_allclose(out, ref_out, rtol=1e-5, atol=1e-5)
    for g, r in zip(grads, ref_grads):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)
    assert out.sharding.spec == P("data", None, "tensor")  # heads stay split: no gather around the kernel
    assert "all-gather" not in hlo


def test_hlo_report_compiles_under_a_mesh(capsys):
    from jaxformer import hlo_report
    common = ["--config", "tiny", "--seq-len", "16", "--batch-size", "8", "--dtype", "float32", "--forward-only"]
    assert hlo_report.main(common + ["--mesh", "data=2,tensor=4"]) == 2  # tiny has 2 heads
    assert "num_attention_heads=2 is not divisible by tensor=4" in capsys.readouterr().err
    assert hlo_report.main(common + ["--mesh", "data=4,tensor=2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["mesh"] == "data=4,tensor=2"
    assert report["collectives"]["all-reduce"]["count"] > 0  # the row-parallel projections' all-reduces


def test_bias_gelu_keeps_the_feed_forward_width_split_over_tensor():
    from pallas_kernels.bias_gelu import bias_gelu, reference

    kx, kb, kd = jax.random.split(jax.random.key(2), 3)
    x, dy = (jax.random.normal(key, (4, 8, 64), jnp.float32) for key in (kx, kd))
    bias = jax.random.normal(kb, (64,), jnp.float32)

    def loss(fn, x, bias):
        y = fn(x, bias)
        return jnp.sum(y * dy), y

    mesh = sharding.make_mesh("data=2,tensor=4")
    with jax.set_mesh(mesh):
        f = jax.jit(jax.grad(functools.partial(loss, bias_gelu), argnums=(0, 1), has_aux=True))
        xs = jax.device_put(x, jax.sharding.NamedSharding(mesh, P("data", None, "tensor")))
        bs = jax.device_put(bias, jax.sharding.NamedSharding(mesh, P("tensor")))
        (dx, dbias), y = f(xs, bs)
        hlo = f.lower(xs, bs).compile().as_text()
    (rdx, rdbias), ry = jax.grad(functools.partial(loss, reference.bias_gelu), argnums=(0, 1), has_aux=True)(x, bias)
    for a, b in ((y, ry), (dx, rdx), (dbias, rdbias)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert y.sharding.spec == P("data", None, "tensor") and "all-gather" not in hlo
