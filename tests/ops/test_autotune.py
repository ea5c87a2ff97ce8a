"""The autotuner and its cache (pallas_kernels/autotune.py): what it keeps, what it reads back and ignores, the
implementations it times, and the kernels' use of it per shard."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels.bias_dropout_residual_layernorm as bdrln
import pallas_kernels.bias_gelu as bias_gelu
from pallas_kernels import autotune, registry, timing
from pallas_kernels.attention import blocks as attention_blocks
from pallas_kernels.attention import flash_attention, flash_attention_qkv
from pallas_kernels.registry import Choice, Device, Implementation


@dataclasses.dataclass(frozen=True)
class Blocks:
    rows: int = 4
    warps: int = 4


@dataclasses.dataclass(frozen=True)
class OtherBlocks:  # another implementation's block sizes
    rows: int = 4


class _Impl(Implementation):
    def __init__(self, name):
        self.name = name


A, B = _Impl("a"), _Impl("b")


def _a(**kw):
    return Choice(A, Blocks(**kw))


def _b(**kw):
    return Choice(B, OtherBlocks(**kw))


def _bench(times, wrong=(), broken=(), calls=None):
    """make_bench for `autotune.choose`: `times[choice]` seconds per step, `wrong` candidates give other outputs,
    `broken` ones raise (as a candidate that does not compile)."""
    def make():
        if calls is not None:
            calls.append(1)

        def step(choice):
            if choice in broken:
                raise RuntimeError("does not compile")
            return choice

        def outputs(choice):
            if choice in broken:
                raise RuntimeError("does not compile")
            return (jnp.full((3,), 2.0 if choice in wrong else 1.0),)
        return step, (), outputs
    return make


@pytest.fixture
def tune_env(monkeypatch, tmp_path):
    path = tmp_path / "cache" / "autotune.json"
    monkeypatch.setenv(autotune.ENV_CACHE, str(path))
    monkeypatch.setenv(autotune.ENV_MODE, "tune")
    # The GPU tests check the plumbing, not the clock's fidelity: no input copies for L2 rotation, so each candidate
    # compiles a short chain (with the 180 MB rotation three GPU tests outran a 330 s limit).
    monkeypatch.setattr(timing, "ROTATE_BYTES", 0)
    return path


def _fake_timer(monkeypatch, times):
    monkeypatch.setattr(autotune, "step_clock", lambda choice, args: lambda: times[choice])


def _key(**fields):
    return autotune.cache_key("op", Device.current(), **fields)


def test_tunes_the_fastest_valid_candidate_and_caches_it(tune_env, monkeypatch, capsys):
    d, fast, wrong, broken = _a(), _a(rows=8), _a(rows=16), _a(warps=8)
    times = {d: 3e-5, fast: 2e-5, wrong: 1e-5, broken: 1e-6, _a(rows=8, warps=2): 4e-5}
    _fake_timer(monkeypatch, times)
    stages = [lambda best: [_a(rows=r) for r in (4, 8, 16)] + [broken],
              lambda best: [Choice(best.impl, dataclasses.replace(best.config, warps=2))]]
    got = autotune.choose("op", dict(x=1), d, stages, _bench(times, wrong={wrong}, broken={broken}), interpret=False)
    # The wrong candidate (fastest but different outputs) and the broken one are skipped, with a line each.
    assert got == fast
    err = capsys.readouterr().err
    assert "relative error" in err and "does not compile" in err
    entry = json.loads(tune_env.read_text())[_key(x=1)]
    assert entry == {"impl": "a", "blocks": dataclasses.asdict(fast.config), "us": 20.0, "default_us": 30.0}

    # Read back from the cache without tuning again, in "cache" mode too; a different key is not a hit.
    calls = []
    assert autotune.choose("op", dict(x=1), d, stages, _bench(times, calls=calls), interpret=False) == fast
    monkeypatch.setenv(autotune.ENV_MODE, "cache")
    assert autotune.choose("op", dict(x=1), d, stages, _bench(times, calls=calls), interpret=False) == fast
    assert autotune.choose("op", dict(x=2), d, stages, _bench(times, calls=calls), interpret=False) == d
    assert calls == []
    # "off" ignores the cache; interpret mode never reads or tunes.
    monkeypatch.setenv(autotune.ENV_MODE, "0")
    assert autotune.choose("op", dict(x=1), d, stages, _bench(times, calls=calls), interpret=False) == d
    monkeypatch.setenv(autotune.ENV_MODE, "tune")
    assert autotune.choose("op", dict(x=1), d, stages, _bench(times, calls=calls), interpret=True) == d
    assert calls == []


def test_keeps_the_default_when_nothing_beats_it(tune_env, monkeypatch):
    d = _a()
    times = {d: 3e-5, _a(rows=8): 4e-5}
    _fake_timer(monkeypatch, times)
    assert autotune.choose("op", {}, d, [lambda best: [_a(rows=8)]], _bench(times), interpret=False) == d
    assert json.loads(tune_env.read_text())[_key()]["blocks"] == dataclasses.asdict(d.config)


def test_a_winner_is_confirmed_by_retiming(tune_env, monkeypatch, capsys):
    """The winner and the default are timed again, alternately; a win that does not repeat keeps the default."""
    d, lucky = _a(), _a(rows=8)
    seen = {d: [], lucky: []}
    first = {d: 5e-5, lucky: 3e-5}  # the candidate's first timing is a fluke: 5e-5 like the default's afterwards
    compiled = []

    def clock(choice, args):  # one compile per configuration; each call of what it returns is one timing
        compiled.append(choice)

        def timing_():
            seen[choice].append(1)
            return first[choice] if len(seen[choice]) == 1 else 5e-5
        return timing_

    monkeypatch.setattr(autotune, "step_clock", clock)
    assert autotune.choose("op", {}, d, [lambda best: [lucky]], _bench({}), interpret=False) == d
    assert "not confirmed" in capsys.readouterr().err and len(seen[d]) == 3 and len(seen[lucky]) == 3
    assert compiled == [d, lucky]  # the re-timing reuses both configurations' compiled chains
    # A real win repeats and is kept.
    _fake_timer(monkeypatch, {d: 5e-5, lucky: 3e-5})
    assert autotune.choose("op", {"x": 1}, d, [lambda best: [lucky]], _bench({}), interpret=False) == lucky
    assert "confirmed" in capsys.readouterr().err


def test_chooses_another_implementation_and_reads_it_back(tune_env, monkeypatch, capsys):
    """An alternative (another implementation's default) wins, its own candidates follow, and the cache names it:
    read back as that implementation, and ignored where it is not among those that run here."""
    d, alt, alt_fast = _a(), _b(), _b(rows=8)
    times = {d: 5e-5, alt: 3e-5, alt_fast: 2e-5, _a(rows=8): 4e-5}
    _fake_timer(monkeypatch, times)
    stages = [lambda best: [alt], lambda best: [_b(rows=8)] if best.impl is B else [_a(rows=8)]]
    got = autotune.choose("op", {}, d, stages, _bench(times), interpret=False, alternatives=[alt])
    assert got == alt_fast and got.impl is B
    entry = json.loads(tune_env.read_text())[_key()]
    assert entry["impl"] == "b" and entry["blocks"] == {"rows": 8}
    monkeypatch.setenv(autotune.ENV_MODE, "cache")
    assert autotune.choose("op", {}, d, stages, _bench(times), interpret=False, alternatives=[alt]) == alt_fast
    assert autotune.choose("op", {}, d, stages, _bench(times), interpret=False) == d  # e.g. no Mosaic GPU here
    assert "ignoring the cached entry" in capsys.readouterr().err


def test_small_kernels_are_not_tuned(tune_env, monkeypatch, capsys):
    """Under MIN_TUNE_US with the default blocks, no candidate is tried (a few us to gain, within the noise)."""
    d, fast = _a(), _a(rows=8)
    _fake_timer(monkeypatch, {d: 1e-5, fast: 1e-6})
    assert autotune.choose("op", {}, d, [lambda best: [fast]], _bench({}), interpret=False) == d
    assert "not tuned" in capsys.readouterr().err
    assert json.loads(tune_env.read_text())[_key()]["blocks"] == dataclasses.asdict(d.config)


@pytest.mark.parametrize("entry", [
    {"blocks": {"rows": 2, "warps": 4}},  # no implementation named
    {"impl": "a", "blocks": {"rows": 2}},  # a field missing
    {"impl": "a", "blocks": {"rows": 2, "warps": 4, "gone": 1}},  # a field this code does not have
    {"impl": "c", "blocks": {"rows": 2, "warps": 4}},  # an implementation that does not run here
    {"impl": "a", "blocks": None},
])
def test_an_entry_that_does_not_parse_is_ignored(entry, tune_env, monkeypatch, capsys):
    tune_env.parent.mkdir(parents=True)
    tune_env.write_text(json.dumps({_key(): entry}))
    monkeypatch.setenv(autotune.ENV_MODE, "cache")
    assert autotune.choose("op", {}, _a(), [], _bench({}), interpret=False) == _a()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ignoring the cached entry" in err


def test_corrupt_cache_and_bad_mode(tune_env, monkeypatch, capsys):
    tune_env.parent.mkdir(parents=True)
    tune_env.write_text("{not json")
    monkeypatch.setenv(autotune.ENV_MODE, "cache")
    assert autotune.choose("op", {}, _a(), [], _bench({}), interpret=False) == _a()
    assert "ignoring the cache" in capsys.readouterr().err
    tune_env.write_text(json.dumps({_key(): {"impl": "a", "blocks": {"rows": 2, "warps": 4}}}))
    assert autotune.choose("op", {}, _a(), [], _bench({}), interpret=False) == _a(rows=2)
    monkeypatch.setenv(autotune.ENV_MODE, "fast")
    with pytest.raises(ValueError, match="JAXFORMER_AUTOTUNE='fast'"):
        autotune.choose("op", {}, _a(), [], _bench({}), interpret=False)


def test_tuned_times_the_implementations_that_run_then_the_winners_candidates(monkeypatch):
    """`tuned` hands `choose` the other implementations that can run the call (here Mosaic GPU, skipped by a "slower"
    rule on the H100) as its first stage, then the winner's forward and backward candidates."""
    seen = {}

    def choose(op, fields, default, stages, make_bench, *, interpret, alternatives=(), device=None):
        seen.update(op=op, fields=fields, default=default, alternatives=alternatives)
        seen["stages"] = [stage(alternatives[0] if alternatives else default) for stage in stages]
        return default

    monkeypatch.setattr(autotune, "choose", choose)
    call = bdrln.Call(32768, 1024, "bfloat16", "bfloat16", 0.1)
    h100 = Device.named("h100")
    first = registry.choose("bias_dropout_residual_layernorm", call, h100, log_skips=False)
    assert first.impl.name == "triton"
    autotune.tuned("bias_dropout_residual_layernorm", call, h100, first, None, [], interpret=False)
    mosaic = bdrln.impls.MOSAIC
    assert seen["fields"] == dataclasses.asdict(call)
    assert [c.impl.name for c in seen["alternatives"]] == ["mosaic"]
    assert seen["stages"][0] == seen["alternatives"]
    assert seen["stages"][1] == [Choice(mosaic, c) for c in bdrln.kernel_mgpu.candidate_blocks(
        seen["alternatives"][0].config, stage="fwd")]
    assert len(seen["stages"][2]) > 0
    # A named implementation is tuned alone; an XLA implementation is not tuned.
    autotune.tuned("bias_dropout_residual_layernorm", call, h100, first, None, [], interpret=False, named=True)
    assert seen["alternatives"] == [] and seen["stages"][0] == [
        Choice(bdrln.impls.TRITON, c) for c in bdrln.kernel.candidate_blocks(first.config, stage="fwd")]
    seen.clear()
    xla = registry.choose("bias_dropout_residual_layernorm", call, h100, impl="xla")
    assert autotune.tuned("bias_dropout_residual_layernorm", call, h100, xla, None, [], interpret=False) is xla
    assert seen == {}
    monkeypatch.undo()  # the real `choose`: interpret mode keeps the registry's choice
    assert autotune.tuned("bias_dropout_residual_layernorm", call, h100, first, None, [], interpret=True) == first


@pytest.mark.parametrize(("s", "h"), [(128, 64), (512, 64), (256, 128), (64, 32)])
def test_attention_candidates_fit_the_shapes(s, h):
    q = jax.ShapeDtypeStruct((2, s, 4, h), jnp.bfloat16)
    mask = jax.ShapeDtypeStruct((2, s), bool)
    d = attention_blocks.default_blocks(s, h)
    for stage in ("fwd", "bwd"):
        cands = attention_blocks.candidate_blocks(d, s, h, stage=stage)
        assert len(set(cands)) >= 4
        for c in cands:
            attention_blocks.check_inputs(q, q, q, mask, c)
    assert any(c.fused_bwd for c in attention_blocks.candidate_blocks(d, s, h, stage="bwd")) == (s <= 128)


def test_flash_attention_tunes_nothing_in_interpret_mode(tune_env):
    q = jax.random.normal(jax.random.key(0), (1, 32, 2, 16))
    out = flash_attention(q, q, q, jnp.ones((1, 32), bool), interpret=True)
    assert out.shape == q.shape and not tune_env.exists()


# --- the row-wise kernels (BDRLN / layernorm, bias+GELU) ----------------------------------------------------------

def _bdrln_args(rows, d, dtype=jnp.float32):
    k = jax.random.split(jax.random.key(rows + d), 5)
    x, res = (jax.random.normal(k[i], (rows, d), jnp.float32).astype(dtype) for i in (0, 1))
    bias, shift = (jax.random.normal(k[i], (d,)) for i in (2, 3))
    return x, bias, res, 1 + 0.2 * jax.random.normal(k[4], (d,)), shift


def _outs(f, args):
    """f's output and its gradients for a fixed random cotangent."""
    y, vjp = jax.vjp(f, *args)
    return [y, *vjp(jax.random.normal(jax.random.key(3), y.shape, y.dtype))]


def _max_err(outs, refs):
    return max(float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b)) for a, b in zip(outs, refs))


@pytest.mark.slow
@pytest.mark.parametrize("op", ["bdrln", "bias_gelu"])
def test_row_candidates_compute_the_reference(op):
    """Every forward tile and backward chunking the tuner may pick gives the reference's result (interpret mode:
    the pipeline stages change nothing there, so one per chunking); rows not a multiple of any block."""
    if op == "bdrln":
        module, args = bdrln.kernel, _bdrln_args(40, 96)
        kw = dict(seed=jnp.array([5, 6], jnp.uint32), rate=0.3, eps=1e-12)
        ref = lambda *a: bdrln.reference.bias_dropout_residual_layernorm(*a, **kw)  # noqa: E731
        run = lambda c: lambda *a: bdrln.bias_dropout_residual_layernorm(  # noqa: E731
            *a, **kw, interpret=True, blocks=c)
    else:
        module = bias_gelu.kernel
        args = (jax.random.normal(jax.random.key(1), (40, 96)), jax.random.normal(jax.random.key(2), (96,)))
        kw = dict(seed=jnp.array([5, 6], jnp.uint32), rate=0.3)
        ref = lambda *a: bias_gelu.reference.bias_gelu(*a, **kw)  # noqa: E731
        run = lambda c: lambda *a: bias_gelu.bias_gelu(*a, **kw, interpret=True, blocks=c, impl="triton")  # noqa
    default = module.default_blocks(40, 96)
    fwd = module.candidate_blocks(default, stage="fwd")
    bwd = [c for c in module.candidate_blocks(default, stage="bwd") if c.bwd_num_stages == 1]
    assert len(set(fwd)) == 5 and len(set(bwd)) == 5
    want = _outs(ref, args)
    for c in fwd + bwd:
        assert _max_err(_outs(run(c), args), want) < 2e-5, c


@pytest.mark.parametrize("op", ["bdrln", "layer_norm", "bias_gelu"])
def test_row_kernels_ask_the_autotuner_per_shard(op, monkeypatch):
    """Without `blocks`, the operator runs the autotuner's choice for the shard's call (here a candidate it returns,
    under a 2-way data mesh) in the forward and the backward: the key names the per-shard rows; the result is
    unchanged."""
    asked, used = [], []

    def choose(op_, fields, default, stages, make_bench, *, interpret, alternatives=(), device=None):
        asked.append((op_, fields))
        return stages[1](stages[0](default)[1])[-1]  # some candidate: 2-row forward tiles, a deep backward

    monkeypatch.setattr(autotune, "choose", choose)
    module = bias_gelu.kernel if op == "bias_gelu" else bdrln.kernel
    for name in ("forward", "backward"):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, real=real, name=name, **kw: (
            used.append((name, kw["blocks"])), real(*a, **kw))[1])
    x, bias, res, scale, shift = _bdrln_args(32, 96)
    seed = jnp.array([5, 6], jnp.uint32)
    if op == "bdrln":
        kw = dict(seed=seed, rate=0.3, eps=1e-12)
        fn = lambda x, res, scale: bdrln.bias_dropout_residual_layernorm(x, bias, res, scale, shift, **kw)  # noqa
        ref = lambda x, res, scale: bdrln.reference.bias_dropout_residual_layernorm(  # noqa: E731
            x, bias, res, scale, shift, **kw)
    elif op == "layer_norm":
        fn = lambda x, res, scale: bdrln.layer_norm(x + res, scale, shift, eps=1e-12)  # noqa: E731
        ref = lambda x, res, scale: bdrln.reference.layer_norm(x + res, scale, shift, eps=1e-12)  # noqa: E731
    else:
        fn = lambda x, res, scale: bias_gelu.bias_gelu(x * scale, res[0], seed=seed, rate=0.3)  # noqa: E731
        ref = lambda x, res, scale: bias_gelu.reference.bias_gelu(x * scale, res[0], seed=seed, rate=0.3)  # noqa
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("data",))  # the trainer's kind of mesh
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    want = _outs(ref, (x, res, scale))
    with jax.set_mesh(mesh):
        got = _outs(jax.jit(fn), (jax.device_put(x, sharding), jax.device_put(res, sharding), scale))
    assert _max_err(got, want) < 2e-5
    name = {"bdrln": "bias_dropout_residual_layernorm"}.get(op, op)
    assert {a[0] for a in asked} == {name}
    assert all(fields["rows"] == 16 for _, fields in asked)
    assert {n for n, _ in used} == {"forward", "backward"}
    assert all(b.block_rows == 2 and b.bwd_num_stages == 3 for _, b in used)


# --- tuned for real on a GPU (skipped without one) ---------------------------------------------------------------

@pytest.mark.gpu
def test_flash_attention_tunes_and_reads_the_cache_on_gpu(tune_env, monkeypatch):
    qkv = jax.random.normal(jax.random.key(1), (4, 128, 3, 4, 64), jnp.float32).astype(jnp.bfloat16)
    mask = jnp.arange(128)[None, :] < jnp.array([[128], [100], [64], [5]])
    seed = jnp.array([3, 4], jnp.uint32)

    def run(blocks=None, impl=None):
        f = lambda x: flash_attention_qkv(x, mask, seed=seed, rate=0.1, blocks=blocks, impl=impl)  # noqa: E731
        y, vjp = jax.vjp(f, qkv)
        return y, vjp(y)[0]

    tuned = jax.jit(run)()  # tuned while the jit traces
    entries = json.loads(tune_env.read_text())
    (key,) = entries
    assert key.startswith("attention_qkv|") and "packed=True" in key and entries[key]["us"] > 0
    default = jax.jit(lambda: run(attention_blocks.default_blocks(128, 64), "triton"))()
    for got, want in zip(tuned, default):
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), atol=2e-2, rtol=2e-2)
    # A second trace reads the cache: no tuning.
    monkeypatch.setattr(autotune, "_tune", lambda *a: pytest.fail("tuned again"))
    jax.jit(lambda: run())()
    assert json.loads(tune_env.read_text()) == entries
    print("tuned:", entries[key])


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["bdrln", "bias_gelu"])
def test_row_kernels_tune_and_read_the_cache_on_gpu(op, tune_env, monkeypatch):
    """Tuned for real inside a jit (two candidates per stage, to keep it short), the same result as the registry's
    default, the choice cached; a second trace reads it."""
    if op == "bdrln":
        name, args = "bias_dropout_residual_layernorm", _bdrln_args(4096, 1024, jnp.bfloat16)
        kw = dict(seed=jnp.array([5, 6], jnp.uint32), rate=0.1, eps=1e-12)
        fn = lambda blocks, impl: lambda *a: bdrln.bias_dropout_residual_layernorm(  # noqa: E731
            *a, **kw, blocks=blocks, impl=impl)
        call = bdrln.Call(4096, 1024, "bfloat16", "bfloat16", 0.1)
    else:
        name = "bias_gelu"
        args = (jax.random.normal(jax.random.key(1), (4096, 3072), jnp.bfloat16),
                jax.random.normal(jax.random.key(2), (3072,)))
        fn = lambda blocks, impl: lambda *a: bias_gelu.bias_gelu(  # noqa: E731
            *a, seed=jnp.array([5, 6], jnp.uint32), rate=0.1, blocks=blocks, impl=impl)
        call = bias_gelu.Call(4096, 3072, "bfloat16", 0.1)
    default = registry.choose(name, call, log_skips=False)
    for impl in registry.operator(name).implementations:  # the other implementations' defaults, then the winner's
        few = impl.candidates
        monkeypatch.setattr(impl, "candidates", lambda *a, few=few, **k: few(*a, **k)[:2])
    tuned = jax.jit(lambda a: _outs(fn(None, None), a))(args)
    entries = json.loads(tune_env.read_text())
    (key,) = entries
    assert key.startswith(name + "|") and "rows=4096" in key and entries[key]["us"] > 0
    want = _outs(fn(default.config, default.impl.name), args)
    for got, w in zip(tuned, want):
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(w, np.float32), atol=2e-2, rtol=2e-2)
    monkeypatch.setattr(autotune, "_tune", lambda *a: pytest.fail("tuned again"))
    jax.jit(lambda a: _outs(fn(None, None), a))(args)
    assert json.loads(tune_env.read_text()) == entries
    print("tuned:", entries[key])
