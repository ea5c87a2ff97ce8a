"""Mosaic GPU kernels (`kernel_mgpu.py` of bias_gelu and BDRLN) against the jax.numpy references: forward, and the
backward against the reference's VJP, on fresh random inputs, with dropout and a non-zero row offset.

On the CPU they run in Mosaic GPU's interpret mode (`InterpretGPUParams`): that proves the math and the indexing,
with the TMA pipeline replaced by a plain loop (see `pallas_kernels._mgpu.pipeline`). The `gpu`-marked tests compile
them (Hopper or newer only; skipped elsewhere) on BERT shapes.
"""

import dataclasses
import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import _mgpu
from pallas_kernels import _pallas as pk
from pallas_kernels.bias_dropout_residual_layernorm import kernel_mgpu as ln_mgpu
from pallas_kernels.bias_dropout_residual_layernorm import reference as ln_ref
from pallas_kernels.bias_gelu import kernel_mgpu as bg_mgpu
from pallas_kernels.bias_gelu import reference as bg_ref
from pallas_kernels.dropout import seed_from_key

TOL = {jnp.float32: 1e-5, jnp.bfloat16: 2e-2}


interpret_only = pytest.mark.skipif(not _mgpu.interpret_available(), reason="needs Mosaic GPU interpret mode on CPU")
needs_hopper = pytest.mark.skipif(not bg_mgpu.supported(), reason="needs a Hopper-or-newer GPU")


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.isfinite(a).all()
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


def _inputs(seed, rows, width, dtype, row_offset):
    """Arrays for rows [row_offset, row_offset + rows) of a tensor with `row_offset + rows` rows."""
    k = jax.random.split(jax.random.key(seed), 8)
    full = row_offset + rows
    xs = [jax.random.normal(k[i], (full, width), dtype) for i in (0, 1, 2)]  # x, residual, cotangent
    return k, xs, seed_from_key(k[7])


# ---------------------------------------------------------------------------------------------------- bias + GELU

def _bias_gelu_case(rows, width, dtype, rate, row_offset, *, interpret, blocks=None, seed=0):
    k, (x_full, _, g_full), drop_seed = _inputs(seed, rows, width, dtype, row_offset)
    bias = jax.random.normal(k[3], (width,))
    sl = slice(row_offset, row_offset + rows)
    g_full = jnp.zeros_like(g_full).at[sl].set(g_full[sl])  # the cotangent of the rows the kernel sees
    blocks = blocks or bg_mgpu.default_blocks(rows, width, rate=rate)
    words = pk.seed_words(drop_seed, row_offset)
    run = functools.partial(bg_mgpu.forward, rate=rate, interpret=interpret, blocks=blocks)
    run_bwd = functools.partial(bg_mgpu.backward, rate=rate, interpret=interpret, blocks=blocks)
    x = x_full[sl]
    y = jax.jit(run)(x, bias, words)
    dx, dbias = jax.jit(run_bwd)(x, bias, words, g_full[sl])

    y_ref, vjp = jax.vjp(lambda x, b: bg_ref.bias_gelu(x, b, seed=drop_seed, rate=rate), x_full, bias)
    dx_ref, db_ref = vjp(g_full)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert _rel(y, y_ref[sl]) < TOL[dtype], "forward"
    assert dx.dtype == x.dtype and _rel(dx, dx_ref[sl]) < TOL[dtype], "dx"
    assert dbias.dtype == jnp.float32 and dbias.shape[1] == width
    assert _rel(jnp.sum(dbias, axis=0), db_ref) < TOL[dtype], "dbias"


@interpret_only
@pytest.mark.parametrize("dtype,rate,row_offset", [
    (jnp.bfloat16, 0.0, 0),
    (jnp.bfloat16, 0.1, 6),   # dropout, a shard that starts at row 6
    (jnp.float32, 0.2, 0),
])
def test_bias_gelu_mgpu_interpret(dtype, rate, row_offset):
    width = 512 if dtype == jnp.bfloat16 else 256
    for interleave in (False, True):  # a contiguous run of tiles per program, or round-robin
        blocks = bg_mgpu.Blocks(block_rows=2, programs=2, bwd_block_rows=2, bwd_programs=2, interleave=interleave)
        _bias_gelu_case(8, width, dtype, rate, row_offset, interpret=True, blocks=blocks)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("rows,width,rate", [(8192, 3072, 0.0), (8192, 4096, 0.1), (32768, 4096, 0.0)])
def test_bias_gelu_mgpu_on_gpu(rows, width, rate):
    _bias_gelu_case(rows, width, jnp.bfloat16, rate, 64, interpret=False)
    default = bg_mgpu.default_blocks(rows, width, rate=rate)  # and the other tile order
    _bias_gelu_case(rows, width, jnp.bfloat16, rate, 64, interpret=False,
                    blocks=dataclasses.replace(default, interleave=not default.interleave))


@pytest.mark.parametrize("dtype", [
    pytest.param(jnp.float32, marks=interpret_only),  # the formula (1/Q is a division in interpret mode)
    pytest.param(jnp.bfloat16, marks=[pytest.mark.gpu, needs_hopper]),
    pytest.param(jnp.float32, marks=[pytest.mark.gpu, needs_hopper], id="float32-gpu")])
def test_bias_gelu_mgpu_approx_math(dtype):
    """`approx_math`: exp as ex2.approx and erf's 1/Q as rcp.approx.ftz, within the same bound of the reference."""
    on_gpu = jax.default_backend() == "gpu"
    rows, width = (4096, 3072) if on_gpu else (8, 256)
    blocks = (bg_mgpu.default_blocks(rows, width, rate=0.1) if on_gpu
              else bg_mgpu.Blocks(block_rows=2, programs=2, bwd_block_rows=2, bwd_programs=2))
    _bias_gelu_case(rows, width, dtype, 0.1, 64 if on_gpu else 6, interpret=not on_gpu,
                    blocks=dataclasses.replace(blocks, approx_math=True))


# ------------------------------------------------------------------------------------------------------- BDRLN

def _bdrln_case(rows, width, dtype, rate, row_offset, *, plain=False, interpret, blocks=None, seed=1):
    k, (x_full, r_full, g_full), drop_seed = _inputs(seed, rows, width, dtype, row_offset)
    bias = None if plain else jax.random.normal(k[3], (width,))
    res_full = None if plain else r_full
    scale = 1 + 0.2 * jax.random.normal(k[4], (width,))
    shift = jax.random.normal(k[5], (width,))
    sl = slice(row_offset, row_offset + rows)
    g_full = jnp.zeros_like(g_full).at[sl].set(g_full[sl])
    blocks = blocks or ln_mgpu.default_blocks(rows, width, rate=rate)
    words = pk.seed_words(drop_seed, row_offset)
    eps = 1e-12
    x, res = x_full[sl], None if plain else res_full[sl]
    fwd = jax.jit(functools.partial(ln_mgpu.forward, rate=rate, eps=eps, interpret=interpret, blocks=blocks))
    bwd = jax.jit(functools.partial(ln_mgpu.backward, rate=rate, interpret=interpret, blocks=blocks))
    y, mean, rstd = fwd(x, bias, res, scale, shift, words)
    dx, dres, dscale, dshift, dbias = bwd(x, bias, res, scale, words, mean, rstd, g_full[sl])

    if plain:
        ref = lambda x, s, t: ln_ref.layer_norm(x, s, t, eps=eps)  # noqa: E731
        y_ref, vjp = jax.vjp(ref, x_full, scale, shift)
        dx_ref, ds_ref, dt_ref = vjp(g_full)
    else:
        ref = lambda x, b, r, s, t: ln_ref.bias_dropout_residual_layernorm(  # noqa: E731
            x, b, r, s, t, seed=drop_seed, rate=rate, eps=eps)
        y_ref, vjp = jax.vjp(ref, x_full, bias, res_full, scale, shift)
        dx_ref, db_ref, dres_ref, ds_ref, dt_ref = vjp(g_full)
    h = x.astype(jnp.float32)
    if not plain:  # the statistics the forward saved, from the reference's h
        from pallas_kernels.dropout import dropout
        h = dropout(x_full.astype(jnp.float32) + bias, drop_seed, rate)[sl] + res.astype(jnp.float32)
    assert y.dtype == (x if plain else res).dtype and y.shape == x.shape
    assert _rel(y, y_ref[sl]) < TOL[dtype], "forward"
    assert _rel(mean, jnp.mean(h, axis=1)) < 1e-5, "mean"
    assert _rel(rstd, jax.lax.rsqrt(jnp.var(h, axis=1) + eps)) < 1e-4, "rstd"
    assert _rel(dx, dx_ref[sl]) < TOL[dtype], "dx"
    if not plain:
        assert (dres is None) == (rate == 0.0), "d_residual is written only with dropout"
        assert _rel(dx if dres is None else dres, dres_ref[sl]) < TOL[dtype], "d_residual"
        assert _rel(jnp.sum(dbias, axis=0), db_ref) < TOL[dtype], "dbias"
    else:
        assert dres is None and dbias is None
    assert _rel(jnp.sum(dscale, axis=0), ds_ref) < TOL[dtype], "dscale"
    assert _rel(jnp.sum(dshift, axis=0), dt_ref) < TOL[dtype], "dshift"


@interpret_only
@pytest.mark.parametrize("dtype,rate,row_offset,plain", [
    (jnp.bfloat16, 0.0, 0, False),
    (jnp.bfloat16, 0.1, 4, False),
    (jnp.float32, 0.2, 0, False),
    (jnp.float32, 0.0, 0, True),   # the MLM head's plain layernorm: no bias, no residual
])
def test_bdrln_mgpu_interpret(dtype, rate, row_offset, plain):
    width = 256  # the smallest the kernel takes (TMA boxes of 256 columns; 32 lanes x 8 bf16)
    for n_reg, direct in ((0, False), (2, True), (3, False)):  # how many of the backward's column sums are register
        # carries (the rest SMEM tiles); the forward's y through SMEM or straight from registers, and its dropout
        # mask drawn a step ahead or not; with Pallas' barriers or the kernels' own; the backward's row statistics
        # from SMEM or prefetched from GMEM
        blocks = ln_mgpu.Blocks(block_rows=4, programs=2, bwd_block_rows=4, bwd_programs=2, bwd_register_sums=n_reg,
                                fwd_direct_store=direct, fwd_mask_ahead=direct, auto_barriers=n_reg != 2,
                                bwd_params_smem=n_reg != 0, bwd_stats_smem=n_reg != 2, fwd_interleave=n_reg == 2,
                                bwd_interleave=n_reg != 0)
        _bdrln_case(16, width, dtype, rate, row_offset, plain=plain, interpret=True, blocks=blocks)


@interpret_only
def test_bdrln_mgpu_statistics_copied_in_chunks(monkeypatch):
    """The backward's row statistics reach SMEM in several TMA copies when a program has more rows than one TMA box
    holds (here boxes of 2 steps for 8 steps per program: four copies per statistic on one barrier), in either
    tile order."""
    monkeypatch.setattr(ln_mgpu, "_TMA_BOX", 2)
    for interleave in (False, True):
        blocks = ln_mgpu.Blocks(block_rows=4, programs=2, bwd_block_rows=4, bwd_programs=2, bwd_register_sums=3,
                                bwd_interleave=interleave)
        _bdrln_case(64, 256, jnp.float32, 0.1, 4, interpret=True, blocks=blocks)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("rows,width,rate,plain", [
    (8192, 768, 0.1, False), (8192, 1024, 0.0, False), (32768, 1024, 0.1, False), (8192, 1024, 0.0, True)])
def test_bdrln_mgpu_on_gpu(rows, width, rate, plain):
    _bdrln_case(rows, width, jnp.bfloat16, rate, 64, plain=plain, interpret=False)
    default = ln_mgpu.default_blocks(rows, width, rate=rate)
    for i, n_reg in enumerate(sorted({0, 1, 2, 3} - {default.bwd_register_sums})):  # every other split of the
        # column sums (registers / SMEM), with the other store of the forward's y, the other draw of its mask, the
        # other barriers (Pallas' or the kernels' own) and the backward's statistics prefetched from GMEM; the tile
        # order flipped in the first variant only (the prefetch then reads both orders' windows)
        flip = i == 0
        other = dataclasses.replace(default, bwd_register_sums=n_reg, fwd_direct_store=not default.fwd_direct_store,
                                    fwd_mask_ahead=not default.fwd_mask_ahead,
                                    auto_barriers=not default.auto_barriers,
                                    bwd_params_smem=not default.bwd_params_smem,
                                    bwd_stats_smem=not default.bwd_stats_smem,
                                    fwd_interleave=default.fwd_interleave != flip,
                                    bwd_interleave=default.bwd_interleave != flip)
        _bdrln_case(rows, width, jnp.bfloat16, rate, 64, plain=plain, interpret=False, blocks=other)


# ------------------------------------------------------------------------------------- lowering, on any machine

def _bdrln_compiled(stage: str, rows: int, width: int, blocks, rate: float = 0.1):
    """BDRLN's compiled (not interpreted) Mosaic GPU forward or backward (`stage`) with bias and residual, and zero
    operands of a (rows, width) bf16 shard, to lower for CUDA."""
    words = pk.seed_words(jnp.array([1, 2], jnp.uint32))
    x, v, st = jnp.zeros((rows, width), jnp.bfloat16), jnp.zeros((width,)), jnp.zeros((rows,))
    kw = dict(rate=rate, interpret=False, blocks=blocks)
    if stage == "fwd":
        return functools.partial(ln_mgpu.forward, eps=1e-12, **kw), (x, v, x, v, v, words)
    return functools.partial(ln_mgpu.backward, **kw), (x, v, x, v, words, st, st, x)


@pytest.mark.parametrize("op", ["bias_gelu_fwd", "bias_gelu_bwd", "bdrln_fwd", "bdrln_bwd"])
def test_mgpu_lowers_for_cuda(op):
    """The compiled (not interpreted) kernels lower to Mosaic GPU modules for CUDA on BERT shapes: layouts, TMA
    boxes and the SMEM budget are checked here even without a GPU (PTX compilation and the run are not). This runs
    all of Mosaic GPU's Python passes; under jax 0.11 it reproduced the GPU's compile errors (Warpgroup-semantics
    layout inference) before `kernel_call` pinned Lane semantics. Two call sites lower to one Mosaic GPU custom call
    (`_mgpu.one_module`), so a model's layers share one compiled kernel."""
    words = pk.seed_words(jnp.array([1, 2], jnp.uint32))
    if op.startswith("bias_gelu"):
        x, v = jnp.zeros((8192, 4096), jnp.bfloat16), jnp.zeros((4096,))
        kw = dict(rate=0.1, interpret=False, blocks=bg_mgpu.default_blocks(8192, 4096, rate=0.1))
        fn, args = ((functools.partial(bg_mgpu.forward, **kw), (x, v, words)) if op.endswith("fwd")
                    else (functools.partial(bg_mgpu.backward, **kw), (x, v, words, x)))
    else:
        fn, args = _bdrln_compiled(op[-3:], 8192, 768, ln_mgpu.default_blocks(8192, 768, rate=0.1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lowered = jax.jit(lambda *a: (fn(*a), fn(*a))).trace(*args).lower(lowering_platforms=("cuda",))
    assert lowered.as_text().count("stablehlo.custom_call @mosaic_gpu") == 1
    if op.startswith("bias_gelu"):  # erf's 1/Q through `_mgpu.reciprocal`'s inline PTX, not an IEEE division
        assert "rcp.approx.ftz.f32" in lowered.as_text()
    # jax >= 0.11 deprecates plgpu.load's separate index argument (`_mgpu.load` avoids it there).
    assert not [w for w in caught if "index separately" in str(w.message)]


@pytest.mark.parametrize("rows,width,in_smem", [(8192, 1024, True), (12288, 1024, False), (2048, 768, False)])
def test_bdrln_backward_lowers_for_any_step_count(rows, width, in_smem):
    """The backward's statistics go to SMEM in one TMA copy per program only where that copy is a multiple of 128
    bytes (Mosaic GPU rejects others at lowering: 12288 rows are 256 programs of 12 steps of 4 rows, 192 bytes; 2048
    rows 2 steps); elsewhere the kernel prefetches them from GMEM and lowers all the same."""
    blocks = ln_mgpu.default_blocks(rows, width, rate=0.1)
    _, steps = _mgpu.split_programs(rows // blocks.bwd_block_rows, blocks.bwd_programs)
    assert ln_mgpu.stats_in_smem(blocks, steps) is in_smem
    fn, args = _bdrln_compiled("bwd", rows, width, blocks)
    assert "mosaic_gpu" in jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("rows,width", [(12288, 1024), (2048, 768)])
def test_bdrln_mgpu_on_gpu_any_step_count(rows, width):
    """Shapes whose programs' statistics do not fill 128-byte TMA copies (the backward prefetches them instead)."""
    _bdrln_case(rows, width, jnp.bfloat16, 0.1, 64, plain=False, interpret=False)


def test_reciprocal_falls_back_to_a_division(monkeypatch):
    """Where a jax lacks the private Mosaic GPU hooks `_mgpu.reciprocal` uses for rcp.approx.ftz, bias+GELU's kernels
    still lower, with a division (the shape differs from the test above: no cached trace)."""
    monkeypatch.setattr(_mgpu, "_has_fast_instr", lambda: False)
    words = pk.seed_words(jnp.array([1, 2], jnp.uint32))
    x, v = jnp.zeros((4096, 3072), jnp.bfloat16), jnp.zeros((3072,))
    fn = functools.partial(bg_mgpu.forward, rate=0.1, interpret=False,
                           blocks=bg_mgpu.default_blocks(4096, 3072, rate=0.1))
    text = jax.jit(fn).trace(x, v, words).lower(lowering_platforms=("cuda",)).as_text()
    assert "stablehlo.custom_call @mosaic_gpu" in text and "rcp.approx.ftz.f32" not in text


# ------------------------------------------------------------------------------------------------ shape checks

def test_mgpu_rejects_shapes_it_cannot_take():
    words = pk.seed_words(None)
    x = jnp.zeros((8, 1000), jnp.bfloat16)
    with pytest.raises(ValueError, match="width=1000"):
        bg_mgpu.forward(x, jnp.zeros((1000,)), words, rate=0.0, interpret=True, blocks=bg_mgpu.Blocks())
    with pytest.raises(ValueError, match="rows=7"):
        bg_mgpu.forward(jnp.zeros((7, 512), jnp.bfloat16), jnp.zeros((512,)), words, rate=0.0, interpret=True,
                        blocks=bg_mgpu.Blocks(block_rows=2))
    with pytest.raises(ValueError, match="multiple of 4"):
        ln_mgpu.forward(jnp.zeros((12, 768), jnp.bfloat16), None, None, jnp.ones((768,)), jnp.zeros((768,)), words,
                        rate=0.0, eps=1e-12, interpret=True, blocks=ln_mgpu.Blocks(block_rows=6))


def test_supported_is_false_off_hopper():
    if jax.default_backend() != "gpu":
        assert not bg_mgpu.supported() and not ln_mgpu.supported()


# ---------------------------------------------------------------------------------- behind the public functions

@interpret_only
def test_public_functions_run_the_mgpu_backend():
    """`backend="mgpu"` runs the Mosaic GPU kernels behind the same custom VJPs as the Triton ones (interpret mode
    here): values and gradients equal the references."""
    from pallas_kernels.bias_dropout_residual_layernorm import bias_dropout_residual_layernorm
    from pallas_kernels.bias_gelu import bias_gelu
    k, (x, r, g), seed = _inputs(5, 8, 256, jnp.float32, 0)
    b, s, t = (jax.random.normal(k[i], (256,)) for i in (3, 4, 5))
    blocks = bg_mgpu.Blocks(block_rows=2, programs=2, bwd_block_rows=2, bwd_programs=2)
    got = jax.vjp(lambda x, b: bias_gelu(x, b, seed=seed, rate=0.1, blocks=blocks, backend="mgpu"), x, b)
    want = jax.vjp(lambda x, b: bg_ref.bias_gelu(x, b, seed=seed, rate=0.1), x, b)
    assert _rel(got[0], want[0]) < TOL[jnp.float32]
    for a, w in zip(got[1](g), want[1](g)):
        assert _rel(a, w) < TOL[jnp.float32]
    kw = dict(seed=seed, rate=0.1, eps=1e-12)
    blocks = ln_mgpu.Blocks(block_rows=4, programs=2, bwd_block_rows=4, bwd_programs=2)
    got = jax.vjp(lambda *a: bias_dropout_residual_layernorm(*a, **kw, blocks=blocks, backend="mgpu"), x, b, r, s, t)
    want = jax.vjp(lambda *a: ln_ref.bias_dropout_residual_layernorm(*a, **kw), x, b, r, s, t)
    assert _rel(got[0], want[0]) < TOL[jnp.float32]
    for a, w in zip(got[1](g), want[1](g)):
        assert _rel(a, w) < TOL[jnp.float32]
    with pytest.raises(ValueError, match="backend='cuda'"):
        bias_gelu(x, b, backend="cuda")


def test_auto_backend_picks_per_shape(monkeypatch):
    """bias_gelu's default backend ("auto"): Triton off Hopper; on Hopper+ Mosaic GPU where its shape checks pass,
    Triton where they do not (a width that is no multiple of the lanes); with `blocks=`, the blocks' backend."""
    import pallas_kernels.bias_gelu as bg
    x = jnp.zeros((8192, 4096), jnp.bfloat16)
    monkeypatch.setattr(bg._k_mgpu, "supported", lambda: False)
    assert bg._PerShape.pick(x, 0.0)[0] is bg._k
    monkeypatch.setattr(bg._k_mgpu, "supported", lambda: True)
    assert bg._PerShape.pick(x, 0.0)[0] is bg._k_mgpu
    assert bg._PerShape.pick(jnp.zeros((1000, 1000), jnp.bfloat16), 0.0)[0] is bg._k
    # With blocks, "auto" runs the backend whose Blocks they are (as BDRLN's does); other objects are refused.
    calls, real = [], bg._k.forward
    monkeypatch.setattr(bg._k, "forward", lambda *a, **k: calls.append(k["blocks"]) or real(*a, **k))
    blocks = bg._k.default_blocks(8, 256)
    y = bg.bias_gelu(jnp.ones((8, 256)), jnp.zeros((256,)), blocks=blocks, interpret=True)
    assert calls == [blocks] and _rel(y, bg.reference.bias_gelu(jnp.ones((8, 256)), jnp.zeros((256,)))) < 1e-6
    with pytest.raises(ValueError, match=r"blocks=\(8, 256\) must be a kernel.Blocks"):
        bg.bias_gelu(x[:8, :256], jnp.zeros((256,)), blocks=(8, 256))


def test_bdrln_auto_backend_picks_per_shape(monkeypatch):
    """BDRLN's default backend ("auto"): Triton off Hopper; on Hopper+ Mosaic GPU for shards of >= MIN_MGPU_ROWS rows
    (>= MIN_MGPU_ROWS_REGISTER_SUMS where its backward carries column sums in registers: 768 and 1024 wide) where its
    shape checks pass (measured faster there, sessions 20-22), Triton below that, where they fail, and where
    `TRITON_FROM_ROWS` names the GPU (the H100 at 32768 x 1024 with dropout)."""
    import pallas_kernels.bias_dropout_residual_layernorm as ln
    bf = jnp.bfloat16
    monkeypatch.setattr(ln._k_mgpu, "supported", lambda: False)
    assert ln._PerShape.pick(jnp.zeros((16384, 1024), bf), bf)[0] is ln._k
    monkeypatch.setattr(ln._k_mgpu, "supported", lambda: True)
    assert ln._PerShape.pick(jnp.zeros((16384, 1024), bf), bf)[0] is ln._k_mgpu
    assert ln._PerShape.pick(jnp.zeros((32768, 768), bf), jnp.float32)[0] is ln._k_mgpu
    assert ln._PerShape.pick(jnp.zeros((8192, 1024), bf), bf)[0] is ln._k_mgpu  # register sums: from 8192 rows
    assert ln._PerShape.pick(jnp.zeros((8192, 768), bf), bf)[0] is ln._k_mgpu
    assert ln._PerShape.pick(jnp.zeros((4096, 768), bf), bf)[0] is ln._k
    assert ln._PerShape.pick(jnp.zeros((8192, 2048), bf), bf)[0] is ln._k  # no register sums: below MIN_MGPU_ROWS
    assert ln._PerShape.pick(jnp.zeros((16384, 2048), bf), bf)[0] is ln._k_mgpu
    assert ln._PerShape.pick(jnp.zeros((16384, 1000), bf), bf)[0] is ln._k  # no multiple of the lanes
    assert ln._PerShape.pick(jnp.zeros((32768, 1024), bf), bf)[0] is ln._k_mgpu
    monkeypatch.setattr(ln._mgpu, "device_kind", lambda: "NVIDIA H100 80GB HBM3")  # TRITON_FROM_ROWS
    assert ln._PerShape.pick(jnp.zeros((32768, 1024), bf), bf, 0.1)[0] is ln._k  # with dropout only
    assert [m for m, _ in ln._PerShape.backends(jnp.zeros((32768, 1024), bf), bf, 0.1)] == [ln._k, ln._k_mgpu]
    assert ln._PerShape.pick(jnp.zeros((32768, 1024), bf), bf)[0] is ln._k_mgpu
    assert ln._PerShape.pick(jnp.zeros((16384, 1024), bf), bf, 0.1)[0] is ln._k_mgpu
    assert ln._PerShape.pick(jnp.zeros((32768, 768), bf), bf, 0.1)[0] is ln._k_mgpu
    x = jnp.zeros((8, 256), jnp.float32)
    with pytest.raises(ValueError, match=r"must be a kernel.Blocks \(Triton\) or a kernel_mgpu.Blocks"):
        ln.layer_norm(x, jnp.ones(256), jnp.zeros(256), eps=1e-12, blocks=bg_mgpu.Blocks())


def _bdrln_auto_case(monkeypatch, rows, dtype, blocks_list):
    """The public function without `backend=` runs the kernels `_PerShape` picks, Mosaic GPU here, in the forward
    and the backward (each blocks of `blocks_list`: None, or one backend's `Blocks`, whose class selects it); values
    and gradients equal the reference's."""
    import pallas_kernels.bias_dropout_residual_layernorm as ln
    calls = []
    for name in ("forward", "backward"):
        real = getattr(ln._k_mgpu, name)
        monkeypatch.setattr(ln._k_mgpu, name, lambda *a, real=real, name=name, **k: calls.append(name) or real(*a, **k))
    k, (x, r, g), seed = _inputs(6, rows, 768 if rows > 8 else 256, dtype, 0)
    width = x.shape[1]
    b, s, t = (jax.random.normal(k[i], (width,)) for i in (3, 4, 5))
    kw = dict(seed=seed, rate=0.1, eps=1e-12)
    want = jax.vjp(lambda *a: ln_ref.bias_dropout_residual_layernorm(*a, **kw), x, b, r, s, t)
    for blocks in blocks_list:
        calls.clear()
        got = jax.vjp(lambda *a: ln.bias_dropout_residual_layernorm(*a, **kw, blocks=blocks), x, b, r, s, t)
        grads = got[1](g)
        assert calls == ["forward", "backward"], (blocks, calls)
        assert _rel(got[0], want[0]) < TOL[dtype]
        for a, w in zip(grads, want[1](g)):
            assert _rel(a, w) < TOL[dtype]


@interpret_only
def test_bdrln_auto_backend_runs_what_it_picks(monkeypatch):
    """As `_bdrln_auto_case`, in interpret mode: Mosaic GPU "supported" and its row threshold lowered to 8 rows."""
    import pallas_kernels.bias_dropout_residual_layernorm as ln
    monkeypatch.setattr(ln._k_mgpu, "supported", lambda: True)
    monkeypatch.setattr(ln, "MIN_MGPU_ROWS", 8)
    monkeypatch.setattr(ln, "MIN_MGPU_ROWS_REGISTER_SUMS", 8)
    _bdrln_auto_case(monkeypatch, 8, jnp.float32,
                     [None, ln_mgpu.Blocks(block_rows=4, programs=2, bwd_block_rows=4, bwd_programs=2)])


@pytest.mark.gpu
@needs_hopper
def test_bdrln_auto_backend_on_gpu(monkeypatch):
    """As `_bdrln_auto_case`, compiled: 16384 x 768 bf16 with dropout, the default threshold (Mosaic GPU's side)."""
    _bdrln_auto_case(monkeypatch, 16384, jnp.bfloat16, [None])


def test_bdrln_mgpu_blocks_register_sums_from_bool():
    """Session 21's `bwd_register_sums` was a bool (all or none of the sums), and autotune caches hold that form."""
    assert ln_mgpu.Blocks(bwd_register_sums=True).bwd_register_sums == 3
    assert ln_mgpu.Blocks(bwd_register_sums=False).bwd_register_sums == 0
    assert ln_mgpu.Blocks(bwd_register_sums=2).bwd_register_sums == 2


def test_bdrln_mgpu_default_register_sums_per_width_and_rate():
    """All three sums in registers at 768 wide; at 1024 all three with dropout (the bias and LN scale in SMEM,
    session 25), two without (session 22's measurements)."""
    assert ln_mgpu.default_blocks(8192, 768).bwd_register_sums == 3
    assert ln_mgpu.default_blocks(8192, 768, rate=0.1).bwd_register_sums == 3
    assert not ln_mgpu.default_blocks(8192, 768, rate=0.1).bwd_params_smem
    assert ln_mgpu.default_blocks(8192, 1024, rate=0.1).bwd_register_sums == 3
    assert ln_mgpu.default_blocks(8192, 1024, rate=0.1).bwd_params_smem
    assert ln_mgpu.default_blocks(8192, 1024, rate=0.0).bwd_register_sums == 2
    assert not ln_mgpu.default_blocks(8192, 1024, rate=0.0).bwd_params_smem
    assert ln_mgpu.default_blocks(8192, 2048, rate=0.0).bwd_register_sums == 0
    assert ln_mgpu.default_blocks(8192, 2048, rate=0.1).bwd_register_sums == 0
    # the forward's tiles in flight: 3 up to 768 wide, 2 wider (session 23)
    assert ln_mgpu.default_blocks(8192, 768, rate=0.1).max_concurrent_steps == 3
    assert ln_mgpu.default_blocks(32768, 1024, rate=0.1).max_concurrent_steps == 2
    assert ln_mgpu.default_blocks(8192, 768, rate=0.1).fwd_mask_ahead  # the mask a step ahead up to 768 wide
    assert not ln_mgpu.default_blocks(8192, 1024, rate=0.1).fwd_mask_ahead


def test_bias_gelu_mgpu_default_blocks_per_rate(monkeypatch):
    """Per GPU (session 24): on the H200 (and others) forward tiles of ~8K elements either way and the backward with 3
    steps in flight except without dropout from 4096 wide (2); on the H100 1 row of 4096 per forward step with
    dropout and 2 backward steps in flight everywhere."""
    monkeypatch.setattr(bg_mgpu._mgpu, "device_kind", lambda: "NVIDIA H100 80GB HBM3")
    assert bg_mgpu.default_blocks(8192, 4096, rate=0.1).block_rows == 1
    assert bg_mgpu.default_blocks(8192, 3072, rate=0.1).block_rows == 2
    assert bg_mgpu.default_blocks(8192, 4096).block_rows == 2
    steps = {bg_mgpu.default_blocks(8192, w, rate=r).bwd_max_concurrent_steps for w in (3072, 4096) for r in (0, .1)}
    assert steps == {2}
    monkeypatch.setattr(bg_mgpu._mgpu, "device_kind", lambda: "NVIDIA H200")
    assert bg_mgpu.default_blocks(8192, 4096).block_rows == 2
    assert bg_mgpu.default_blocks(8192, 4096, rate=0.1).block_rows == 2
    assert bg_mgpu.default_blocks(8192, 3072, rate=0.1).block_rows == 2
    assert bg_mgpu.default_blocks(8192, 4096).bwd_max_concurrent_steps == 2
    assert bg_mgpu.default_blocks(8192, 4096, rate=0.1).bwd_max_concurrent_steps == 3
    assert bg_mgpu.default_blocks(8192, 3072).bwd_max_concurrent_steps == 3
    assert bg_mgpu.default_blocks(8192, 3072, rate=0.1).approx_math
