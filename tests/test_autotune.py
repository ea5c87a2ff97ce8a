"""The block-size autotuner and its cache (pallas_kernels/autotune.py), and flash attention's use of it."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import autotune
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
    return path


def _fake_timer(monkeypatch, times):
    monkeypatch.setattr(autotune, "time_step", lambda blocks, args: times[blocks])


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
    times = {d: 1e-5, Blocks(rows=8): 2e-5}
    _fake_timer(monkeypatch, times)
    assert autotune.choose("op", {}, d, [lambda best: [Blocks(rows=8)]], _bench(times), interpret=False) == d
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
    x = jnp.ones((256, 256))
    t = autotune.time_step(lambda a: (a[0] @ a[0] / 256.0,), (x,), lengths=(1, 3), repeats=2)
    assert 0 < t < 1.0


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
