"""Layout-annotated einsums, LayoutConfig loading, the shortest-path solver and the layout search CLI (layouts/).

Equivalence of layouts: every stored order must give the default model's outputs and gradients (fp32, dropout off:
the counter-based dropout mask is drawn over the stored element order, so another layout draws another mask).
The 144 layer configurations are covered by a sample in which every candidate of every tensor appears (3
configurations besides the default, run by default), and by a greedy all-pairs sample (every pair of candidates of
two tensors appears in some configuration: 13 configurations, 15 s or more on 2 cores, so opt-in to keep this
file fast: JAXFORMER_LAYOUT_PAIRS=1).
"""

import itertools
import json
import math
import os
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxformer.config import BertConfig, TrainConfig
from jaxformer.model import Encoder, EncoderLayer
from layouts import config as lc
from layouts import einsum as lx
from layouts.solver import Op, Problem, brute_force, solve

SMALL = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
             max_position_embeddings=32, dtype="float32")


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


# -- the annotated einsum -----------------------------------------------------------------------------------------

def test_annotated_einsum_matches_plain_einsum_in_any_stored_order():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((2, 3, 4)), jnp.float32)  # BSD
    w = jnp.asarray(rng.standard_normal((3, 4, 2, 5)), jnp.float32)  # CDNH
    ref = jnp.einsum("BSD,CDNH->CBSNH", x, w)
    xs = lx.relayout(lx.annotate(x, "BSD"), "SBD")
    assert xs.layout == "SBD" and xs.shape == (3, 2, 4)
    out = lx.einsum("BNCSH", xs, lx.annotate(w, "CDNH"))
    assert out.layout == "BNCSH"
    np.testing.assert_allclose(out.to("CBSNH"), ref, rtol=1e-6, atol=1e-6)
    q = lx.rename(lx.take(out, "C", 1), S="T")
    assert q.layout == "BNTH"
    np.testing.assert_allclose(q.to("BTNH"), ref[1], rtol=1e-6, atol=1e-6)
    bias = jnp.arange(30.0).reshape(3, 2, 5)  # CNH
    e = lx.expand(bias, "CNH", "BNCSH")
    assert e.shape == (1, 2, 3, 1, 5)
    np.testing.assert_array_equal(e[0, :, :, 0, :], jnp.transpose(bias, (1, 0, 2)))
    with pytest.raises(ValueError, match="permutation"):
        lx.relayout(xs, "SBF")
    with pytest.raises(ValueError, match="no operand"):
        lx.einsum("BSF", xs)
    with pytest.raises(ValueError, match="3 dimensions"):
        lx.annotate(x, "BS")


# -- layouts give the default model's numbers -------------------------------------------------------------------

def each_value_sample():
    """Configuration i takes candidate i (mod the count) of every tensor: every candidate appears at least once."""
    n = max(len(c) for c in lc.CANDIDATES.values())
    return [lc.LayoutConfig(**{t: c[i % len(c)] for t, c in lc.CANDIDATES.items()}) for i in range(1, n)]


def all_pairs_sample():
    """A greedy covering array of strength 2 over the candidate product (every pair of values of two tensors)."""
    names = list(lc.CANDIDATES)
    every = [dict(zip(names, c)) for c in itertools.product(*lc.CANDIDATES.values())]

    def pairs(c):
        return {(a, c[a], b, c[b]) for a, b in itertools.combinations(names, 2)}
    todo, out = set().union(*(pairs(c) for c in every)), []
    while todo:
        best = max(every, key=lambda c: len(pairs(c) & todo))
        out.append(lc.LayoutConfig(**best))
        todo -= pairs(best)
    return out


def _graphdef(cls, config, *filters):
    """The module's graph definition without initialising it (eager initialisation costs seconds per model)."""
    return nnx.split(nnx.eval_shape(lambda: cls(config, rngs=nnx.Rngs(0))), *filters)[0]


def _layer_outputs(configs, kernels="xla"):
    """Each layout's EncoderLayer (same parameters) on the same BSD input: output (BSD) and grads, one jit."""
    base = BertConfig(**dict(SMALL, num_hidden_layers=1, kernels=kernels))
    _, state = nnx.split(EncoderLayer(base, rngs=nnx.Rngs(0)))
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((2, 16, 32)), jnp.float32)
    mask = jnp.arange(16)[None] < jnp.array([[16], [9]])

    def run(L, x, state):
        graphdef = _graphdef(EncoderLayer, base.replace(layouts=L))

        def f(x, state):  # BSD in and out, the layer in L.x between
            y = nnx.merge(graphdef, state)(lx.annotate(x, "BSD").to(L.x), mask, key=jax.random.key(0),
                                           deterministic=True)
            return lx.annotate(y, L.x).to("BSD")
        y, vjp = jax.vjp(f, x, state)
        cot = jnp.asarray(np.random.default_rng(2).standard_normal(y.shape), jnp.float32)
        return y, jax.tree.leaves(vjp(cot))

    return jax.jit(lambda x, s: [run(L, x, s) for L in configs])(x, state)


def _check_same(results, configs):
    (y0, g0), rest = results[0], results[1:]
    for L, (y, g) in zip(configs, rest):
        assert rel_err(y, y0) < 1e-5, L
        for a, b in zip(g, g0):
            assert rel_err(a, b) < 1e-5, L


@pytest.mark.slow
def test_every_candidate_gives_the_default_outputs_and_gradients():
    sample = each_value_sample()
    assert all(any(getattr(L, t) == c for L in sample + [lc.LayoutConfig()])
               for t, cs in lc.CANDIDATES.items() for c in cs)
    _check_same(_layer_outputs([lc.LayoutConfig()] + sample), sample)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("JAXFORMER_LAYOUT_PAIRS"), reason="opt-in: JAXFORMER_LAYOUT_PAIRS=1")
def test_all_pairs_sample_gives_the_default_outputs_and_gradients():
    sample = all_pairs_sample()
    assert len(sample) < 20  # 144 configurations in all
    _check_same(_layer_outputs([lc.LayoutConfig()] + sample), sample)


@pytest.mark.slow
def test_encoder_scan_in_another_layout_matches_the_default():
    """The Encoder (BSD in, a transpose into L.x, the scan over 2 layers, back to BSD) with dropout off: outputs and
    gradients (the rest of the model never sees the layer layouts)."""
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.standard_normal((2, 16, 32)), jnp.float32)
    mask = jnp.arange(16)[None] < jnp.array([[16], [11]])
    # Random parameters on the abstract module (eager initialisation costs seconds per shape on a busy CPU).
    _, params = nnx.split(nnx.eval_shape(lambda: Encoder(BertConfig(**SMALL, kernels="xla"), rngs=nnx.Rngs(0))))
    params = jax.tree.map(lambda s: jnp.asarray(0.2 * rng.standard_normal(s.shape), s.dtype), params)
    fns = []
    for L in ("default", lc.LayoutConfig(x="SBD", qkv="SBCNH", scores="BSNT", ctx="BNSH", h="SBF")):
        graphdef = _graphdef(Encoder, BertConfig(**SMALL, kernels="xla", layouts=L))

        def loss(x, params, graphdef=graphdef):
            y = nnx.merge(graphdef, params)(x, mask, key=jax.random.key(0), deterministic=True)
            return jnp.sum(jnp.sin(y)), y
        fns.append(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))
    ((_, y0), g0), ((_, y1), g1) = jax.jit(lambda x, p: [f(x, p) for f in fns])(x, params)  # one compile
    assert rel_err(y1, y0) < 1e-5
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):
        assert rel_err(a, b) < 1e-5


@pytest.mark.slow
def test_pallas_kernels_in_another_layout_match_xla():
    """Flash attention (BSNH) between inserted transposes, BDRLN and bias+GELU on SBD/SBF rows (interpret mode)."""
    L = lc.LayoutConfig(x="SBD", qkv="CBNSH", ctx="BNSH", h="SBF")
    from jaxformer import layer
    import pallas_kernels.attention as att
    calls = []
    orig = att.sharded_flash_attention_qkv
    try:  # count the flash calls: the pallas path must really run (ops.PALLAS holds the function itself)
        from jaxformer import ops
        ops.PALLAS["attention_qkv"] = lambda *a, **k: calls.append(1) or orig(*a, **k)
        (y0, g0), (y1, g1) = _layer_outputs([lc.LayoutConfig()], "xla")[0], _layer_outputs([L], "pallas")[0]
    finally:
        ops.PALLAS["attention_qkv"] = orig
    assert calls and layer.FLASH_QKV != L.qkv
    assert rel_err(y1, y0) < 1e-5
    for a, b in zip(g1, g0):
        assert rel_err(a, b) < 1e-5


# -- config files ---------------------------------------------------------------------------------------------------

def test_config_files_load_and_errors_name_the_field(tmp_path):
    good = tmp_path / "l.json"
    good.write_text(json.dumps({"x": "SBD", "ctx": "BNSH", "meta": {"device": "test"}}))
    cfg = BertConfig(**SMALL, layouts=str(good))
    assert cfg.layout_config == lc.LayoutConfig(x="SBD", ctx="BNSH")
    assert BertConfig(**SMALL).layout_config.is_default
    assert BertConfig.from_dict(BertConfig(**SMALL, layouts=lc.LayoutConfig(h="SBF")).to_dict()).layout_config.h \
        == "SBF"
    cases = [({"y": "BSD"}, r"unknown tensor name.*'y'"),
             ({"qkv": "CBSNX"}, r"qkv='CBSNX' is not a permutation"),
             ({"qkv": "CBSN"}, r"qkv='CBSN' is not a permutation"),
             ({"x": "DBS"}, r"x='DBS' must end in 'D'")]
    for i, (d, pattern) in enumerate(cases):
        path = tmp_path / f"bad{i}.json"
        path.write_text(json.dumps(d))
        with pytest.raises(ValueError, match=pattern) as e:
            BertConfig(**SMALL, layouts=str(path))
        assert "layouts" in str(e.value)
    bad_json = tmp_path / "broken.json"
    bad_json.write_text("{x: BSD")
    with pytest.raises(ValueError, match=r"layouts=.*broken.json.*bad JSON"):
        BertConfig(**SMALL, layouts=str(bad_json))
    with pytest.raises(ValueError, match=r"layouts='fastest' is neither a built-in name"):
        BertConfig(**SMALL, layouts="fastest")
    with pytest.raises(ValueError, match=r"layouts=.*cannot read"):
        TrainConfig(layouts=str(tmp_path / "missing.json"))
    import train
    from jaxformer import hlo_report
    assert train.main(["--layouts", "fastest", "--steps", "1"]) == 2
    assert hlo_report.main(["--config", "tiny", "--layouts", str(bad_json)]) == 2


# -- the solver ------------------------------------------------------------------------------------------------------

def _random_problem(seed):
    r = random.Random(seed)
    tensors = {f"t{i}": tuple(f"L{j}" for j in range(r.randint(1, 3))) for i in range(6)}
    names = list(tensors)
    ops, made = [], ["t0"]
    for i in range(1, r.randint(3, 6)):
        ins = tuple(r.sample(made, min(len(made), r.randint(1, 2))))
        reads = {t: tuple(r.sample(tensors[t], r.randint(1, len(tensors[t])))) for t in ins if r.random() < 0.4}
        out = names[i]
        ops.append(Op(f"op{i}", ins, (out,), reads=reads))
        made.append(out)
    costs, trans = {}, {}

    def cost(op, rd, wr):
        key = (op.name, rd, wr)
        if key not in costs:
            costs[key] = math.inf if r.random() < 0.1 else r.uniform(0, 10)
        return costs[key]

    def transpose(t, a, b):
        return trans.setdefault((t, a, b), r.uniform(0, 5))
    return Problem(tensors, ops, ("t0",), (made[-1],), cost, transpose,
                   ties={made[-1]: "t0"} if r.random() < 0.5 else {})


@pytest.mark.parametrize("seed", range(12))
def test_solver_finds_the_brute_force_optimum(seed):
    p = _random_problem(seed)
    want = brute_force(p)
    if want == math.inf:
        with pytest.raises(ValueError, match="no feasible"):
            solve(p)
        return
    got = solve(p)
    assert got.total == pytest.approx(want)
    assert sum(c.cost for c in got.choices) == pytest.approx(got.total)  # the path's edges add up to its length


def test_solver_inserts_the_transpose_a_fixed_layout_operator_needs():
    # op1 reads t0 only in B (like flash attention reading qkv only as CBSNH); the output t2 exists only in A and
    # is tied to t0 (the scan carry), so t0 starts in A and must be transposed to B before op1.
    cands = {"t0": ("A", "B"), "t1": ("A", "B"), "t2": ("A",)}
    ops = [Op("op1", ("t0",), ("t1",), reads={"t0": ("B",)}), Op("op2", ("t1", "t0"), ("t2",))]
    p = Problem(cands, ops, ("t0",), ("t2",),
                cost=lambda op, r, w: 1.0 if op.name == "op1" else (2.0 if r == ("A", "B") else 50.0),
                transpose=lambda t, a, b: 3.0, ties={"t2": "t0"})
    sol = solve(p)
    assert sol.total == pytest.approx(6.0) == brute_force(p)
    assert sol.inputs == {"t0": "A"} and sol.choices[0].transposes == [("t0", "A", "B")]
    assert sol.choices[1].reads == {"t1": "A", "t0": "B"}


# -- the search CLI --------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_search_cli_end_to_end_on_the_cpu(tmp_path, capsys):
    from jaxformer import layout_search as search
    out = tmp_path / "tiny.json"
    rc = search.main(["--config", "tiny", "--seq-len", "16", "--batch-size", "2", "--dtype", "float32",
                      "--kernels", "xla", "--vary", "x", "--repeats", "1", "--lengths", "1,2",
                      "--rotate-mb", "0.000001", "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    assert "[11/11] ffn_out" in text and "# chosen path" in text and "measured encoder layer fwd+bwd" in text
    saved = json.loads(out.read_text())
    # CPU timings of microsecond kernels are noise (even negative): only check they were taken and recorded.
    assert saved["meta"]["preset"] == "tiny" and math.isfinite(saved["meta"]["measured_layer_us"]["default"])
    L = BertConfig(**SMALL, layouts=str(out)).layout_config
    assert L.qkv == "CBSNH" and L.h == "BSF" and L.x in lc.CANDIDATES["x"]
    assert search.main(["--config", "tiny", "--vary", "x,q"]) == 2


def test_pallas_default_qkv_is_the_packed_flash_order():
    # Under the kernels the default qkv (CBSNH) is stored packed BSCNH, which flash attention reads in place; an
    # explicitly configured other order is kept (and transposed to BSCNH in front of the kernels); XLA keeps all.
    from jaxformer import layer
    assert layer.layouts_for(lc.LayoutConfig(), True) == lc.LayoutConfig(qkv="BSCNH")
    assert layer.layouts_for(lc.LayoutConfig(), False) == lc.LayoutConfig()
    assert layer.layouts_for(lc.LayoutConfig(qkv="CBNSH", x="SBD"), True) == lc.LayoutConfig(qkv="CBNSH", x="SBD")
