"""The block-size autotuner and its cache (pallas_kernels/autotune.py), and flash attention's use of it."""

import dataclasses
import itertools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels.bias_dropout_residual_layernorm as bdrln
import pallas_kernels.bias_gelu as bias_gelu
from pallas_kernels import autotune, timing
from pallas_kernels.attention import flash_attention, flash_attention_qkv, kernel


@dataclasses.dataclass(frozen=True)
class Blocks:
    rows: int = 4
    warps: int = 4


def _bench(times, wrong=(), broken=(), calls=None):
    """make_bench for `autotune.choose`: `times[blocks]` seconds per step, `wrong` candidates give other outputs,
    `broken` ones raise (as a candidate that does not compile)."""
    def make():
        if calls is not None:
            calls.append(1)

        def step(blocks):
            if blocks in broken:
                raise RuntimeError("does not compile")
            return blocks

        def outputs(blocks):
            if blocks in broken:
                raise RuntimeError("does not compile")
            return (jnp.full((3,), 2.0 if blocks in wrong else 1.0),)
        return step, (), outputs
    return make


@pytest.fixture
def tune_env(monkeypatch, tmp_path):
    path = tmp_path / "cache" / "autotune.json"
    monkeypatch.setenv(autotune.ENV_CACHE, str(path))
    monkeypatch.setenv(autotune.ENV_MODE, "tune")
    # The GPU tests check the plumbing, not the clock's fidelity: no input copies for L2 rotation, so each candidate
    # compiles a short chain (with the 180 MB rotation the three GPU tests outran a 330 s limit, session 9 run 9).
    monkeypatch.setattr(timing, "ROTATE_BYTES", 0)
    return path


def _fake_timer(monkeypatch, times):
    monkeypatch.setattr(autotune, "step_clock", lambda blocks, args: lambda: times[blocks])


def test_tunes_the_fastest_valid_candidate_and_caches_it(tune_env, monkeypatch, capsys):
    d, fast, wrong, broken = Blocks(), Blocks(rows=8), Blocks(rows=16), Blocks(warps=8)
    times = {d: 3e-5, fast: 2e-5, wrong: 1e-5, broken: 1e-6, Blocks(rows=8, warps=2): 4e-5}
    _fake_timer(monkeypatch, times)
    stages = [lambda best: [Blocks(rows=r) for r in (4, 8, 16)] + [broken],
              lambda best: [dataclasses.replace(best, warps=2)]]
    got = autotune.choose("op", dict(x=1), d, stages, _bench(times, wrong={wrong}, broken={broken}), interpret=False)
    # The wrong candidate (fastest but different outputs) and the broken one are skipped, with a line each.
    assert got == fast
    err = capsys.readouterr().err
    assert "relative error" in err and "does not compile" in err
    entry = json.loads(tune_env.read_text())[autotune.cache_key("op", x=1)]
    assert entry["blocks"] == dataclasses.asdict(fast) and entry["us"] == 20.0 and entry["default_us"] == 30.0

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
    d = Blocks()
    times = {d: 3e-5, Blocks(rows=8): 4e-5}
    _fake_timer(monkeypatch, times)
    assert autotune.choose("op", {}, d, [lambda best: [Blocks(rows=8)]], _bench(times), interpret=False) == d
    assert json.loads(tune_env.read_text())[autotune.cache_key("op")]["blocks"] == dataclasses.asdict(d)


def test_a_winner_is_confirmed_by_retiming(tune_env, monkeypatch, capsys):
    """The winner and the default are timed again, alternately; a win that does not repeat keeps the default."""
    d, lucky = Blocks(), Blocks(rows=8)
    seen = {d: [], lucky: []}
    first = {d: 5e-5, lucky: 3e-5}  # the candidate's first timing is a fluke: 5e-5 like the default's afterwards

    compiled = []

    def clock(blocks, args):  # one compile per configuration; each call of what it returns is one timing
        compiled.append(blocks)

        def timing():
            seen[blocks].append(1)
            return first[blocks] if len(seen[blocks]) == 1 else 5e-5
        return timing

    monkeypatch.setattr(autotune, "step_clock", clock)
    assert autotune.choose("op", {}, d, [lambda best: [lucky]], _bench({}), interpret=False) == d
    assert "not confirmed" in capsys.readouterr().err and len(seen[d]) == 3 and len(seen[lucky]) == 3
    assert compiled == [d, lucky]  # the re-timing reuses both configurations' compiled chains
    # A real win repeats and is kept.
    _fake_timer(monkeypatch, {d: 5e-5, lucky: 3e-5})
    assert autotune.choose("op", {"x": 1}, d, [lambda best: [lucky]], _bench({}), interpret=False) == lucky
    assert "confirmed" in capsys.readouterr().err


@dataclasses.dataclass(frozen=True)
class OtherBlocks:  # another backend's block sizes
    rows: int = 4


def test_chooses_another_backend_and_reads_it_back(tune_env, monkeypatch, capsys):
    """An alternative of another class (another backend's default) wins, its own candidates follow, and the cache
    names its class: read back as that class, and ignored where that class is not among those tried."""
    d, alt, alt_fast = Blocks(), OtherBlocks(), OtherBlocks(rows=8)
    times = {d: 5e-5, alt: 3e-5, alt_fast: 2e-5, Blocks(rows=8): 4e-5}
    _fake_timer(monkeypatch, times)
    stages = [lambda best: [alt],
              lambda best: [OtherBlocks(rows=8)] if isinstance(best, OtherBlocks) else [Blocks(rows=8)]]
    got = autotune.choose("op", {}, d, stages, _bench(times), interpret=False, alternatives=[alt])
    assert got == alt_fast and type(got) is OtherBlocks
    entry = json.loads(tune_env.read_text())[autotune.cache_key("op")]
    assert entry["kind"].endswith(".OtherBlocks") and entry["blocks"] == {"rows": 8}
    monkeypatch.setenv(autotune.ENV_MODE, "cache")
    assert autotune.choose("op", {}, d, stages, _bench(times), interpret=False, alternatives=[alt]) == alt_fast
    assert autotune.choose("op", {}, d, stages, _bench(times), interpret=False) == d  # e.g. no Mosaic GPU here
    assert "ignoring the cached entry" in capsys.readouterr().err


def test_an_older_cache_entry_keeps_its_kernels_behaviour(tune_env, monkeypatch):
    """A field an entry lacks (added to the class after it was written) takes the class's own default, not the
    default blocks' choice for the shape: BDRLN's 1024-wide default with dropout pairs the parameters in SMEM with
    three register sums, and an entry tuned before `bwd_params_smem` existed (one sum) must not run with them."""
    from pallas_kernels.bias_dropout_residual_layernorm import kernel_mgpu
    default = kernel_mgpu.default_blocks(8192, 1024, rate=0.1)
    assert default.bwd_params_smem and default.bwd_register_sums == 3
    old = {k: v for k, v in dataclasses.asdict(default).items() if k not in ("bwd_params_smem", "auto_barriers")}
    old["bwd_register_sums"] = 1
    tune_env.parent.mkdir(parents=True)
    tune_env.write_text(json.dumps({autotune.cache_key("op"): {"blocks": old, "kind": autotune._kind(default)}}))
    monkeypatch.setenv(autotune.ENV_MODE, "cache")
    got = autotune.choose("op", {}, default, [], _bench({}), interpret=False)
    assert got == dataclasses.replace(kernel_mgpu.Blocks(), **old)
    assert got.bwd_register_sums == 1 and not got.bwd_params_smem


def test_choose_rowwise_returns_the_module_of_the_choice(monkeypatch):
    """With another backend's (module, default), the stages after the first are the winner's module's candidates,
    and the module returned is the one whose blocks were chosen."""
    import types
    mod_a = types.SimpleNamespace(candidate_blocks=lambda best, stage: [Blocks(rows=8)])
    mod_b = types.SimpleNamespace(candidate_blocks=lambda best, stage: [OtherBlocks(rows=8)])
    seen = []

    def choose(op, fields, default, stages, make_bench, *, interpret, alternatives=()):
        seen.append((stages[0](default), stages[1](OtherBlocks()), stages[2](default)))
        return stages[1](OtherBlocks())[0]
    monkeypatch.setattr(autotune, "choose", choose)
    module, blocks = autotune.choose_rowwise("op", mod_a, Blocks(), None, [], interpret=False,
                                             others=[(mod_b, OtherBlocks())])
    assert module is mod_b and blocks == OtherBlocks(rows=8)
    assert seen == [([OtherBlocks()], [OtherBlocks(rows=8)], [Blocks(rows=8)])]
    monkeypatch.undo()  # the real `choose`: interpret mode keeps the default, so the first module
    assert autotune.choose_rowwise("op", mod_a, Blocks(), None, [], interpret=True, others=[(mod_b, OtherBlocks())]) \
        == (mod_a, Blocks())


def test_small_kernels_are_not_tuned(tune_env, monkeypatch, capsys):
    """Under MIN_TUNE_US with the default blocks, no candidate is tried (a few us to gain, within the noise)."""
    d, fast = Blocks(), Blocks(rows=8)
    _fake_timer(monkeypatch, {d: 1e-5, fast: 1e-6})
    assert autotune.choose("op", {}, d, [lambda best: [fast]], _bench({}), interpret=False) == d
    assert "not tuned" in capsys.readouterr().err
    assert json.loads(tune_env.read_text())[autotune.cache_key("op")]["blocks"] == dataclasses.asdict(d)


def test_corrupt_cache_and_bad_mode(tune_env, monkeypatch, capsys):
    tune_env.parent.mkdir(parents=True)
    tune_env.write_text("{not json")
    monkeypatch.setenv(autotune.ENV_MODE, "cache")
    assert autotune.choose("op", {}, Blocks(), [], _bench({}), interpret=False) == Blocks()
    assert "ignoring the cache" in capsys.readouterr().err
    # A cached entry with a field the blocks no longer have is read without it.
    tune_env.write_text(json.dumps({autotune.cache_key("op"): {"blocks": {"rows": 2, "gone": 1}}}))
    assert autotune.choose("op", {}, Blocks(), [], _bench({}), interpret=False) == Blocks(rows=2)
    monkeypatch.setenv(autotune.ENV_MODE, "fast")
    with pytest.raises(ValueError, match="JAXFORMER_AUTOTUNE='fast'"):
        autotune.choose("op", {}, Blocks(), [], _bench({}), interpret=False)


def test_time_step_measures_a_chained_step():
    x = jnp.ones((384, 384))
    traced = []
    step = lambda a: (traced.append(1), (a[0] @ a[0] / 384.0,))[1]  # noqa: E731
    one = timing.step_clock(step, (x,), lengths=(1, 5), rotate_bytes=0)  # one copy
    assert len(traced) == 1 + 5  # chains of 1 and 5 steps, each traced (and compiled) once
    four = timing.step_clock(step, (x,), lengths=(1, 5), rotate_bytes=4 * x.nbytes)  # 4 copies in turn
    assert len(traced) == 6 + 4 * (1 + 5)  # n rounds of the 4 copies: 4n steps per chain
    # Real clocks: positive and plausible (the other xdist worker shares the 2 CPU cores, so no ratio of two real
    # timings is asserted here: one CI run measured t4/t1 = 0.32, another 5.5; the per-step division is checked
    # without noise below).
    for clock in (one, four):
        assert 0 < min(clock(repeats=3) for _ in range(3)) < 1.0


def test_time_step_reports_seconds_per_step_not_per_round(monkeypatch):
    """The clock divides the two chains' time difference by the steps between them, (n2 - n1) x K with K copies:
    checked on a fake median time of launch overhead + (steps run) x c, which must come back as c for any K (per
    step; per round of K copies it would be K c)."""
    c, overhead = 1e-4, 5e-3
    for k in (1, 4):
        x = jnp.ones((8, 8))
        clock = timing.step_clock(lambda a: (a[0] * 1.0,), (x,), lengths=(2, 10), rotate_bytes=k * x.nbytes)
        times = itertools.cycle([2 * k * c + overhead, 10 * k * c + overhead])  # the clock times (short, long)
        monkeypatch.setattr(timing, "_median_seconds", lambda f, args, repeats: next(times))
        assert clock(repeats=3) == pytest.approx(c, rel=1e-9)


def test_time_step_measures_again_when_the_longer_chain_is_not_slower(monkeypatch, capsys):
    """A failed measurement (the longer chain no slower than the shorter) is retried, then reported as NaN, which is
    never the fastest (it was a "0.0 us" row in kernels.py and could have won a tuning)."""
    timings = iter([2.0, 1.0, 1.0, 3.0])  # (short, long) twice: the first pair failed, the second is 2 s apart
    monkeypatch.setattr(timing, "_median_seconds", lambda f, args, repeats: next(timings))
    x = (jnp.ones((4,)),)
    assert timing.time_step(lambda a: a, x, lengths=(1, 3), rotate_bytes=0) == pytest.approx(1.0)
    monkeypatch.setattr(timing, "_median_seconds", lambda f, args, repeats: 1.0)
    assert np.isnan(timing.time_step(lambda a: a, x, lengths=(1, 3), rotate_bytes=0))
    assert "no time measured" in capsys.readouterr().err
    # kernels.py's clock (and the layout search's) keeps the last difference, as it always did.
    assert timing.time_step(lambda a: a, x, lengths=(1, 3), rotate_bytes=0, nan_on_failure=False) == 0.0


@pytest.mark.parametrize(("s", "h"), [(128, 64), (512, 64), (256, 128), (64, 32)])
def test_attention_candidates_fit_the_shapes(s, h):
    q = jax.ShapeDtypeStruct((2, s, 4, h), jnp.bfloat16)
    mask = jax.ShapeDtypeStruct((2, s), bool)
    d = kernel.default_block_sizes(s, h)
    for stage in ("fwd", "bwd"):
        cands = kernel.candidate_block_sizes(d, s, h, stage=stage)
        assert len(set(cands)) >= 4
        for c in cands:
            kernel.check_inputs(q, q, q, mask, c)
    assert any(c.fused_bwd for c in kernel.candidate_block_sizes(d, s, h, stage="bwd")) == (s <= 128)


def test_flash_attention_tunes_nothing_in_interpret_mode(tune_env):
    q = jax.random.normal(jax.random.key(0), (1, 32, 2, 16))
    out = flash_attention(q, q, q, jnp.ones((1, 32), bool), interpret=True)
    assert out.shape == q.shape and not tune_env.exists()


@pytest.mark.gpu
def test_flash_attention_tunes_and_reads_the_cache_on_gpu(tune_env, monkeypatch):
    qkv = jax.random.normal(jax.random.key(1), (4, 128, 3, 4, 64), jnp.float32).astype(jnp.bfloat16)
    mask = jnp.arange(128)[None, :] < jnp.array([[128], [100], [64], [5]])
    seed = jnp.array([3, 4], jnp.uint32)

    def run(blocks=None):
        f = lambda x: flash_attention_qkv(x, mask, seed=seed, rate=0.1, block_sizes=blocks)  # noqa: E731
        y, vjp = jax.vjp(f, qkv)
        return y, vjp(y)[0]

    tuned = jax.jit(run)()  # tuned while the jit traces
    entries = json.loads(tune_env.read_text())
    (key,) = entries
    assert "flash_attention" in key and "packed=True" in key and entries[key]["us"] > 0
    chosen = dataclasses.replace(kernel.default_block_sizes(128, 64), **entries[key]["blocks"])
    default = run(kernel.default_block_sizes(128, 64))
    for got, want in zip(tuned, default):
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), atol=2e-2, rtol=2e-2)
    # A second trace reads the cache: no tuning.
    monkeypatch.setattr(autotune, "_tune", lambda *a: pytest.fail("tuned again"))
    jax.jit(lambda: run())()
    assert json.loads(tune_env.read_text()) == entries
    print("tuned blocks:", chosen)


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
        run = lambda c: lambda *a: bias_gelu.bias_gelu(*a, **kw, interpret=True, blocks=c,  # noqa: E731
                                                       backend="triton")
    default = module.default_blocks(40, 96)
    fwd = module.candidate_blocks(default, stage="fwd")
    bwd = [c for c in module.candidate_blocks(default, stage="bwd") if c.bwd_num_stages == 1]
    assert len(set(fwd)) == 5 and len(set(bwd)) == 5
    want = _outs(ref, args)
    for c in fwd + bwd:
        assert _max_err(_outs(run(c), args), want) < 2e-5, c


@pytest.mark.parametrize("op", ["bdrln", "layer_norm", "bias_gelu"])
def test_row_kernels_ask_the_autotuner_per_shard(op, monkeypatch):
    """Without `blocks`, the forward and the backward each run the autotuner's choice for the shard's shape (here
    a candidate it returns, under a 2-way data mesh): the key names the per-shard rows; the result is unchanged."""
    asked, used = [], []

    def choose(op_, fields, default, stages, make_bench, *, interpret, alternatives=()):
        asked.append((op_, fields))
        return stages[1](stages[0](default)[1])[-1]  # some candidate: 2-row forward tiles, a deep backward

    monkeypatch.setattr(autotune, "choose", choose)
    module = bias_gelu.kernel if op == "bias_gelu" else bdrln.kernel
    for name in ("forward", "backward"):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, real=real, name=name, **kw: (
            used.append((name, kw["blocks"])), real(*a, **kw))[1])
    x, bias, res, scale, shift = _bdrln_args(32, 96)
    if op == "bdrln":
        kw = dict(seed=jnp.array([5, 6], jnp.uint32), rate=0.3, eps=1e-12)
        fn = lambda x, res, scale: bdrln.bias_dropout_residual_layernorm(x, bias, res, scale, shift, **kw)  # noqa
        ref = lambda x, res, scale: bdrln.reference.bias_dropout_residual_layernorm(x, bias, res, scale, shift, **kw)  # noqa
    elif op == "layer_norm":
        fn = lambda x, res, scale: bdrln.layer_norm(x + res, scale, shift, eps=1e-12)  # noqa: E731
        ref = lambda x, res, scale: bdrln.reference.layer_norm(x + res, scale, shift, eps=1e-12)  # noqa: E731
    else:
        fn = lambda x, res, scale: bias_gelu.bias_gelu(x * scale, res[0], seed=jnp.array([5, 6], jnp.uint32),  # noqa
                                                        rate=0.3)
        ref = lambda x, res, scale: bias_gelu.reference.bias_gelu(  # noqa: E731
            x * scale, res[0], seed=jnp.array([5, 6], jnp.uint32), rate=0.3)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("data",))  # the trainer's kind of mesh
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    want = _outs(ref, (x, res, scale))
    with jax.set_mesh(mesh):
        got = _outs(jax.jit(fn), (jax.device_put(x, sharding), jax.device_put(res, sharding), scale))
    assert _max_err(got, want) < 2e-5
    assert {a[0] for a in asked} == {"bias_gelu" if op == "bias_gelu" else "bdrln"}
    assert all(fields["rows"] == 16 and fields["backend"] == "auto" for _, fields in asked)
    assert {name for name, _ in used} == {"forward", "backward"}
    assert all(b.block_rows == 2 and b.bwd_num_stages == 3 for _, b in used)


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["bdrln", "bias_gelu"])
def test_row_kernels_tune_and_read_the_cache_on_gpu(op, tune_env, monkeypatch):
    """Tuned for real inside a jit (two candidates per stage, to keep it short), the same result as the default
    table's, the choice cached; a second trace reads it."""
    if op == "bdrln":
        args = _bdrln_args(4096, 1024, jnp.bfloat16)
        kw = dict(seed=jnp.array([5, 6], jnp.uint32), rate=0.1, eps=1e-12)
        fn = lambda blocks: lambda *a: bdrln.bias_dropout_residual_layernorm(*a, **kw, blocks=blocks)  # noqa: E731
        module, other = bdrln.kernel, bdrln.kernel_mgpu
    else:
        args = (jax.random.normal(jax.random.key(1), (4096, 3072), jnp.bfloat16),
                jax.random.normal(jax.random.key(2), (3072,)))
        module = bias_gelu._PerShape.pick(args[0], 0.1)[0]  # Mosaic GPU on Hopper, else Triton
        other = bias_gelu._k if module is bias_gelu._k_mgpu else bias_gelu._k_mgpu
        backend = "mgpu" if module is bias_gelu._k_mgpu else "triton"
        fn = lambda blocks: lambda *a: bias_gelu.bias_gelu(  # noqa: E731
            *a, seed=jnp.array([5, 6], jnp.uint32), rate=0.1, blocks=blocks,
            backend="auto" if blocks is None else backend)
    for m in (module, other):  # "auto" also times the other backend's default, then the winner's candidates
        few = m.candidate_blocks
        monkeypatch.setattr(m, "candidate_blocks", lambda around, stage, few=few: few(around, stage=stage)[:2])
    tuned = jax.jit(lambda a: _outs(fn(None), a))(args)
    entries = json.loads(tune_env.read_text())
    (key,) = entries
    assert key.startswith(op + "|") and "rows=4096" in key and entries[key]["us"] > 0
    default = _outs(fn(module.default_blocks(4096, args[0].shape[1])), args)  # the default table's result
    for got, want in zip(tuned, default):
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), atol=2e-2, rtol=2e-2)
    monkeypatch.setattr(autotune, "_tune", lambda *a: pytest.fail("tuned again"))
    jax.jit(lambda a: _outs(fn(None), a))(args)
    assert json.loads(tune_env.read_text()) == entries
    print("tuned:", entries[key])
