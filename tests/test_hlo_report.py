"""jaxformer.hlo_report: flop, bytes and classes of small programs compiled on the CPU, checked by hand."""

import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

from jaxformer.config import TrainConfig
from jaxformer.hlo_report import COLLECTIVES, analyze, compiled_hlo

ROOT = Path(__file__).resolve().parents[1]


def hlo(f, *args):
    return jax.jit(f).lower(*args).compile().as_text()


def spec(shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


def test_einsum_flop_and_bytes():
    b, s, d, f = 2, 8, 16, 32
    rep = analyze(hlo(lambda x, w: jnp.einsum("BSD,DF->BSF", x, w), spec((b, s, d)), spec((d, f))))
    c = rep.classes()["contraction"]
    assert c["flop"] == 2 * b * s * d * f
    assert c["bytes"] == 4 * (b * s * d + d * f + b * s * f)
    assert rep.to_json()["total_bytes"] == c["bytes"]  # nothing else moves data


def test_layernorm_is_normalization():
    r, d = 64, 128

    def ln(x):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) * jax.lax.rsqrt(var + 1e-5)

    classes = analyze(hlo(ln, spec((r, d)))).classes()
    norm = classes["normalization"]
    assert norm["count"] >= 1 and norm["flop"] > 0
    assert norm["bytes"] >= 2 * 4 * r * d  # read x once and write y once, at least
    assert classes["contraction"]["flop"] == 0


def test_fused_elementwise_chain():
    n = 4096
    rep = analyze(hlo(lambda x: (x * 2 + 1).astype(jnp.bfloat16), spec((n,))))
    fusions = [op for op in rep.ops if op.opcode == "fusion"]
    assert len(fusions) == 1 and fusions[0].cls == "elementwise"
    assert fusions[0].bytes == 4 * n + 2 * n
    assert fusions[0].flop >= 2 * n


def test_all_reduce_is_a_collective():
    mesh = Mesh(np.array(jax.devices()[:8]), ("x",))
    f = jax.shard_map(lambda x: jax.lax.psum(x, "x"), mesh=mesh, in_specs=P("x"), out_specs=P())
    rep = analyze(hlo(f, spec((8, 16))))
    ar = rep.collectives()["all-reduce"]
    assert ar["count"] == 1
    assert ar["bytes"] == 2 * 4 * 16  # one (1, 16) f32 shard in, the sum out
    assert set(rep.collectives()) == set(COLLECTIVES)
    assert rep.classes()["collective"]["bytes"] == ar["bytes"]


def test_operands_after_index_comments_are_counted():
    """XLA marks every fifth operand of a wide instruction `/*index=N*/%x`: that operand's bytes count too."""
    text = """HloModule m, entry_computation_layout={()->f32[4]{0}}

ENTRY %main () -> f32[4] {
  %a = f32[4]{0} constant({1, 2, 3, 4})
  %b = f32[4]{0} constant({1, 2, 3, 4})
  %c = f32[4]{0} constant({1, 2, 3, 4})
  %d = f32[4]{0} constant({1, 2, 3, 4})
  %e = f32[4]{0} constant({1, 2, 3, 4})
  %f = f32[4]{0} constant({1, 2, 3, 4})
  ROOT %ar = (f32[4]{0}, f32[4]{0}, f32[4]{0}, f32[4]{0}, f32[4]{0}, f32[4]{0}) all-reduce(%a, %b, %c, %d, %e, /*index=5*/%f), replica_groups={}, to_apply=%add
}
"""
    ar = analyze(text).collectives()["all-reduce"]
    assert ar["count"] == 1 and ar["bytes"] == 2 * 6 * 16  # six f32[4] operands read, six written


def test_while_loop_multiplies_by_trip_count():
    m, k = 16, 32

    def f(x, ws):
        return jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)[0]

    rep = analyze(hlo(f, spec((m, k)), spec((4, k, k))))
    assert rep.classes()["contraction"]["flop"] == 4 * 2 * m * k * k
    assert not any("unknown" in n for n in rep.notes)


def test_trip_count_from_the_loop_condition():
    # Without backend_config, the trip count comes from the condition's `i < 7`.
    text = """HloModule m

%body (p: (s32[], f32[8,8])) -> (s32[], f32[8,8]) {
  %p = (s32[], f32[8,8]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[8,8] get-tuple-element(%p), index=1
  %one = s32[] constant(1)
  %j = s32[] add(%i, %one)
  %y = f32[8,8] dot(%x, %x), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %t = (s32[], f32[8,8]) tuple(%j, %y)
}

%cond (p: (s32[], f32[8,8])) -> pred[] {
  %p = (s32[], f32[8,8]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(7)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main (x: f32[8,8]) -> f32[8,8] {
  %x = f32[8,8] parameter(0)
  %zero = s32[] constant(0)
  %t = (s32[], f32[8,8]) tuple(%zero, %x)
  %w = (s32[], f32[8,8]) while(%t), condition=%cond, body=%body
  ROOT %r = f32[8,8] get-tuple-element(%w), index=1
}
"""
    rep = analyze(text)
    assert rep.classes()["contraction"]["flop"] == 7 * 2 * 8 * 8 * 8
    assert rep.classes()["contraction"]["bytes"] == 7 * 2 * 4 * 64


@pytest.mark.slow
def test_tiny_train_step_matches_analytic_matmul_flop():
    tc = TrainConfig(config="tiny", seq_len=32, batch_size=4, kernels="xla")
    cfg = tc.model_config(30522)
    out = analyze(compiled_hlo(tc)).to_json()
    assert set(out) >= {"classes", "collectives", "total_bytes", "total_flop", "top"}
    assert set(out["classes"]) == {"contraction", "normalization", "elementwise", "collective", "other"}
    b, s, d, f, L = tc.batch_size, tc.seq_len, cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    p = round(0.15 * s)
    tokens = b * s
    layer = 2 * tokens * (4 * d * d + 2 * d * f) + 2 * 2 * b * s * s * d  # QKV, out, FFN; scores and context
    heads = 2 * b * p * (d * d + d * cfg.vocab_size) + 2 * b * d * (d + 2)  # MLM transform + decoder; pooler, NSP
    analytic = 3 * (L * layer + heads)  # forward + backward (2x)
    assert 0.5 * analytic <= out["classes"]["contraction"]["flop"] <= 2 * analytic
    assert out["total_bytes"] > 0 and len(out["top"]) == 15


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "jaxformer.hlo_report", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
def test_cli_json_and_bad_flag():
    r = run_cli("--config", "tiny", "--seq-len", "32", "--batch-size", "4", "--forward-only", "--json", "--top", "3")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["classes"]["contraction"]["flop"] > 0 and len(out["top"]) == 3
    bad = run_cli("--seq-len", "4")
    assert bad.returncode == 2 and "--seq-len" in bad.stderr


@pytest.mark.parametrize("flag", [["--config", "huge"], ["--kernels", "cuda"]])
def test_cli_rejects_unknown_values(flag):
    r = run_cli(*flag)
    assert r.returncode == 2 and flag[0] in r.stderr


GPU_LIKE = """HloModule gpu_like

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%fused_update (param_0: f32[4,64,128], param_1: bf16[64,128], param_2: s32[]) -> f32[4,64,128] {
  %param_0 = f32[4,64,128]{2,1,0} parameter(0)
  %param_1 = bf16[64,128]{1,0} parameter(1)
  %c = f32[64,128]{1,0} convert(%param_1)
  %u = f32[1,64,128]{2,1,0} bitcast(%c)
  %param_2 = s32[] parameter(2)
  %z = s32[] constant(0)
  ROOT %d = f32[4,64,128]{2,1,0} dynamic-update-slice(%param_0, %u, %param_2, %z, %z)
}

ENTRY %main (x: bf16[64,256], w: bf16[256,128], acc: f32[4,64,128], i: s32[]) -> f32[4,64,128] {
  %x = bf16[64,256]{1,0} parameter(0)
  %w = bf16[256,128]{1,0} parameter(1)
  %acc = f32[4,64,128]{2,1,0} parameter(2)
  %i = s32[] parameter(3)
  %gemm = (bf16[64,128]{1,0}, s8[4194304]{0}) custom-call(%x, %w), custom_call_target="__cublas$gemm", \
backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],\
"rhs_contracting_dimensions":["0"],"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]}}}
  %y = bf16[64,128]{1,0} get-tuple-element(%gemm), index=0
  %ln = bf16[64,128]{1,0} custom-call(%y), custom_call_target="__gpu$xla.gpu.triton", \
metadata={op_name="jit(f)/bdrln_fwd/pallas_call"}, backend_config={ir = "MLIR gelu bias"}
  %g = bf16[64,128]{1,0} custom-call(%y), custom_call_target="__gpu$xla.gpu.triton", \
metadata={op_name="jit(f)/bias_gelu_fwd/pallas_call"}, backend_config={ir = "MLIR lse layernorm"}
  %ars = bf16[64,128]{1,0} all-reduce-start(%ln), replica_groups={{0,1}}, to_apply=%add
  %ard = bf16[64,128]{1,0} all-reduce-done(%ars)
  ROOT %upd = f32[4,64,128]{2,1,0} fusion(%acc, %ard, %i), kind=kLoop, calls=%fused_update
}
""".replace("\\\n", "")


def test_gpu_style_module():
    rep = analyze(GPU_LIKE)
    by = {op.name: op for op in rep.ops}
    assert by["gemm"].cls == "contraction" and by["gemm"].flop == 2 * 64 * 128 * 256
    assert by["gemm"].bytes == 2 * (64 * 256 + 256 * 128 + 64 * 128)  # the s8 workspace is not counted
    assert by["ln"].cls == "normalization"
    assert by["g"].cls == "elementwise"  # by its op_name: words inside the kernel's IR blob do not count
    assert rep.collectives()["all-reduce"] == dict(count=1, bytes=2 * 2 * 64 * 128)  # start counted, done free
    # in place: reads the bf16 update (and the index), writes one f32 slice, not the whole [4,64,128] buffer
    assert by["upd"].cls == "elementwise" and by["upd"].bytes == 2 * 64 * 128 + 4 + 4 * 64 * 128


def test_attach_times_joins_by_instruction_name():
    rep = analyze(GPU_LIKE)
    # ns summed over 4 profiled steps, as the trace gives them; "elsewhere" is not in this module's top level
    rep.attach_times({"gemm": 4e6, "ln": 2e6, "ars": 1e6, "upd": 1e6, "elsewhere": 8e6}, steps=4)
    classes = rep.classes()
    assert classes["contraction"]["time_s"] == pytest.approx(1e-3)
    assert classes["normalization"]["time_s"] == pytest.approx(0.5e-3)
    assert classes["collective"]["time_s"] == pytest.approx(0.25e-3)
    assert classes["elementwise"]["time_s"] == pytest.approx(0.25e-3)
    assert rep.to_json()["total_time_s"] == pytest.approx(2e-3)
    assert any("2.000 ms" in n and "4.000 ms" in n for n in rep.notes)  # unmatched time, and the total
    assert [op.name for op in rep.top(2)] == ["gemm", "ln"]  # with a profile: by measured time


def test_profile_joins_a_real_trace():
    """The CPU's thunk executor annotates its events with hlo_op too: the whole --profile path runs here."""
    from jaxformer.hlo_profile import profile_compiled

    x, w = jnp.ones((256, 256)), jnp.ones((256, 256))
    compiled = jax.jit(lambda x, w: jnp.tanh(x @ w) * 2.0 + x).lower(x, w).compile()
    times = profile_compiled(compiled, (x, w), steps=2, log=lambda m: None)
    rep = analyze(compiled.as_text())
    assert rep.attach_times(times, 2) == 0.0  # every measured event belongs to a top-level operator
    assert sum(c["time_s"] for c in rep.classes().values()) > 0
    # by="both" (benchmarks/kernels.py --profile): the same events keyed "instruction: kernel name"
    both = profile_compiled(compiled, (x, w), steps=2, log=lambda m: None, by="both")
    assert both and all(": " in k for k in both) and {k.split(": ")[0] for k in both} <= set(times)


def test_busy_time_is_the_union_of_kernel_intervals():
    """busy_ns against a brute-force count of covered nanoseconds on random overlapping intervals (several streams)."""
    import numpy as np
    from jaxformer.hlo_profile import busy_ns

    assert busy_ns([]) == (0, 0, 0)
    assert busy_ns([(5, 9)]) == (4, 4, 0)
    assert busy_ns([(0, 10), (2, 3), (12, 15)]) == (15, 13, 1)  # nested, then a gap of 2
    rng = np.random.default_rng()
    for _ in range(20):
        starts = rng.integers(0, 500, size=rng.integers(1, 40))
        ivs = [(int(a), int(a + rng.integers(1, 30))) for a in starts]
        covered = np.zeros(600, bool)
        for a, b in ivs:
            covered[a:b] = True
        lo, hi = min(a for a, _ in ivs), max(b for _, b in ivs)
        runs = np.flatnonzero(np.diff(covered[lo:hi].astype(int)) == 1)  # idle -> busy edges inside the span
        assert busy_ns(rng.permutation(np.array(ivs)).tolist()) == (hi - lo, int(covered.sum()), len(runs))


def test_cli_profile_flag_errors():
    r = run_cli("--profile", "0")
    assert r.returncode == 2 and "--profile" in r.stderr
    r = run_cli("--profile", "--forward-only")
    assert r.returncode == 2 and "--forward-only" in r.stderr


ASYNC_FUSION = """HloModule async_like

%slice_comp (p0: bf16[24,64,128], p1: s32[]) -> bf16[1,64,128] {
  %p0 = bf16[24,64,128]{2,1,0} parameter(0)
  %p1 = s32[] parameter(1)
  %z = s32[] constant(0)
  ROOT %ds = bf16[1,64,128]{2,1,0} dynamic-slice(%p0, %p1, %z, %z), dynamic_slice_sizes={1,64,128}
}

ENTRY %main (w: bf16[24,64,128], i: s32[]) -> bf16[1,64,128] {
  %w = bf16[24,64,128]{2,1,0} parameter(0)
  %i = s32[] parameter(1)
  %fs = ((bf16[24,64,128]{2,1,0}, s32[]), bf16[1,64,128]{2,1,0}, s32[]) fusion-start(%w, %i), kind=kLoop, \
calls=%slice_comp
  ROOT %fd = bf16[1,64,128]{2,1,0} fusion-done(%fs)
}
""".replace("\\\n", "")


def test_async_fusion_costs_its_slice_and_inner_names_join():
    rep = analyze(ASYNC_FUSION)
    by = {op.name: op for op in rep.ops}
    # reads one [64,128] slice of the stacked buffer (not all 24 layers) and writes it; the -done is free
    assert by["fs"].bytes == 2 * 2 * 64 * 128 + 4 and by["fd"].bytes == 0
    # a kernel annotated with an inner instruction's name, or with "_" for ".", joins its launching operator
    rep.attach_times({"ds": 3e6, "fs_unknown": 1e6}, steps=1)
    assert by["fs"].time_s == pytest.approx(3e-3)
    rep2 = analyze(ASYNC_FUSION.replace("%fs", "%fs.7"))
    rep2.attach_times({"fs_7": 2e6}, steps=2)
    assert {op.name: op for op in rep2.ops}["fs.7"].time_s == pytest.approx(1e-3)


KERNEL_ON_A_SLICE = """HloModule kernel_on_slice

%dsf (p0: bf16[24,1024], p1: bf16[8192,1024]) -> bf16[8192,1024] {
  %p0 = bf16[24,1024]{1,0} parameter(0)
  %p1 = bf16[8192,1024]{1,0} parameter(1)
  %s = bf16[1,1024]{1,0} slice(%p0), slice={[3:4], [0:1024]}
  %b = bf16[1024]{0} bitcast(%s)
  ROOT %k = bf16[8192,1024]{1,0} custom-call(%p1, %b), custom_call_target="mosaic_gpu_v2", \
metadata={op_name="jit(step)/bdrln_forward"}
}

ENTRY %main (w: bf16[24,1024], x: bf16[8192,1024]) -> bf16[8192,1024] {
  %w = bf16[24,1024]{1,0} parameter(0)
  %x = bf16[8192,1024]{1,0} parameter(1)
  ROOT %dynamic_slice_fusion.1 = bf16[8192,1024]{1,0} fusion(%w, %x), kind=kCustom, calls=%dsf
}
""".replace("\\\n", "")


def test_a_kernel_fused_with_its_operand_slices_is_classed_as_the_kernel():
    """XLA fuses a Pallas call on one layer's slice of the stacked weights with that slice: the fusion is the
    kernel's work (here a layer norm), not elementwise."""
    op = next(o for o in analyze(KERNEL_ON_A_SLICE).ops if o.name == "dynamic_slice_fusion.1")
    assert op.cls == "normalization"
    plain = next(o for o in analyze(KERNEL_ON_A_SLICE.replace("bdrln_forward", "kernel")).ops
                 if o.name == "dynamic_slice_fusion.1")
    assert plain.cls == "other"


GEMM_ON_A_SLICE = """HloModule gemm_on_slice

%dsf (p0: bf16[24,1024,4096], p1: bf16[8192,1024]) -> (bf16[8192,4096], s8[33554432]) {
  %p1 = bf16[8192,1024]{1,0} parameter(1)
  %p0 = bf16[24,1024,4096]{2,1,0} parameter(0)
  %s = bf16[1,1024,4096]{2,1,0} slice(%p0), slice={[0:1], [0:1024], [0:4096]}
  %b = bf16[1024,4096]{1,0} bitcast(%s)
  ROOT %g = (bf16[8192,4096]{1,0}, s8[33554432]{0}) custom-call(%p1, %b), custom_call_target="__cublas$lt$matmul", \
backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_batch_dimensions":[],\
"lhs_contracting_dimensions":["1"],"rhs_batch_dimensions":[],"rhs_contracting_dimensions":["0"]}}}
}

ENTRY %main (w: bf16[24,1024,4096], x: bf16[8192,1024]) -> (bf16[8192,4096], s8[33554432]) {
  %w = bf16[24,1024,4096]{2,1,0} parameter(0)
  %x = bf16[8192,1024]{1,0} parameter(1)
  ROOT %dynamic_slice_fusion.2 = (bf16[8192,4096]{1,0}, s8[33554432]{0}) fusion(%w, %x), kind=kCustom, calls=%dsf
}
""".replace("\\\n", "")


def test_a_gemm_fused_with_its_weight_slice_counts_its_flop():
    """cuBLAS on one layer's slice of the stacked weights: 2 m n k flop, not the elements of its outputs."""
    op = next(o for o in analyze(GEMM_ON_A_SLICE).ops if o.name == "dynamic_slice_fusion.2")
    assert op.cls == "contraction" and op.flop == 2.0 * 8192 * 4096 * 1024
