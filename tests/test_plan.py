"""jaxformer.plan against the compiled train step on 8 CPU devices: collective bytes (exact), contraction flop (exact),
memory per device (within 8% of XLA's memory analysis); the parameter and activation inventories against the model
and JAX's saved residuals; the search, the CLI, calibration fitting and validation on a synthetic runs file."""

import functools
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxformer import sharding
from jaxformer.config import BertConfig, MeshConfig
from jaxformer.model import BertForPreTraining
from jaxformer.pipeline import bubble_fraction
from jaxformer.plan import Hardware, Space, Strategy, Workload, evaluate, predict, search, xla_check
from jaxformer.plan import calibrate as calib
from jaxformer.plan.__main__ import main
from jaxformer.plan.comm import collectives
from jaxformer.plan.memory import _jaxpr_pallas, _jaxpr_xla
from jaxformer.plan.predict import launched_ops
from jaxformer.plan.validate import validate
from jaxformer.plan.workload import hlo_counts, local_shape, parameters

# (preset, seq, batch, strategy): the strategies implemented, one compile each (the test's time budget); the wider
# table of perfmodel.md is `python -m jaxformer.plan.xla_check`
CASES = {
    "data": ("tiny", 64, 16, Strategy(dp=4, kernels="xla")),
    "fsdp": ("tiny", 64, 16, Strategy(fsdp=4, kernels="xla")),
    "tensor": ("tiny", 64, 16, Strategy(tp=2, kernels="xla")),
    "data+tensor": ("tiny", 64, 16, Strategy(dp=2, tp=2, kernels="xla")),
    "data+remat": ("tiny", 64, 16, Strategy(dp=2, remat="full", kernels="xla")),
    "data+compression": ("tiny", 64, 16, Strategy(dp=4, density=0.01, kernels="xla")),
    "data+tensor+compression": ("tiny", 64, 16, Strategy(dp=2, tp=2, density=0.01, kernels="xla")),
    "pipeline+data+remat": ("tiny", 64, 16, Strategy(dp=2, pp=2, microbatches=2, remat="full", kernels="xla")),
    "pipeline+tensor": ("tiny", 64, 16, Strategy(tp=2, pp=2, microbatches=2, kernels="xla")),
    "circular (mini)": ("mini", 64, 16, Strategy(pp=2, microbatches=2, repeats=2, kernels="xla")),
}


@functools.cache
def _compiled(name):
    """One case's compiled step and the model's counts of it, compiled once per process (whichever worker runs the
    case: a module fixture would compile all ten in each)."""
    preset, seq, batch, s = CASES[name]
    return xla_check.check(BertConfig.preset(preset), seq, batch, s)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_collectives_flop_and_memory_equal_the_compiled_steps(name):
    r = _compiled(name)
    assert set(r.comm_model) == set(r.comm_compiled)
    for kind, hlo in r.comm_compiled.items():
        # the model counts no scalars; the compiled step sums the loss, metrics and norm pieces (f32[] values riding
        # in the gradient all-reduces' tuples): ~1.4 KB on fsdp=4, tens of bytes elsewhere
        assert abs(r.comm_model[kind] - hlo) <= 4096, (kind, r.comm_model[kind], hlo)
    assert r.flop_model == pytest.approx(r.flop_compiled, rel=2e-3)
    assert abs(r.memory_error) < 0.08, (r.memory_model, r.memory_compiled)


def test_tensor_backward_all_reduces_are_independent_of_their_weight_gradients():
    """The overlap predict.py assumes for tensor parallelism, in the compiled tiny tensor=2 step: the forward
    activation all-reduces have no contraction beside them; each backward input-gradient all-reduce has its block's
    first weight gradient (FFN in, [D, F/tp]; QKV, [3D/tp, D]) among the contractions it neither feeds nor waits for."""
    cfg = BertConfig.preset("tiny")
    D, F, L = cfg.hidden_size, cfg.intermediate_size // 2, cfg.num_hidden_layers
    act = f"f32[16,64,{D}]"
    ars = [(shape, [s.split("{")[0] for s in ind])
           for shape, ind in xla_check.independent_contractions(_compiled("tensor").hlo) if act in shape]
    assert len(ars) == 1 + 4 * L  # the embedding lookup's, 2 per layer forward, 2 backward
    assert all(not ind for _, ind in ars[:1 + 2 * L])
    backward = ars[1 + 2 * L:]
    for i, (_, ind) in enumerate(backward[:-1]):  # the last is combined with the scalar sums (the norm's)
        done = i // 2 + 1  # layers whose blocks' gradients have been reached
        dims = [tuple(sorted(int(x) for x in s[s.index("[") + 1:s.index("]")].split(","))) for s in ind
                if s.count(",") == 1]
        if i % 2 == 0:
            assert dims.count(tuple(sorted((D, F)))) == 2 * done  # FFN in and out weight gradients
        else:
            assert dims.count(tuple(sorted((3 * D // 2, D)))) == done  # QKV


def test_tensor_backward_all_reduces_hide_behind_their_weight_gradients():
    """Only the excess of each backward input-gradient all-reduce over its block's weight-gradient GEMM is charged."""
    cfg = BertConfig.preset("large")
    w, s, hw = Workload(cfg, 128, 64), Strategy(tp=2, kernels="pallas"), Hardware.make("h200")
    D, F, L, t = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, 64 * 128
    ar = hw.collective_time("all-reduce", t * D * 2, 2, 2)
    qkv = hw.gemm_time(2 * t * D * 3 * D / 2, width=D)
    ffn = hw.gemm_time(2 * t * D * F / 2, width=D)
    p = predict(w, s, hw)
    assert p.breakdown["comm_beside_gemm_s"] == pytest.approx(L * (min(ar, qkv) + min(ar, ffn)))
    assert p.step_time_s == pytest.approx(p.compute_s + p.comm_s)
    backward = [c for c in p.collectives if c.behind]
    assert sum(c.count for c in backward) == 2 * L and {c.behind for c in backward} == {"qkv", "ffn_in"}


# The pipeline's tick-loop and inner-scan byte counts were read from jax 0.10's CPU program (XLA of that release);
# jax 0.11's CPU compiler moves fewer bytes there (150.5 against 195.2 MB, 27.5 against 47.6 MB), not yet modelled
# (benchmarks/results/perfmodel.md, where it misses).
_XLA_OF_JAX_010 = pytest.mark.skipif(tuple(int(x) for x in jax.__version__.split(".")[:2]) >= (0, 11),
                                     reason="counts read from jax 0.10's compiled CPU program")


@pytest.mark.slow
@_XLA_OF_JAX_010
def test_pipeline_tick_loop_bytes_and_memory_are_the_compiled_steps():
    """jaxformer's pipeline on a small config whose heads are small (the tick loop sets the peak): the bytes of the
    tick loop's own operators (those run once per tick, outside the inner layer scan) and the memory per device."""
    from jaxformer.hlo_analysis import analyze
    from jaxformer.plan.memory import memory
    from jaxformer.plan.memory import tick_residuals
    from jaxformer.plan.predict import TICK_STACK_OUTSIDE, tick_loop_bytes_inside
    from jaxformer.plan.workload import CPU
    cfg = BertConfig(vocab_size=1024, hidden_size=128, num_attention_heads=2, num_hidden_layers=4,
                     intermediate_size=512, kernels="xla")
    w, s = Workload(cfg, 32, 16), Strategy(pp=2, microbatches=4, kernels="xla")  # 5 ticks of 2 layers
    c = xla_check.compile_step(cfg, w.seq_len, w.global_batch, s)
    ops = analyze(c.as_text()).ops
    tick = sum(op.bytes for op in ops if op.trips == s.ticks and op.cls != "collective")
    assert tick_loop_bytes_inside(w, s, CPU) == pytest.approx(tick, rel=0.1)
    # outside the loops: the [ticks, layers, 1, microbatch, ...] stacks' fills and copies (the CPU's converts aside)
    stack = f"[{s.ticks},{cfg.num_hidden_layers // s.pp},1,{w.global_batch // s.microbatches},"
    outside = sum(op.bytes for op in ops if op.trips == 1 and stack in op.shape and "convert" not in op.name)
    assert TICK_STACK_OUTSIDE * tick_residuals(w, s, CPU) == pytest.approx(outside, rel=0.2)
    ma = c.memory_analysis()
    compiled = (ma.argument_size_in_bytes + ma.temp_size_in_bytes + ma.output_size_in_bytes
                - ma.alias_size_in_bytes)
    assert memory(w, s, CPU).total == pytest.approx(compiled, rel=0.08)


@pytest.mark.slow
@_XLA_OF_JAX_010
def test_pipeline_inner_scan_weight_bytes_are_the_compiled_steps():
    """The bytes the pipeline's inner layer scan moves on weight-shaped buffers (operators run once per layer and
    tick, besides the contractions): the compute copies forward and backward and the gradient written into the
    stack. 192 tokens per microbatch, so no activation has a weight's shape."""
    from jaxformer.hlo_analysis import analyze
    from jaxformer.plan.predict import scan_weight_bytes
    from jaxformer.plan.workload import CPU
    cfg = BertConfig(vocab_size=1024, hidden_size=128, num_attention_heads=2, num_hidden_layers=4,
                     intermediate_size=512, kernels="xla")
    w, s = Workload(cfg, 32, 24), Strategy(pp=2, microbatches=4, kernels="xla")
    k = cfg.num_hidden_layers // s.pp
    ops = analyze(xla_check.compile_step(cfg, w.seq_len, w.global_batch, s).as_text()).ops
    activation_dims = {w.seq_len, w.global_batch // s.microbatches, w.global_batch // s.microbatches * w.seq_len}

    def weight_shaped(shape):
        dims = [int(d) for d in shape[shape.index("[") + 1:shape.index("]")].split(",") if d]
        return not activation_dims & set(dims) and math.prod(dims) >= cfg.hidden_size ** 2

    inner = sum(op.bytes for op in ops if op.trips == s.ticks * k and op.cls not in ("contraction", "collective")
                and "[" in op.shape and weight_shaped(op.shape))
    assert scan_weight_bytes(w, s, CPU) == pytest.approx(inner, rel=0.02)


@pytest.mark.slow
def test_remat_scan_memory_is_the_compiled_steps():
    """Under remat the layers run in a scan: the rebuilt layer is not alive with the MLM head's working set (the
    peak on tiny), the stacked layer gradient is alive with it in the loop."""
    from jaxformer.plan.memory import memory
    from jaxformer.plan.workload import CPU
    cfg = BertConfig.preset("tiny", kernels="xla", remat="full")
    w, s = Workload(cfg, 64, 16), Strategy(remat="full", kernels="xla")
    ma = xla_check.compile_step(cfg, w.seq_len, w.global_batch, s).memory_analysis()
    compiled = (ma.argument_size_in_bytes + ma.temp_size_in_bytes + ma.output_size_in_bytes
                - ma.alias_size_in_bytes)
    assert memory(w, s, CPU).total == pytest.approx(compiled, rel=0.04)


def test_parameter_inventory_is_the_models():
    cfg = BertConfig.preset("tiny", kernels="xla")
    model = nnx.eval_shape(lambda: BertForPreTraining(cfg, rngs=nnx.Rngs(0)))
    real = {}
    for path, var in jax.tree_util.tree_flatten_with_path(nnx.state(model, nnx.Param),
                                                          is_leaf=lambda v: isinstance(v, nnx.Variable))[0]:
        names = var.get_metadata().get("out_sharding")
        real["/".join(str(getattr(k, "key", k)) for k in path)] = (
            tuple(var.shape), "".join("_" if n is None else n for n in names))
    mine = {t.name: (t.shape, t.letters) for t in parameters(cfg)}
    assert mine == real
    # the shards: logical_to_spec on a real mesh of 8 devices, against local_shape
    mesh = sharding.make_mesh(MeshConfig(data=1, fsdp=2, tensor=2, pipeline=2), jax.devices()[:8])
    specs = sharding.param_specs(model, mesh)
    s = Strategy(fsdp=2, tp=2, pp=2)
    for t in parameters(cfg):
        spec = specs
        for k in t.name.split("/"):
            spec = spec[k]
        sizes = [d // math.prod(mesh.shape[a] for a in ((ax,) if isinstance(ax, str) else ax or ()))
                 for d, ax in zip(t.shape, tuple(spec) + (None,) * (len(t.shape) - len(spec)))]
        assert tuple(sizes) == local_shape(t, s), t.name


@pytest.mark.parametrize("kernels", ["xla", "pallas"])
def test_activation_table_equals_jaxs_saved_residuals(kernels):
    from jax._src.ad_checkpoint import saved_residuals

    from jaxformer.layer import EncoderLayer
    cfg = BertConfig.preset("tiny", kernels=kernels, hidden_size=64, num_attention_heads=2, intermediate_size=96)
    b, seq = 5, 32  # 5: no weight dimension, so a residual is an activation iff it leads with B or B*S
    graphdef, state = nnx.split(nnx.eval_shape(lambda: EncoderLayer(cfg, rngs=nnx.Rngs(0))))

    def f(state, x):
        layer = nnx.merge(graphdef, state)
        return layer(x, jnp.ones((b, seq), bool), key=jax.random.key(0), deterministic=False).astype(jnp.float32).sum()

    x = jax.ShapeDtypeStruct((b, seq, cfg.hidden_size), jnp.bfloat16)
    saved = sum(a.size * a.dtype.itemsize for a, why in saved_residuals(f, state, x)
                if "argument" not in why and a.ndim and a.shape[0] in (b, b * seq))
    table = (_jaxpr_xla if kernels == "xla" else _jaxpr_pallas)(2)
    # the layer's output is the next layer's input (kept there): one D-row in the compute dtype per token
    assert table.per_token(cfg, seq, 1) * b * seq == saved + 2 * cfg.hidden_size * b * seq * (kernels == "xla")


def test_bubble_is_the_pipelines():
    for p, m, r in ((2, 4, 1), (4, 8, 2), (8, 16, 1)):
        assert Strategy(pp=p, microbatches=m, repeats=r).bubble == bubble_fraction(p, m, r)


def test_search_ranks_and_explains():
    w = Workload(BertConfig.preset("tiny"), 128, 64)
    preds = search(w, Hardware.make("h100"), 8, Space(remat=("none",)))
    feas = [p for p in preds if p.feasible]
    assert feas and all(a.step_time_s <= b.step_time_s for a, b in zip(feas, feas[1:]))
    bad = {p.strategy.tp: p.reason for p in preds if not p.feasible}
    assert "num_attention_heads=2 is not divisible by tensor=4" in bad[4]  # tiny has 2 heads
    huge = Workload(BertConfig(hidden_size=4096, num_hidden_layers=48, num_attention_heads=32,
                               intermediate_size=16384), 512, 64)
    p = evaluate(huge, Strategy(), Hardware.make("h100"), 1)
    assert not p.feasible and p.reason.startswith("does not fit")


def test_pipeline_beats_data_parallelism_on_a_slow_link():
    """Lu et al.'s finding, from the model: a 3B encoder on 64 GPUs over 25 Gb/s links, with a Megatron-style
    pipeline; jaxformer's own pipeline (encoder output broadcast, gradients summed every tick) does not win there."""
    w = Workload(BertConfig(hidden_size=2560, num_hidden_layers=32, num_attention_heads=32,
                            intermediate_size=10240), 512, 512)
    hw = Hardware.make("h100", 8, 25.0)
    dp = predict(w, Strategy(dp=64), hw)
    pp = predict(w, Strategy(dp=8, pp=8, microbatches=16, pipeline_style="megatron"), hw)
    ours = predict(w, Strategy(dp=8, pp=8, microbatches=16), hw)
    assert pp.step_time_s < dp.step_time_s < ours.step_time_s
    assert dp.comm_bytes > pp.comm_bytes


def test_topk_density_shrinks_the_gradient_exchange():
    w = Workload(BertConfig.preset("base"), 128, 256)
    dense = sum(c.wire_bytes for c in collectives(w, Strategy(dp=8)))
    sparse = sum(c.wire_bytes for c in collectives(w, Strategy(dp=8, density=0.01)))
    assert sparse < 0.02 * dense  # compression.md: ~100x fewer bytes at 0.01
    kinds = {c.kind for c in collectives(w, Strategy(dp=8, density=0.01)) if c.what.startswith("grad")}
    assert kinds == {"all-to-all", "all-gather"}  # the balanced exchange


def test_collective_costs():
    hw = Hardware.make("h100", 8, 100.0)
    intra = hw.collective_time("all-reduce", 1e8, 8, 8)
    inter = hw.collective_time("all-reduce", 1e8, 16, 16)
    assert inter > intra > 0
    # one GPU per node: over the network at the node's bandwidth shared by its 8 GPUs, a tree's latency
    beta = 100e9 / 8 / 8
    assert hw.collective_time("all-reduce", 1e8, 4, 32) == pytest.approx(4 * 10e-6 + 1.5 * 1e8 / beta)
    assert hw.collective_time("all-gather", 1e8, 4, 32) == pytest.approx(3 * 10e-6 + 0.75 * 1e8 / beta)


def test_cli_json(capsys):
    assert main(["--config", "tiny", "--gpus", "4", "--global-batch", "32", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    entry = out["strategies"][0]
    for key in ("dp", "fsdp", "tp", "pp", "microbatches", "feasible", "step_time_s", "seq_per_s", "comm_bytes",
                "bubble"):
        assert key in entry
    assert set(entry["memory_bytes"]) >= {"params", "grads", "optimizer", "activations", "total"}
    assert entry["feasible"] and entry["dp"] * entry["fsdp"] * entry["tp"] * entry["pp"] == 4


@pytest.mark.parametrize("argv, field", [
    (["--gpu", "v100"], "--gpu 'v100'"),
    (["--config", "huge"], "--config 'huge'"),
    (["--gpus", "12", "--gpus-per-node", "8"], "--gpus 12"),
    (["--config", "tiny", "--gpus", "4", "--strategy", "tp=4"], "num_attention_heads=2"),
    (["--config", "tiny", "--gpus", "4", "--global-batch", "6", "--strategy", "dp=4"], "batch_size=6"),
    (["--gpus", "4", "--strategy", "dp=2"], "uses 2 GPUs"),
    (["--seq-len", "1024"], "--seq-len 1024"),
    (["--kernels", "cuda"], "--kernels 'cuda'"),
    (["--validate", "/nonexistent/runs.jsonl"], "/nonexistent/runs.jsonl"),
])
def test_cli_errors_exit_2(capsys, argv, field):
    assert main(argv) == 2
    assert field in capsys.readouterr().err


def test_calibration_fit_recovers_the_rates(tmp_path):
    rate, t0, alpha, beta = 600e12, 5e-6, 4e-6, 150e9
    gemm = [dict(flop=f, seconds=t0 + f / rate) for f in (1e9, 1e10, 1e11)]
    colls = {k: [dict(bytes=m, n=2, seconds=calib.ring_steps(k, 2) * alpha + calib.wire_fraction(k, 2) * m / beta)
                 for m in (1e4, 1e6, 1e8)] for k in calib.COLLECTIVE_KINDS}
    raw = dict(device="NVIDIA H100 80GB HBM3", gemm=gemm, copy=dict(bytes=2e9, seconds=1e-3), collectives=colls)
    raw["fit"] = calib.fit(raw)
    assert raw["fit"]["gemm_rate"] == pytest.approx(rate, rel=1e-6)
    assert raw["fit"]["gemm_t0"] == pytest.approx(t0, rel=1e-4)
    for k in calib.COLLECTIVE_KINDS:
        assert raw["fit"]["collectives"][k]["beta"] == pytest.approx(beta, rel=1e-4)
        assert raw["fit"]["collectives"][k]["alpha"] == pytest.approx(alpha, rel=1e-3)
    path = tmp_path / "calib.json"
    path.write_text(json.dumps(raw))
    from jaxformer.plan import Calibration
    hw = Hardware.make("h100", calibration=Calibration.load(path))
    assert hw.gemm_time(1e10) == pytest.approx(t0 + 1e10 / rate)
    assert hw.collective_time("all-gather", 1e8, 2, 2) == pytest.approx(alpha + 0.5e8 / beta)


def test_launch_measurement_counts_the_chains_operators():
    """measure_launch divides wall-clock time by the operators XLA launched: every link of its chain is at least
    one (a sort is never fused with its neighbours), in a loop and in a straight line."""
    out = calib.measure_launch(quick=True)
    for name in ("loop", "straight"):
        assert out[name]["ops"] >= 8 * 4  # n_ops x trips links of the quick chain
        assert out[name]["per_op"] == pytest.approx(out[name]["seconds"] / out[name]["ops"]) and out[name]["per_op"] > 0
    raw = dict(device="cpu", gemm=[dict(flop=1e9, seconds=1e-3), dict(flop=2e9, seconds=2e-3)],
               copy=dict(bytes=1e9, seconds=1e-3), launch=out)
    assert calib.fit(raw)["launch_s"] == {"loop": out["loop"]["per_op"], "straight": out["straight"]["per_op"]}


def test_launching_bounds_small_steps_and_adds_in_loops():
    """Every kernel a while loop launches adds the time per launch (the GPU waits for each); a step outside loops
    takes at least the time to launch all its operators; BERT-large's plain step is far above both."""
    hw = Hardware.make("h200")
    tiny = Workload(BertConfig.preset("tiny"), 128, 8)
    plain = predict(tiny, Strategy(), hw)
    assert plain.step_time_s == plain.breakdown["launch_s"] > plain.compute_s + plain.comm_s
    assert plain.breakdown["loop_idle_s"] == 0.0
    piped = Strategy(pp=2, microbatches=32)
    p = predict(Workload(BertConfig.preset("tiny"), 128, 64), piped, hw)
    loop_ops, straight_ops = launched_ops(p.workload, piped)
    assert p.breakdown["loop_idle_s"] == pytest.approx(hw.launch_time(loop_ops, 0.0))
    assert p.breakdown["launch_s"] == pytest.approx(hw.launch_time(loop_ops, straight_ops))
    assert p.step_time_s == pytest.approx(p.compute_s + p.comm_s + p.breakdown["loop_idle_s"])
    assert p.breakdown["loop_idle_s"] > p.compute_s + p.comm_s  # launch-bound: the ticks add launches, not work
    more = predict(Workload(BertConfig.preset("tiny"), 128, 64), Strategy(pp=2, microbatches=64), hw)
    assert more.breakdown["launched_ops"] > p.breakdown["launched_ops"]
    large = predict(Workload(BertConfig.preset("large"), 128, 64), Strategy(), hw)
    assert large.step_time_s == large.compute_s + large.comm_s > 3 * large.breakdown["launch_s"]


def test_launches_leave_out_names_and_waits():
    """Report.launches counts the operators that launch work: not parameters, tuples, bitcasts, tuple elements or
    the `-done` of an asynchronous pair; trip-weighted, split by inside / outside loops."""
    from jaxformer.hlo_analysis import analyze
    hlo = """HloModule m

%body (p: (s32[], f32[256])) -> (s32[], f32[256]) {
  %p = (s32[], f32[256]{0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[256]{0} get-tuple-element(%p), index=1
  %one = s32[] constant(1)
  %j = s32[] add(%i, %one)
  %y = f32[256]{0} sine(%x)
  ROOT %t = (s32[], f32[256]{0}) tuple(%j, %y)
}

%cond (p: (s32[], f32[256])) -> pred[] {
  %p = (s32[], f32[256]{0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(8)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main (a: f32[256]) -> f32[256] {
  %a = f32[256]{0} parameter(0)
  %b = f32[256]{0} cosine(%a)
  %zero = s32[] constant(0)
  %init = (s32[], f32[256]{0}) tuple(%zero, %b)
  %w = (s32[], f32[256]{0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"8"}}
  ROOT %r = f32[256]{0} get-tuple-element(%w), index=1
}
"""
    rep = analyze(hlo)
    assert rep.launches(in_loops=False) == 1  # the cosine
    assert rep.launches(in_loops=True) == rep.launches() - 1 >= 2 * 8  # the add and the sine, 8 trips (and the compare)


def test_validate_reports_the_errors_of_a_synthetic_runs_file(tmp_path, capsys):
    """Measured values set at known ratios to the model's own prediction: the report must give those ratios."""
    from jaxformer.plan.validate import run_to_case
    hw = Hardware.make("h200")
    runs = []
    for mesh, ratio in (("1 device", 1.25), ("data=2,fsdp=1,tensor=1,pipeline=1", 0.8)):
        rec = dict(device="NVIDIA H200", config="base", seq_len=128, batch_size=64, kernels="pallas", mesh=mesh,
                   microbatches=1, pipeline_repeats=1, remat="none", sequence_parallel=False)
        w, s = run_to_case(rec)
        p = predict(w, s, hw)
        rec.update(ms_per_step=p.step_time_s * 1e3 / ratio, peak_memory_gib=p.memory.total / 2**30 / ratio)
        runs.append(rec)
    path = tmp_path / "runs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in runs))
    png = tmp_path / "v.png"
    assert validate(str(path), hw, plot_path=str(png), as_json=True) == 0
    out = json.loads(capsys.readouterr().out)
    errs = sorted(r["time_err"] for r in out["runs"])
    assert errs == pytest.approx([-0.2, 0.25])
    assert out["time_error"]["max"] == pytest.approx(0.25) and out["memory_error"]["mean"] == pytest.approx(0.225)
    assert png.stat().st_size > 10_000


def test_train_step_record_appends_a_line(tmp_path):
    from benchmarks.train_step import record
    path = tmp_path / "runs.jsonl"
    counts = dict(classes={"contraction": {"flop": 1.0}}, collectives={"all-reduce": {"count": 1, "bytes": 8.0}},
                  launches={"loop": 3, "straight": 5})
    record(str(path), dict(config="tiny", ms_per_step=1.0), counts)
    record(str(path), dict(config="mini", ms_per_step=2.0), None)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [x["config"] for x in lines] == ["tiny", "mini"]
    assert lines[0]["hlo_collectives"]["all-reduce"]["bytes"] == 8.0 and "hlo_classes" not in lines[1]
    assert lines[0]["hlo_launches"] == {"loop": 3, "straight": 5}
    assert all(x["date"] and x["commit"] for x in lines)


def test_hlo_counts_see_every_operand():
    """hlo_analysis alone misses the operands after XLA's /*index=N*/ comments; hlo_counts strips them."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("x",))
    f = jax.shard_map(lambda *xs: tuple(jax.lax.psum(x, "x") for x in xs), mesh=mesh,
                      in_specs=(jax.sharding.PartitionSpec("x"),) * 7, out_specs=(jax.sharding.PartitionSpec(),) * 7)
    args = [jax.ShapeDtypeStruct((2, 16), jnp.float32)] * 7
    text = jax.jit(f).lower(*args).compile().as_text()
    counts = hlo_counts(text)["collectives"]["all-reduce"]
    assert counts["bytes"] == 7 * 2 * 16 * 4  # seven (1, 16) float32 shards in, seven sums out
