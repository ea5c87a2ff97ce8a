"""The XLA reference operators and the counter-based dropout they share with the kernels."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer import ops
from pallas_kernels import dropout as dr
from pallas_kernels.bias_dropout_residual_layernorm.reference import bias_dropout_residual_layernorm
from pallas_kernels.softmax.reference import scaled_masked_softmax


def _seed(i):
    return dr.seed_from_key(jax.random.key(i))


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_dropout_keep_rate(rate):
    index = jnp.arange(1 << 20, dtype=jnp.uint32)
    keep = np.asarray(dr.keep_mask(_seed(0), index, rate))
    # 1M Bernoulli draws: the standard error of the kept fraction is below 5e-4.
    assert abs(keep.mean() - (1 - rate)) < 3e-3


def test_dropout_masks_independent_across_seeds_and_layers():
    index = jnp.arange(1 << 18, dtype=jnp.uint32)
    base = jax.random.key(3)
    masks = [np.asarray(dr.keep_mask(dr.seed_from_key(jax.random.fold_in(base, layer)), index, 0.5))
             for layer in range(4)]
    masks.append(np.asarray(dr.keep_mask(_seed(4), index, 0.5)))
    for i in range(len(masks)):
        for j in range(i + 1, len(masks)):
            corr = np.corrcoef(masks[i].astype(np.float32), masks[j].astype(np.float32))[0, 1]
            assert abs(corr) < 0.01, (i, j, corr)
    # Neighbouring elements are not correlated either.
    m = masks[0].astype(np.float32)
    assert abs(np.corrcoef(m[:-1], m[1:])[0, 1]) < 0.01


def test_dropout_scales_kept_values():
    x = jax.random.normal(jax.random.key(1), (64, 128))
    y = dr.dropout(x, _seed(1), 0.25)
    kept = np.asarray(y) != 0
    np.testing.assert_allclose(np.asarray(y)[kept], np.asarray(x)[kept] / 0.75, rtol=1e-6)
    assert 0.7 < kept.mean() < 0.8


def test_bdrln_normalises_rows_and_matches_numpy():
    k = jax.random.split(jax.random.key(2), 5)
    x, res = jax.random.normal(k[0], (2, 5, 96)), jax.random.normal(k[1], (2, 5, 96))
    bias, scale, shift = (jax.random.normal(k[i], (96,)) for i in (2, 3, 4))
    out = bias_dropout_residual_layernorm(x, bias, res, scale, shift, seed=None, rate=0.0, eps=1e-12)
    h = np.asarray(x, np.float64) + np.asarray(bias, np.float64) + np.asarray(res, np.float64)
    ref = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-12)
    ref = ref * np.asarray(scale) + np.asarray(shift)
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-5, atol=1e-5)


def test_softmax_masks_keys_and_rows_sum_to_one():
    scores = jax.random.normal(jax.random.key(5), (2, 3, 4, 6)) * 5
    mask = jnp.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], bool)
    p = np.asarray(scaled_masked_softmax(scores, mask, scale=0.5))
    assert np.all(p[0, :, :, 4:] == 0)
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-6)
    ref = jax.nn.softmax(np.asarray(scores[1]) * 0.5, axis=-1)
    np.testing.assert_allclose(p[1], ref, rtol=1e-6)


def test_select_names_missing_operator():
    assert ops.select("xla").bias_gelu is not None
    assert ops.select("pallas").bias_gelu is not ops.select("xla").bias_gelu
    expected = "pallas" if jax.default_backend() == "gpu" else "xla"
    assert ops.select("auto").bias_gelu is ops.select(expected).bias_gelu
    with pytest.raises(ValueError, match="kernels='cuda'"):
        ops.select("cuda")


def test_auto_is_pallas_on_a_gpu_except_with_sequence_parallelism(monkeypatch):
    from jaxformer import sharding
    assert ops.resolve("auto") == ("pallas" if jax.default_backend() == "gpu" else "xla")
    monkeypatch.setattr(ops.jax, "default_backend", lambda: "gpu")  # the rule, as a GPU would see it
    assert ops.resolve("auto") == "pallas" and ops.resolve("xla") == "xla"
    with jax.set_mesh(sharding.make_mesh("data=4,pipeline=2", jax.devices()[:8])):
        # Pipelines too, since batch_shard_map's fix (measured faster: benchmarks/results/distributed-2xh200.md)
        assert ops.resolve("auto") == "pallas"
        assert ops.resolve("xla") == "xla"  # an explicit choice is kept
    with jax.set_mesh(sharding.make_mesh("data=8", jax.devices()[:8])):
        assert ops.resolve("auto") == "pallas"
        with sharding.sequence_parallel():  # S split over tensor: the kernels' shard_map splits only B
            assert ops.resolve("auto") == "xla"
