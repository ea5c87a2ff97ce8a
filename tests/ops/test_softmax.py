"""The scaled, masked softmax + dropout on attention scores: the reference's masking, every implementation that runs
here against it, the per-shard run under a mesh, and the compiled kernels on a GPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels.softmax as softmax
from pallas_kernels.dropout import seed_from_key
from pallas_kernels.softmax import reference

from .harness import check_vjp, kernels_here


def _case(shape, dtype, rate, seed, interpret=None, **kw):
    b, n, s, t = shape
    k = jax.random.split(jax.random.key(seed), 4)
    x = 4 * jax.random.normal(k[0], shape, dtype)
    lengths = jnp.array([t, t - 3, 1, 0][:b])  # full, padded, one key, no key at all (uniform, never NaN)
    mask = jnp.arange(t)[None, :] < lengths[:, None]
    drop = dict(scale=s ** -0.5, seed=seed_from_key(k[1]), rate=rate)
    check_vjp(lambda x: softmax.scaled_masked_softmax(x, mask, **drop, interpret=interpret, **kw),
              lambda x: reference.scaled_masked_softmax(x, mask, **drop), (x,), dtype, k[2])


CASES = [
    ((4, 3, 4, 6), jnp.float32, 0.0),
    ((2, 3, 8, 40), jnp.float32, 0.3),
    ((2, 2, 16, 128), jnp.bfloat16, 0.1),
]


@pytest.mark.parametrize("shape,dtype,rate,impl", [(*c, impl) for c in CASES for impl in kernels_here(
    "softmax", softmax.Call(c[0][1] * c[0][2], c[0][3], jnp.dtype(c[1]).name, c[2]))])
@pytest.mark.slow
def test_matches_reference(shape, dtype, rate, impl):
    _case(shape, dtype, rate, seed=shape[-1], impl=impl)


def test_reference_masks_keys_and_rows_sum_to_one():
    scores = jax.random.normal(jax.random.key(5), (2, 3, 4, 6)) * 5
    mask = jnp.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], bool)
    p = np.asarray(reference.scaled_masked_softmax(scores, mask, scale=0.5))
    assert np.all(p[0, :, :, 4:] == 0)
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(p[1], jax.nn.softmax(np.asarray(scores[1]) * 0.5, axis=-1), rtol=1e-6)


def test_runs_per_batch_shard():
    """Under a data mesh the kernels run inside shard_map (no gathered inputs), with the unsharded results."""
    mesh = jax.make_mesh((4,), ("data",))
    k = jax.random.split(jax.random.key(13), 3)
    seed = seed_from_key(k[2])
    x = jax.random.normal(k[0], (8, 2, 4, 16))
    mask = jnp.arange(16)[None, :] < jnp.arange(2, 18, 2)[:, None]

    def loss(f, x):
        y = f(x, mask, scale=0.5, seed=seed, rate=0.2)
        return jnp.sum(y * jnp.sin(jnp.arange(y.size).reshape(y.shape)))

    grad = jax.jit(jax.value_and_grad(loss, argnums=1), static_argnums=0)
    expected = grad(reference.scaled_masked_softmax, x)
    sharded = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data")))
    with jax.set_mesh(mesh):
        got = grad(softmax.scaled_masked_softmax, sharded)
        assert "shard_map" in str(jax.make_jaxpr(lambda x: loss(softmax.scaled_masked_softmax, x))(sharded))
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-5)
    np.testing.assert_allclose(got[1], expected[1], rtol=2e-5, atol=2e-5)


def test_bad_shapes_are_named():
    with pytest.raises(ValueError, match="mask.shape"):
        softmax.scaled_masked_softmax(jnp.ones((2, 2, 4, 4)), jnp.ones((2, 5), bool), scale=1.0)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(4, 16, 128, 128), (4, 16, 512, 512), (3, 12, 128, 128)])
def test_compiled_matches_reference_on_gpu(shape):
    _case(shape, jnp.bfloat16, 0.1, seed=shape[-1], interpret=False)
    _case(shape, jnp.float32, 0.0, seed=shape[-1] + 1, interpret=False)
