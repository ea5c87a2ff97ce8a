"""BDRLN and the plain layernorm: every implementation that runs here against the reference, the registry's rules
between Mosaic GPU and Triton, the Mosaic GPU kernels' own variants and lowering, the column sums, the per-shard run
under a mesh, and the compiled kernels on a GPU."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels._pallas as pk
import pallas_kernels.bias_dropout_residual_layernorm as bdrln
from pallas_kernels import _mgpu, registry
from pallas_kernels.bias_dropout_residual_layernorm import impls, kernel, kernel_mgpu, reference
from pallas_kernels.dropout import dropout, seed_from_key
from pallas_kernels.registry import Device

from .harness import check_vjp, interpret_mosaic, kernels_here, needs_hopper, rel

_TOL = {jnp.float32: 1e-5, jnp.bfloat16: 2e-2}  # the Mosaic GPU kernels' direct checks


def _case(shape, dtype, rate, seed, interpret=None, **kw):
    """The public function (with `impl=` / `blocks=` in `kw`) against the reference: forward and VJP."""
    k = jax.random.split(jax.random.key(seed), 8)
    d = shape[-1]
    x, res = (jax.random.normal(k[i], shape, dtype) for i in (0, 1))
    bias, shift = (jax.random.normal(k[i], (d,)) for i in (2, 3))
    scale = 1 + 0.2 * jax.random.normal(k[4], (d,))
    drop = dict(seed=seed_from_key(k[5]), rate=rate, eps=1e-12)
    check_vjp(lambda *a: bdrln.bias_dropout_residual_layernorm(*a, **drop, interpret=interpret, **kw),
              lambda *a: reference.bias_dropout_residual_layernorm(*a, **drop), (x, bias, res, scale, shift), dtype,
              k[6])


CASES = [
    ((2, 5, 96), jnp.float32, 0.0),  # rows not a multiple of the tile, width not a power of two
    ((3, 7, 40), jnp.float32, 0.3),
    ((2, 8, 768), jnp.bfloat16, 0.1),  # BERT-base width
    ((16, 1024), jnp.bfloat16, 0.0),  # BERT-large width
]


def _call(shape, dtype, rate):
    name = jnp.dtype(dtype).name
    return bdrln.Call(int(np.prod(shape[:-1])), shape[-1], name, name, rate)


@pytest.mark.parametrize("shape,dtype,rate,impl", [(*c, impl) for c in CASES for impl in kernels_here(
    "bias_dropout_residual_layernorm", _call(*c))])
@pytest.mark.slow
def test_matches_reference(shape, dtype, rate, impl):
    _case(shape, dtype, rate, seed=len(shape) + shape[-1], impl=impl)


def test_layer_norm_matches_reference():
    k = jax.random.split(jax.random.key(7), 3)
    x = jax.random.normal(k[0], (3, 6, 96)) * 3 + 1
    scale, shift = 1 + 0.2 * jax.random.normal(k[1], (96,)), jax.random.normal(k[2], (96,))
    check_vjp(lambda *a: bdrln.layer_norm(*a, eps=1e-12), lambda *a: reference.layer_norm(*a, eps=1e-12),
              (x, scale, shift), jnp.float32, k[0])


def test_reference_normalises_rows_and_matches_numpy():
    k = jax.random.split(jax.random.key(2), 5)
    x, res = jax.random.normal(k[0], (2, 5, 96)), jax.random.normal(k[1], (2, 5, 96))
    bias, scale, shift = (jax.random.normal(k[i], (96,)) for i in (2, 3, 4))
    out = reference.bias_dropout_residual_layernorm(x, bias, res, scale, shift, seed=None, rate=0.0, eps=1e-12)
    h = np.asarray(x, np.float64) + np.asarray(bias, np.float64) + np.asarray(res, np.float64)
    ref = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-12)
    ref = ref * np.asarray(scale) + np.asarray(shift)
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-5, atol=1e-5)


# --- the registry's rules --------------------------------------------------------------------------------------------

def _runs(rows, width, *, device="h200", rate=0.0, dtype="bfloat16", out_dtype="bfloat16",
          op="bias_dropout_residual_layernorm"):
    call = bdrln.Call(rows, width, dtype, out_dtype, rate)
    return registry.choose(op, call, Device.named(device), log_skips=False).impl.name


def test_mosaic_runs_on_hopper_from_its_row_thresholds():
    """Triton off Hopper; on Hopper+ Mosaic GPU for shards of >= MIN_ROWS rows (>= MIN_ROWS_REGISTER_SUMS where its
    backward carries column sums in registers: 768 and 1024 wide) where its shape checks pass, Triton below that,
    where they fail, and where `TRITON_FROM_ROWS` names the GPU (the H100 at 32768 x 1024 with dropout)."""
    assert _runs(16384, 1024, device="cpu") == "triton"
    assert _runs(16384, 1024) == "mosaic"
    assert _runs(32768, 768, out_dtype="float32") == "mosaic"
    assert _runs(8192, 1024) == "mosaic" and _runs(8192, 768) == "mosaic"  # register sums: from 8192 rows
    assert _runs(4096, 768) == "triton"
    assert _runs(8192, 2048) == "triton"  # no register sums: below MIN_ROWS
    assert _runs(16384, 2048) == "mosaic"
    assert _runs(16384, 1000) == "triton"  # no multiple of the lanes
    assert _runs(32768, 1024) == "mosaic" and _runs(32768, 1024, rate=0.1) == "mosaic"
    assert _runs(32768, 1024, device="h100", rate=0.1) == "triton"  # TRITON_FROM_ROWS, with dropout only
    assert _runs(32768, 1024, device="h100") == "mosaic"
    assert _runs(16384, 1024, device="h100", rate=0.1) == "mosaic"
    assert _runs(32768, 768, device="h100", rate=0.1) == "mosaic"
    assert _runs(8192, 1024, op="layer_norm") == "mosaic"
    # Where a rule ("slower") skips Mosaic GPU, the autotuner still times it, after Triton.
    call = bdrln.Call(32768, 1024, "bfloat16", "bfloat16", 0.1)
    first = registry.choose("bias_dropout_residual_layernorm", call, Device.named("h100"), log_skips=False)
    assert [c.impl.name for c in registry.runnable("bias_dropout_residual_layernorm", call, Device.named("h100"),
                                                   first)] == ["triton", "mosaic"]


def test_blocks_name_their_implementation():
    """Blocks without `impl` run the first implementation whose config they are, where it runs the call on the
    device, whatever the rows rule prefers; other objects are refused."""
    call = bdrln.Call(8, 256, "float32", "float32", 0.0)
    choose = functools.partial(registry.choose, "layer_norm", call)
    assert choose(Device.named("h200")).impl.name == "triton"  # Mosaic GPU measured slower at 8 rows
    assert choose(Device.named("h200"), blocks=kernel_mgpu.Blocks()).impl.name == "mosaic"
    assert choose(Device.named("h200"), blocks=kernel.Blocks()).impl.name == "triton"
    with pytest.raises(ValueError, match="mosaic: needs a Hopper-or-newer GPU"):
        choose(Device.named("cpu"), blocks=kernel_mgpu.Blocks())
    with pytest.raises(ValueError, match="no implementation of layer_norm runs this call"):
        bdrln.layer_norm(jnp.zeros((8, 256)), jnp.ones(256), jnp.zeros(256), eps=1e-12, blocks=(8, 256))


@pytest.mark.slow
@interpret_mosaic
def test_chosen_mosaic_kernels_run_in_the_forward_and_the_backward(monkeypatch):
    """On an H200 (mocked) with the row thresholds lowered to 8 rows, the public function runs the Mosaic GPU
    kernels (interpret mode here) in the forward and the backward, with the reference's values and gradients."""
    monkeypatch.setattr(Device, "current", classmethod(lambda cls: registry.DEVICES["h200"]))
    monkeypatch.setattr(impls, "MIN_ROWS", 8)
    monkeypatch.setattr(impls, "MIN_ROWS_REGISTER_SUMS", 8)
    calls = []
    for name in ("forward", "backward"):
        real = getattr(kernel_mgpu, name)
        monkeypatch.setattr(kernel_mgpu, name,
                            lambda *a, real=real, name=name, **k: calls.append(name) or real(*a, **k))
    _case((8, 256), jnp.float32, 0.1, seed=6)
    assert calls == ["forward", "backward"]


# --- the Mosaic GPU kernels ------------------------------------------------------------------------------------------

def _mosaic_kernels(rows, width, dtype, rate, row_offset, *, plain=False, interpret, blocks=None, seed=1):
    """The Mosaic GPU forward and backward called directly on rows [row_offset, row_offset + rows) of a larger tensor
    (a shard), against the reference's values, statistics and VJP; `plain`: no bias and no residual."""
    k = jax.random.split(jax.random.key(seed), 8)
    full = row_offset + rows
    x_full, r_full, g_full = (jax.random.normal(k[i], (full, width), dtype) for i in (0, 1, 2))
    drop_seed = seed_from_key(k[7])
    bias = None if plain else jax.random.normal(k[3], (width,))
    res_full = None if plain else r_full
    scale = 1 + 0.2 * jax.random.normal(k[4], (width,))
    shift = jax.random.normal(k[5], (width,))
    sl = slice(row_offset, row_offset + rows)
    g_full = jnp.zeros_like(g_full).at[sl].set(g_full[sl])
    blocks = blocks or kernel_mgpu.default_blocks(rows, width, rate=rate)
    words = pk.seed_words(drop_seed, row_offset)
    eps = 1e-12
    x, res = x_full[sl], None if plain else res_full[sl]
    fwd = jax.jit(functools.partial(kernel_mgpu.forward, rate=rate, eps=eps, interpret=interpret, blocks=blocks))
    bwd = jax.jit(functools.partial(kernel_mgpu.backward, rate=rate, interpret=interpret, blocks=blocks))
    y, mean, rstd = fwd(x, bias, res, scale, shift, words)
    dx, dres, dscale, dshift, dbias = bwd(x, bias, res, scale, words, mean, rstd, g_full[sl])

    if plain:
        y_ref, vjp = jax.vjp(lambda x, s, t: reference.layer_norm(x, s, t, eps=eps), x_full, scale, shift)
        dx_ref, ds_ref, dt_ref = vjp(g_full)
    else:
        ref = lambda x, b, r, s, t: reference.bias_dropout_residual_layernorm(  # noqa: E731
            x, b, r, s, t, seed=drop_seed, rate=rate, eps=eps)
        y_ref, vjp = jax.vjp(ref, x_full, bias, res_full, scale, shift)
        dx_ref, db_ref, dres_ref, ds_ref, dt_ref = vjp(g_full)
    h = x.astype(jnp.float32)
    if not plain:  # the statistics the forward saved, from the reference's h
        h = dropout(x_full.astype(jnp.float32) + bias, drop_seed, rate)[sl] + res.astype(jnp.float32)
    tol = _TOL[dtype]
    assert y.dtype == (x if plain else res).dtype and y.shape == x.shape
    assert rel(y, y_ref[sl]) < tol, "forward"
    assert rel(mean, jnp.mean(h, axis=1)) < 1e-5, "mean"
    assert rel(rstd, jax.lax.rsqrt(jnp.var(h, axis=1) + eps)) < 1e-4, "rstd"
    assert rel(dx, dx_ref[sl]) < tol, "dx"
    if not plain:
        assert (dres is None) == (rate == 0.0), "d_residual is written only with dropout"
        assert rel(dx if dres is None else dres, dres_ref[sl]) < tol, "d_residual"
        assert rel(jnp.sum(dbias, axis=0), db_ref) < tol, "dbias"
    else:
        assert dres is None and dbias is None
    assert rel(jnp.sum(dscale, axis=0), ds_ref) < tol, "dscale"
    assert rel(jnp.sum(dshift, axis=0), dt_ref) < tol, "dshift"


@interpret_mosaic
@pytest.mark.parametrize("dtype,rate,row_offset,plain", [
    (jnp.bfloat16, 0.0, 0, False),
    (jnp.bfloat16, 0.1, 4, False),
    (jnp.float32, 0.2, 0, False),
    (jnp.float32, 0.0, 0, True),  # the MLM head's plain layernorm: no bias, no residual
])
@pytest.mark.slow
def test_mosaic_kernels_interpret(dtype, rate, row_offset, plain):
    width = 256  # the smallest the kernel takes (TMA boxes of 256 columns; 32 lanes x 8 bf16)
    for n_reg, direct in ((0, False), (2, True), (3, False)):  # how many of the backward's column sums are register
        # carries (the rest SMEM tiles); the forward's y through SMEM or straight from registers, and its dropout
        # mask drawn a step ahead or not; with Pallas' barriers or the kernels' own; the backward's row statistics
        # from SMEM or prefetched from GMEM
        blocks = kernel_mgpu.Blocks(block_rows=4, programs=2, bwd_block_rows=4, bwd_programs=2,
                                    bwd_register_sums=n_reg, fwd_direct_store=direct, fwd_mask_ahead=direct,
                                    auto_barriers=n_reg != 2, bwd_params_smem=n_reg != 0, bwd_stats_smem=n_reg != 2,
                                    fwd_interleave=n_reg == 2, bwd_interleave=n_reg != 0)
        _mosaic_kernels(16, width, dtype, rate, row_offset, plain=plain, interpret=True, blocks=blocks)


@pytest.mark.slow
@interpret_mosaic
def test_mosaic_statistics_copied_in_chunks(monkeypatch):
    """The backward's row statistics reach SMEM in several TMA copies when a program has more rows than one TMA box
    holds (here boxes of 2 steps for 8 steps per program: four copies per statistic on one barrier), in either
    tile order."""
    monkeypatch.setattr(kernel_mgpu, "_TMA_BOX", 2)
    for interleave in (False, True):
        blocks = kernel_mgpu.Blocks(block_rows=4, programs=2, bwd_block_rows=4, bwd_programs=2, bwd_register_sums=3,
                                    bwd_interleave=interleave)
        _mosaic_kernels(64, 256, jnp.float32, 0.1, 4, interpret=True, blocks=blocks)


def test_mosaic_default_register_sums_per_width_and_rate():
    """All three sums in registers at 768 wide; at 1024 all three with dropout (the bias and LN scale in SMEM), two
    without; the forward's tiles in flight (3 up to 768 wide, 2 wider) and its mask drawn ahead up to 768 wide."""
    d = kernel_mgpu.default_blocks
    assert d(8192, 768).bwd_register_sums == 3 and d(8192, 768, rate=0.1).bwd_register_sums == 3
    assert not d(8192, 768, rate=0.1).bwd_params_smem
    assert d(8192, 1024, rate=0.1).bwd_register_sums == 3 and d(8192, 1024, rate=0.1).bwd_params_smem
    assert d(8192, 1024, rate=0.0).bwd_register_sums == 2 and not d(8192, 1024, rate=0.0).bwd_params_smem
    assert d(8192, 2048, rate=0.0).bwd_register_sums == 0 and d(8192, 2048, rate=0.1).bwd_register_sums == 0
    assert d(8192, 768, rate=0.1).max_concurrent_steps == 3 and d(32768, 1024, rate=0.1).max_concurrent_steps == 2
    assert d(8192, 768, rate=0.1).fwd_mask_ahead and not d(8192, 1024, rate=0.1).fwd_mask_ahead


def test_mosaic_rejects_shapes_it_cannot_take():
    with pytest.raises(ValueError, match="multiple of 4"):
        kernel_mgpu.forward(jnp.zeros((12, 768), jnp.bfloat16), None, None, jnp.ones((768,)), jnp.zeros((768,)),
                            pk.seed_words(None), rate=0.0, eps=1e-12, interpret=True,
                            blocks=kernel_mgpu.Blocks(block_rows=6))


def _compiled(stage: str, rows: int, width: int, blocks, rate: float = 0.1):
    """The compiled (not interpreted) Mosaic GPU forward or backward (`stage`) with bias and residual, and zero
    operands of a (rows, width) bf16 shard, to lower for CUDA."""
    words = pk.seed_words(jnp.array([1, 2], jnp.uint32))
    x, v, st = jnp.zeros((rows, width), jnp.bfloat16), jnp.zeros((width,)), jnp.zeros((rows,))
    kw = dict(rate=rate, interpret=False, blocks=blocks)
    if stage == "fwd":
        return functools.partial(kernel_mgpu.forward, eps=1e-12, **kw), (x, v, x, v, v, words)
    return functools.partial(kernel_mgpu.backward, **kw), (x, v, x, v, words, st, st, x)


@pytest.mark.parametrize("stage", ["fwd", "bwd"])
def test_mosaic_lowers_for_cuda(stage):
    """The compiled kernels lower to one Mosaic GPU module for CUDA at BERT-base's width, two call sites sharing it
    (layouts, TMA boxes, the SMEM budget: checked without a GPU; PTX and the run are not)."""
    fn, args = _compiled(stage, 8192, 768, kernel_mgpu.default_blocks(8192, 768, rate=0.1))
    lowered = jax.jit(lambda *a: (fn(*a), fn(*a))).trace(*args).lower(lowering_platforms=("cuda",))
    assert lowered.as_text().count("stablehlo.custom_call @mosaic_gpu") == 1


@pytest.mark.parametrize("rows,width,in_smem", [(8192, 1024, True), (12288, 1024, False), (2048, 768, False)])
def test_mosaic_backward_lowers_for_any_step_count(rows, width, in_smem):
    """The backward's statistics go to SMEM in one TMA copy per program only where that copy is a multiple of 128
    bytes (Mosaic GPU rejects others at lowering: 12288 rows are 256 programs of 12 steps of 4 rows, 192 bytes; 2048
    rows 2 steps); elsewhere the kernel prefetches them from GMEM and lowers all the same."""
    blocks = kernel_mgpu.default_blocks(rows, width, rate=0.1)
    _, steps = _mgpu.split_programs(rows // blocks.bwd_block_rows, blocks.bwd_programs)
    assert kernel_mgpu.stats_in_smem(blocks, steps) is in_smem
    fn, args = _compiled("bwd", rows, width, blocks)
    assert "mosaic_gpu" in jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


# --- column sums, shapes, meshes -------------------------------------------------------------------------------------

def _column_sums_case(g, d, interpret=None):
    """`column_sums` of three fresh (g, d) float32 arrays (one absent) against float64 sums; twice, bit-equal."""
    ps = [jax.random.normal(k, (g, d), jnp.float32) for k in jax.random.split(jax.random.key(g * d), 3)]
    interpret = pk.resolve_interpret(interpret)
    out = pk.column_sums(ps[0], None, ps[1], ps[2], interpret=interpret)
    assert out[1] is None and len(out) == 4
    for o, p in zip(out[:1] + out[2:], ps):
        assert o.shape == (1, d) and o.dtype == jnp.float32
        ref = np.asarray(p, np.float64).sum(0, keepdims=True)
        assert np.abs(np.asarray(o) - ref).max() <= 1e-6 * max(np.abs(ref).max(), 1.0) * np.sqrt(g)
    again = pk.column_sums(ps[0], None, ps[1], ps[2], interpret=interpret)
    for a, b in zip(out[:1] + out[2:], again[:1] + again[2:]):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # a fixed order: deterministic


@pytest.mark.parametrize("g,d", [(7, 1000), (130, 40), (256, 768)])
def test_column_sums_match_numpy(g, d):
    _column_sums_case(g, d)


def test_column_sums_names_mismatched_partials():
    with pytest.raises(ValueError, match="float32"):
        pk.column_sums(jnp.zeros((4, 8)), jnp.zeros((4, 9)), interpret=True)


def test_bad_shapes_are_named():
    x = jnp.ones((4, 8))
    with pytest.raises(ValueError, match="bias.shape"):
        bdrln.bias_dropout_residual_layernorm(x, jnp.ones(7), x, jnp.ones(8), jnp.ones(8), seed=None, rate=0.0,
                                              eps=1e-12)
    with pytest.raises(ValueError, match="residual.shape"):
        bdrln.bias_dropout_residual_layernorm(x, jnp.ones(8), x[:2], jnp.ones(8), jnp.ones(8), seed=None, rate=0.0,
                                              eps=1e-12)


@pytest.mark.parametrize("axis_types", ["explicit", "auto"])  # make_mesh's default, and Mesh()'s (the trainer's)
def test_runs_per_batch_shard_under_a_mesh(axis_types):
    """Under a data mesh the kernels run inside shard_map: same values and parameter gradients, no double counting."""
    if axis_types == "explicit":
        mesh = jax.make_mesh((4,), ("data",))
    else:
        mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]), ("data",))
    k = jax.random.split(jax.random.key(11), 6)
    x, res = jax.random.normal(k[0], (8, 4, 96)), jax.random.normal(k[1], (8, 4, 96))
    bias, shift, scale = jax.random.normal(k[2], (96,)), jax.random.normal(k[3], (96,)), jnp.ones(96)
    seed = seed_from_key(k[4])

    def loss(fn, x, bias, res, scale, shift):
        y = fn(x, bias, res, scale, shift, seed=seed, rate=0.2, eps=1e-12)
        return jnp.sum(y * jnp.cos(jnp.arange(y.size).reshape(y.shape)))

    grad = jax.jit(jax.value_and_grad(loss, argnums=(1, 2, 3, 4, 5)), static_argnums=0)
    expected = grad(reference.bias_dropout_residual_layernorm, x, bias, res, scale, shift)
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    with jax.set_mesh(mesh):
        got = grad(bdrln.bias_dropout_residual_layernorm, jax.device_put(x, sharding), bias,
                   jax.device_put(res, sharding), scale, shift)
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-5)
    for a, b in zip(got[1], expected[1]):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


def test_layer_norm_runs_per_batch_shard():
    """The plain layernorm (absent bias, residual and seed: static Nones through the per-shard call) inside shard_map
    under a data mesh, with the unsharded results."""
    mesh = jax.make_mesh((4,), ("data",))
    k = jax.random.split(jax.random.key(13), 2)
    x, scale = jax.random.normal(k[0], (8, 4, 96)), 1 + 0.1 * jax.random.normal(k[1], (96,))

    def loss(f, x, s):
        y = f(x, s, s, eps=1e-12)
        return jnp.sum(y * jnp.sin(jnp.arange(y.size).reshape(y.shape)))

    grad = jax.jit(jax.value_and_grad(loss, argnums=(1, 2)), static_argnums=0)
    expected = grad(reference.layer_norm, x, scale)
    sharded = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data")))
    with jax.set_mesh(mesh):
        got = grad(bdrln.layer_norm, sharded, scale)
        assert "shard_map" in str(jax.make_jaxpr(lambda *a: loss(bdrln.layer_norm, *a))(sharded, scale))
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-5)
    for a, b in zip(got[1], expected[1]):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


# --- compiled on a GPU (skipped without one) -----------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("rows,width", [(8192, 768), (8192, 1024), (4096, 1000)])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_compiled_matches_reference_on_gpu(rows, width, dtype):
    for impl in kernels_here("bias_dropout_residual_layernorm", _call((rows, width), dtype, 0.1)):
        _case((rows, width), dtype, 0.1, seed=rows + width, interpret=False, impl=impl)
        _case((rows, width), dtype, 0.0, seed=rows + width + 1, interpret=False, impl=impl)


@pytest.mark.gpu
@pytest.mark.parametrize("g,d", [(256, 768), (513, 1024), (7, 1000)])
def test_column_sums_on_gpu(g, d):
    _column_sums_case(g, d, interpret=False)


@pytest.mark.gpu
def test_triton_many_rows_on_gpu():
    """Triton's backward at 32768 rows, where it takes 64 rows per program (`bwd_rows_per_program`)."""
    assert kernel.default_blocks(32768, 1024).bwd_rows_per_program == 64
    _case((32768, 1024), jnp.bfloat16, 0.1, seed=3, interpret=False, impl="triton")


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("rows,width,rate,plain", [
    (8192, 768, 0.1, False), (8192, 1024, 0.0, False), (32768, 1024, 0.1, False), (8192, 1024, 0.0, True)])
def test_mosaic_kernels_on_gpu(rows, width, rate, plain):
    _mosaic_kernels(rows, width, jnp.bfloat16, rate, 64, plain=plain, interpret=False)
    default = kernel_mgpu.default_blocks(rows, width, rate=rate)
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
        _mosaic_kernels(rows, width, jnp.bfloat16, rate, 64, plain=plain, interpret=False, blocks=other)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("rows,width", [(12288, 1024), (2048, 768)])
def test_mosaic_kernels_on_gpu_any_step_count(rows, width):
    """Shapes whose programs' statistics do not fill 128-byte TMA copies (the backward prefetches them instead)."""
    _mosaic_kernels(rows, width, jnp.bfloat16, 0.1, 64, interpret=False)


@pytest.mark.gpu
@needs_hopper
def test_registry_choice_on_gpu():
    """Without `impl=`, 16384 x 768 bf16 with dropout runs what the registry chooses there (Mosaic GPU), compiled."""
    call = _call((16384, 768), jnp.bfloat16, 0.1)
    assert registry.choose("bias_dropout_residual_layernorm", call, log_skips=False).impl.name == "mosaic"
    _case((16384, 768), jnp.bfloat16, 0.1, seed=9, interpret=False)
