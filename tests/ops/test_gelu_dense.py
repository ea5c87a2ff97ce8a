"""gelu(x + bias) @ kernel, the feed-forward's activation and output product: every implementation against the
reference, the Mosaic GPU epilogue kernel's own outputs (dx and the bias gradient's partial sums), the shape checks,
the per-shard run under a mesh, and the compiled kernel on a GPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels._pallas as pk
import pallas_kernels.gelu_dense as gelu_dense
from pallas_kernels import registry
from pallas_kernels.bias_gelu import kernel_mgpu as bias_gelu_mgpu
from pallas_kernels._math import gelu
from pallas_kernels.gelu_dense import kernel_mgpu, reference
from pallas_kernels.registry import Device

from .harness import MOSAIC_INTERPRET, ON_GPU, check_vjp, interpret_mosaic, needs_hopper, rel

SMALL = kernel_mgpu.Blocks(tile_m=64, tile_n=64, tile_k=64, max_concurrent_steps=2)  # interpret mode's tiles


def _inputs(shape, depth, seed, dtype=jnp.bfloat16):
    k = jax.random.split(jax.random.key(seed), 3)
    x = 2 * jax.random.normal(k[0], shape, dtype)
    bias = jax.random.normal(k[1], (shape[-1],))
    kernel = jax.random.normal(k[2], (shape[-1], depth)) / np.sqrt(shape[-1])
    return x, bias, kernel


@pytest.mark.parametrize("impl", ["split", pytest.param("mosaic", marks=[interpret_mosaic, pytest.mark.slow])])
def test_matches_reference(impl):
    """Forward and VJP (x, bias, kernel) of each implementation against the reference, on fresh random inputs."""
    x, bias, kernel = _inputs((2, 64, 512), 128, seed=3)
    blocks = SMALL if impl == "mosaic" else None
    check_vjp(lambda *a: gelu_dense.gelu_dense(*a, impl=impl, blocks=blocks, interpret=not ON_GPU),
              lambda *a: reference.gelu_dense(*a), (x, bias, kernel), jnp.bfloat16, jax.random.key(4))


def _kernel_case(m, k, n, blocks, seed, interpret):
    """dx = (dy @ w^T) * g and its column sums per tile of rows, against float32 math on the same bf16 inputs."""
    keys = jax.random.split(jax.random.key(seed), 3)
    dy = jax.random.normal(keys[0], (m, k), jnp.bfloat16)
    w = (jax.random.normal(keys[1], (n, k)) / np.sqrt(k)).astype(jnp.bfloat16)
    g = jax.random.uniform(keys[2], (m, n), jnp.float32, -0.2, 1.2).astype(jnp.bfloat16)  # GELU's range
    dx, db = kernel_mgpu.backward_input(dy, w, g, blocks=blocks, interpret=interpret)
    f32 = jnp.float32
    want = jnp.dot(dy.astype(f32), w.astype(f32).T, precision="highest") * g.astype(f32)
    assert dx.shape == (m, n) and dx.dtype == jnp.bfloat16
    assert db.shape == (m // blocks.tile_m, n) and db.dtype == jnp.float32
    assert rel(dx, want) < 5e-3, rel(dx, want)  # one bf16 rounding of dx
    # The sums are of dx as stored (bf16), accumulated in float32: against those exactly, against float32 dx within
    # the rounding.
    stored = dx.astype(f32).reshape(m // blocks.tile_m, blocks.tile_m, n).sum(1)
    assert rel(db, stored) < 1e-5, rel(db, stored)
    assert rel(db.sum(0), want.sum(0)) < 5e-3, rel(db.sum(0), want.sum(0))


@interpret_mosaic
@pytest.mark.slow
def test_kernel_outputs_interpret():
    """Every tile of dx and every partial sum written, with two tiles per CTA along M and N (a 3 x 2 grid of CTA
    tiles over 2 programs) and two epilogue sub-tiles per warpgroup."""
    _kernel_case(192, 128, 256, SMALL, seed=5, interpret=True)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("blocks", [kernel_mgpu.Blocks(), kernel_mgpu.Blocks(grid_tile_width=4)],
                         ids=["default", "band4"])
@pytest.mark.parametrize("shape", [(8192, 1024, 4096), (1024, 768, 3072)], ids=["large", "base"])
def test_kernel_compiled_on_gpu(blocks, shape):
    _kernel_case(*shape, blocks, seed=6, interpret=False)


@pytest.mark.skipif(not ON_GPU and not MOSAIC_INTERPRET, reason="needs a GPU or Mosaic GPU interpret mode")
def test_forward_writes_gelu_grad():
    """bias+GELU's Mosaic GPU forward with `with_grad`: y and GELU'(x + bias) against the reference's value and
    derivative (the backward's epilogue multiplies by the latter)."""
    x, bias, _ = _inputs((256, 512), 8, seed=11)
    blocks = bias_gelu_mgpu.default_blocks(256, 512, 0.0) if ON_GPU else bias_gelu_mgpu.Blocks(block_rows=2,
                                                                                               programs=2)
    y, g = bias_gelu_mgpu.forward(x, bias, pk.seed_words(None), rate=0.0, interpret=not ON_GPU, blocks=blocks,
                                  with_grad=True)
    h = x.astype(jnp.float32) + bias
    assert rel(y, gelu(h)) < 5e-3, rel(y, gelu(h))
    want = jax.vmap(jax.vmap(jax.grad(gelu)))(h)
    assert rel(g, want) < 5e-3, rel(g, want)
    with pytest.raises(ValueError, match="with_grad needs rate=0"):
        bias_gelu_mgpu.forward(x, bias, pk.seed_words(None), rate=0.1, interpret=True, blocks=blocks,
                               with_grad=True)


@pytest.mark.gpu
@needs_hopper
def test_compiled_matches_reference_on_gpu():
    x, bias, kernel = _inputs((4, 128, 4096), 1024, seed=7)
    check_vjp(lambda *a: gelu_dense.gelu_dense(*a, impl="mosaic"), reference.gelu_dense, (x, bias, kernel),
              jnp.bfloat16, jax.random.key(8))


def test_checks_name_the_field():
    x, bias, kernel = _inputs((2, 8, 256), 64, seed=0)
    with pytest.raises(ValueError, match="layout='BF'"):
        gelu_dense.gelu_dense(x, bias, kernel, layout="BF")
    with pytest.raises(ValueError, match="bias.shape"):
        gelu_dense.gelu_dense(x, bias[:8], kernel)
    with pytest.raises(ValueError, match="out='BSF'"):
        gelu_dense.gelu_dense(x, bias, kernel, out="BSF")
    with pytest.raises(ValueError, match="width=384 must be a multiple of 256"):  # the CTA's two tiles of 128
        kernel_mgpu.check_shape(128, 64, 384, jnp.bfloat16, kernel_mgpu.Blocks())
    with pytest.raises(ValueError, match="dtype=float32"):
        kernel_mgpu.check_shape(128, 64, 256, jnp.float32, kernel_mgpu.Blocks())


def test_choice():
    """bias+GELU's kernels and XLA's GEMM by default (the fused backward measured equal in the step); the fused
    backward when named, for BERT's feed-forward on Hopper, and never where its shape, order or device does not fit."""
    call = gelu_dense.Call(8192, 4096, 1024, "bfloat16")
    h200 = Device.named("h200")
    assert registry.choose("gelu_dense", call, h200, log_skips=False).impl.name == "split"
    assert registry.choose("gelu_dense", call, h200, impl="mosaic").config == kernel_mgpu.Blocks()
    for odd, why in ((gelu_dense.Call(8192, 4096, 1024, "float32"), "dtype=float32"),
                     (gelu_dense.Call(8192, 4096, 1024, "bfloat16", "SBF"), "x stored SBF into BSD"),
                     (gelu_dense.Call(100, 4096, 1024, "bfloat16"), "rows=100")):
        with pytest.raises(ValueError, match=why):
            registry.choose("gelu_dense", odd, h200, impl="mosaic")
    with pytest.raises(ValueError, match="needs a Hopper"):
        registry.choose("gelu_dense", call, Device.named("cpu"), impl="mosaic")


def test_other_orders_match_reference():
    """x stored SBF into BSD (the layout search's orders) runs `split`, with the reference's math."""
    x, bias, kernel = _inputs((8, 2, 256), 64, seed=9)
    got = gelu_dense.gelu_dense(x, bias, kernel, layout="SBF", out="BSD")
    want = reference.gelu_dense(x, bias, kernel, layout="SBF", out="BSD")
    assert got.shape == (2, 8, 64) and rel(got, want) < 1e-2
