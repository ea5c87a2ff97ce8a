"""bias + GELU (+ dropout): every implementation that runs here against the reference, the Mosaic GPU kernels' own
blocks and lowering, dropout, the per-shard run under a mesh, and the compiled kernels on a GPU."""

import dataclasses
import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels._pallas as pk
import pallas_kernels.bias_gelu as bias_gelu
from pallas_kernels import _mgpu, registry
from pallas_kernels.bias_gelu import kernel, kernel_mgpu, reference
from pallas_kernels.dropout import seed_from_key
from pallas_kernels.registry import Device

from .harness import ON_GPU, TOL, check_vjp, interpret_mosaic, kernels_here, needs_hopper, rel


def _case(shape, dtype, rate, seed, interpret=None, **kw):
    """The public function (with `impl=` / `blocks=` in `kw`) against the reference: forward and VJP."""
    k = jax.random.split(jax.random.key(seed), 4)
    x = 2 * jax.random.normal(k[0], shape, dtype)
    bias = jax.random.normal(k[1], (shape[-1],))
    drop = dict(seed=seed_from_key(k[2]), rate=rate)
    check_vjp(lambda *a: bias_gelu.bias_gelu(*a, **drop, interpret=interpret, **kw),
              lambda *a: reference.bias_gelu(*a, **drop), (x, bias), dtype, k[3])


CASES = [
    ((3, 5, 96), jnp.float32, 0.0),
    ((37, 40), jnp.float32, 0.3),
    ((2, 8, 3072), jnp.bfloat16, 0.1),  # BERT-base FF: three 1024-wide column blocks
]


def _call(shape, dtype, rate):
    return bias_gelu.Call(int(np.prod(shape[:-1])), shape[-1], jnp.dtype(dtype).name, rate)


@pytest.mark.parametrize("shape,dtype,rate,impl", [(*c, impl) for c in CASES for impl in kernels_here(
    "bias_gelu", _call(*c))])
def test_matches_reference(shape, dtype, rate, impl):
    _case(shape, dtype, rate, seed=shape[-1], impl=impl)


def test_mosaic_runs_on_hopper_where_the_shape_allows():
    """Triton off Hopper; on Hopper+ Mosaic GPU where its shape checks pass, Triton where they do not (a width that is
    no multiple of the lanes); blocks without `impl` name their implementation; other objects are refused."""
    def runs(rows, width, device, **kw):
        return registry.choose("bias_gelu", bias_gelu.Call(rows, width, "bfloat16", 0.0), Device.named(device),
                               log_skips=False, **kw).impl.name
    assert runs(8192, 4096, "cpu") == "triton"
    assert runs(8192, 4096, "h200") == runs(8192, 4096, "h100") == "mosaic"
    assert runs(1000, 1000, "h200") == "triton"
    assert runs(8192, 4096, "h200", blocks=kernel.default_blocks(8192, 4096)) == "triton"
    with pytest.raises(ValueError, match="no implementation of bias_gelu runs this call"):
        bias_gelu.bias_gelu(jnp.ones((8, 256)), jnp.zeros((256,)), blocks=(8, 256))


def _mosaic_kernels(rows, width, dtype, rate, row_offset, *, interpret, blocks=None, seed=0):
    """The Mosaic GPU forward and backward called directly on rows [row_offset, row_offset + rows) of a larger
    tensor (a shard): against the reference's values and VJP on the whole tensor."""
    k = jax.random.split(jax.random.key(seed), 8)
    full = row_offset + rows
    x_full, g_full = (jax.random.normal(k[i], (full, width), dtype) for i in (0, 2))
    drop_seed = seed_from_key(k[7])
    bias = jax.random.normal(k[3], (width,))
    sl = slice(row_offset, row_offset + rows)
    g_full = jnp.zeros_like(g_full).at[sl].set(g_full[sl])  # the cotangent of the rows the kernel sees
    blocks = blocks or kernel_mgpu.default_blocks(rows, width, rate=rate)
    words = pk.seed_words(drop_seed, row_offset)
    x = x_full[sl]
    y = jax.jit(functools.partial(kernel_mgpu.forward, rate=rate, interpret=interpret, blocks=blocks))(x, bias, words)
    dx, dbias = jax.jit(functools.partial(kernel_mgpu.backward, rate=rate, interpret=interpret, blocks=blocks))(
        x, bias, words, g_full[sl])
    y_ref, vjp = jax.vjp(lambda x, b: reference.bias_gelu(x, b, seed=drop_seed, rate=rate), x_full, bias)
    dx_ref, db_ref = vjp(g_full)
    tol = 1e-5 if dtype == jnp.float32 else TOL[dtype]
    assert y.dtype == x.dtype and y.shape == x.shape
    assert rel(y, y_ref[sl]) < tol, "forward"
    assert dx.dtype == x.dtype and rel(dx, dx_ref[sl]) < tol, "dx"
    assert dbias.dtype == jnp.float32 and dbias.shape[1] == width
    assert rel(jnp.sum(dbias, axis=0), db_ref) < tol, "dbias"


@interpret_mosaic
@pytest.mark.parametrize("dtype,rate,row_offset", [
    (jnp.bfloat16, 0.0, 0),
    (jnp.bfloat16, 0.1, 6),  # dropout, a shard that starts at row 6
    (jnp.float32, 0.2, 0),
])
def test_mosaic_kernels_interpret(dtype, rate, row_offset):
    width = 512 if dtype == jnp.bfloat16 else 256
    for interleave in (False, True):  # a contiguous run of tiles per program, or round-robin
        blocks = kernel_mgpu.Blocks(block_rows=2, programs=2, bwd_block_rows=2, bwd_programs=2, interleave=interleave)
        _mosaic_kernels(8, width, dtype, rate, row_offset, interpret=True, blocks=blocks)


@pytest.mark.parametrize("dtype", [
    pytest.param(jnp.float32, marks=interpret_mosaic),  # the formula (1/Q is a division in interpret mode)
    pytest.param(jnp.bfloat16, marks=[pytest.mark.gpu, needs_hopper]),
    pytest.param(jnp.float32, marks=[pytest.mark.gpu, needs_hopper], id="float32-gpu")])
def test_mosaic_approx_math(dtype):
    """`approx_math`: exp as ex2.approx and erf's 1/Q as rcp.approx.ftz, within the same bound of the reference."""
    rows, width = (4096, 3072) if ON_GPU else (8, 256)
    blocks = (kernel_mgpu.default_blocks(rows, width, rate=0.1, kind=Device.current().kind) if ON_GPU
              else kernel_mgpu.Blocks(block_rows=2, programs=2, bwd_block_rows=2, bwd_programs=2))
    _mosaic_kernels(rows, width, dtype, 0.1, 64 if ON_GPU else 6, interpret=not ON_GPU,
                    blocks=dataclasses.replace(blocks, approx_math=True))




def test_mosaic_default_blocks_per_gpu():
    """Per GPU kind: on the H200 (and others) forward tiles of ~8K elements either way and the backward with 3 steps
    in flight except without dropout from 4096 wide (2); on the H100 1 row of 4096 per forward step with dropout and
    2 backward steps in flight everywhere."""
    h100 = functools.partial(kernel_mgpu.default_blocks, kind="NVIDIA H100 80GB HBM3")
    assert h100(8192, 4096, rate=0.1).block_rows == 1
    assert h100(8192, 3072, rate=0.1).block_rows == 2
    assert h100(8192, 4096).block_rows == 2
    assert {h100(8192, w, rate=r).bwd_max_concurrent_steps for w in (3072, 4096) for r in (0, .1)} == {2}
    h200 = functools.partial(kernel_mgpu.default_blocks, kind="NVIDIA H200")
    assert h200(8192, 4096).block_rows == 2 and h200(8192, 4096, rate=0.1).block_rows == 2
    assert h200(8192, 3072, rate=0.1).block_rows == 2
    assert h200(8192, 4096).bwd_max_concurrent_steps == 2
    assert h200(8192, 4096, rate=0.1).bwd_max_concurrent_steps == 3
    assert h200(8192, 3072).bwd_max_concurrent_steps == 3
    assert h200(8192, 3072, rate=0.1).approx_math


def test_mosaic_rejects_shapes_it_cannot_take():
    words = pk.seed_words(None)
    with pytest.raises(ValueError, match="width=1000"):
        kernel_mgpu.forward(jnp.zeros((8, 1000), jnp.bfloat16), jnp.zeros((1000,)), words, rate=0.0, interpret=True,
                            blocks=kernel_mgpu.Blocks())
    with pytest.raises(ValueError, match="rows=7"):
        kernel_mgpu.forward(jnp.zeros((7, 512), jnp.bfloat16), jnp.zeros((512,)), words, rate=0.0, interpret=True,
                            blocks=kernel_mgpu.Blocks(block_rows=2))


@pytest.mark.parametrize("stage", ["fwd", "bwd"])
def test_mosaic_lowers_for_cuda(stage):
    """The compiled (not interpreted) kernels lower to one Mosaic GPU module for CUDA at BERT-large's FF shape (layouts,
    TMA boxes, the SMEM budget; not PTX or the run), two call sites sharing it (`_mgpu.one_module`); erf's 1/Q through
    `_mgpu.reciprocal`'s inline PTX; no deprecated `plgpu.load` index on jax >= 0.11."""
    words = pk.seed_words(jnp.array([1, 2], jnp.uint32))
    x, v = jnp.zeros((8192, 4096), jnp.bfloat16), jnp.zeros((4096,))
    kw = dict(rate=0.1, interpret=False, blocks=kernel_mgpu.default_blocks(8192, 4096, rate=0.1))
    fn, args = ((functools.partial(kernel_mgpu.forward, **kw), (x, v, words)) if stage == "fwd"
                else (functools.partial(kernel_mgpu.backward, **kw), (x, v, words, x)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lowered = jax.jit(lambda *a: (fn(*a), fn(*a))).trace(*args).lower(lowering_platforms=("cuda",))
    text = lowered.as_text()
    assert text.count("stablehlo.custom_call @mosaic_gpu") == 1
    assert "rcp.approx.ftz.f32" in text
    assert not [w for w in caught if "index separately" in str(w.message)]


def test_reciprocal_falls_back_to_a_division(monkeypatch):
    """Where a jax lacks the private Mosaic GPU hooks `_mgpu.reciprocal` uses for rcp.approx.ftz, the kernels still
    lower, with a division (the shape differs from the test above: no cached trace)."""
    monkeypatch.setattr(_mgpu, "_has_fast_instr", lambda: False)
    words = pk.seed_words(jnp.array([1, 2], jnp.uint32))
    x, v = jnp.zeros((4096, 3072), jnp.bfloat16), jnp.zeros((3072,))
    fn = functools.partial(kernel_mgpu.forward, rate=0.1, interpret=False,
                           blocks=kernel_mgpu.default_blocks(4096, 3072, rate=0.1))
    text = jax.jit(fn).trace(x, v, words).lower(lowering_platforms=("cuda",)).as_text()
    assert "stablehlo.custom_call @mosaic_gpu" in text and "rcp.approx.ftz.f32" not in text


def test_dropout_keeps_the_rate_and_differs_across_seeds():
    x = jnp.ones((64, 512), jnp.float32)
    bias = jnp.zeros((512,))
    kept = [np.asarray(bias_gelu.bias_gelu(x + 3.0, bias, seed=seed_from_key(jax.random.key(i)), rate=0.25)) != 0
            for i in range(2)]
    for m in kept:
        assert abs(m.mean() - 0.75) < 0.01
    assert abs(np.corrcoef(kept[0].ravel(), kept[1].ravel())[0, 1]) < 0.02


def test_runs_per_batch_shard():
    """Under a data mesh the kernels run inside shard_map (no gathered inputs), with the unsharded results."""
    mesh = jax.make_mesh((4,), ("data",))
    k = jax.random.split(jax.random.key(13), 3)
    seed = seed_from_key(k[2])
    x, bias = jax.random.normal(k[0], (8, 4, 96)), jax.random.normal(k[1], (96,))

    def loss(f, x, b):
        y = f(x, b, seed=seed, rate=0.2)
        return jnp.sum(y * jnp.sin(jnp.arange(y.size).reshape(y.shape)))

    grad = jax.jit(jax.value_and_grad(loss, argnums=(1, 2)), static_argnums=0)
    expected = grad(reference.bias_gelu, x, bias)
    sharded = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data")))
    with jax.set_mesh(mesh):
        got = grad(bias_gelu.bias_gelu, sharded, bias)
        assert "shard_map" in str(jax.make_jaxpr(lambda *a: loss(bias_gelu.bias_gelu, *a))(sharded, bias))
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-5)
    for a, b in zip(got[1], expected[1]):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


def test_batch_not_divisible_by_the_mesh_is_named():
    with jax.set_mesh(jax.make_mesh((4,), ("data",))), pytest.raises(ValueError, match="does not divide"):
        bias_gelu.bias_gelu(jnp.ones((6, 8)), jnp.ones(8))


def test_bad_shapes_are_named():
    with pytest.raises(ValueError, match="bias.shape"):
        bias_gelu.bias_gelu(jnp.ones((4, 8)), jnp.ones(7))
    with pytest.raises(ValueError, match="needs a seed"):
        bias_gelu.bias_gelu(jnp.ones((4, 8)), jnp.ones(8), rate=0.1)
    with pytest.raises(ValueError, match="impl='cuda' must be one of"):
        bias_gelu.bias_gelu(jnp.ones((8, 256)), jnp.zeros(256), impl="cuda")
    with pytest.raises(ValueError, match=r"impl='mosaic' does not run .* width=96 must be a multiple of 256"):
        bias_gelu.bias_gelu(jnp.ones((8, 96)), jnp.zeros(96), impl="mosaic")


# --- compiled on a GPU (skipped without one) -----------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("rows,width", [(8192, 3072), (8192, 4096), (1000, 1000)])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("impl", ["mosaic", "triton"])
def test_compiled_matches_reference_on_gpu(rows, width, dtype, impl):
    call = _call((rows, width), dtype, 0.1)
    if impl not in kernels_here("bias_gelu", call):
        pytest.skip(f"{impl} does not run {call} here")
    _case((rows, width), dtype, 0.1, seed=rows + width, interpret=False, impl=impl)
    _case((rows, width), dtype, 0.0, seed=rows + width + 1, interpret=False, impl=impl)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("rows,width,rate", [(8192, 3072, 0.0), (8192, 4096, 0.1), (32768, 4096, 0.0)])
def test_mosaic_kernels_on_gpu(rows, width, rate):
    """The Mosaic GPU kernels on a shard at row 64, their default blocks and the other tile order."""
    default = kernel_mgpu.default_blocks(rows, width, rate=rate, kind=Device.current().kind)
    _mosaic_kernels(rows, width, jnp.bfloat16, rate, 64, interpret=False, blocks=default)
    _mosaic_kernels(rows, width, jnp.bfloat16, rate, 64, interpret=False,
                    blocks=dataclasses.replace(default, interleave=not default.interleave))
