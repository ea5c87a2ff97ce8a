"""The whole model with kernels="pallas" (interpret mode here) against kernels="xla": outputs and gradients, with
dropout on and off (the kernels draw the references' counter-based masks), and the MLM loss without its logits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxformer import BertConfig, BertForPreTraining

from .harness import rel as _rel


@pytest.mark.slow
def test_pallas_equals_xla():
    """The whole model with kernels='pallas' equals kernels='xla': outputs and gradients with dropout off,
    and, with dropout on, the same masks (the kernels draw the references' counter-based masks)."""
    ids = jax.random.randint(jax.random.key(0), (2, 16), 0, 97)
    types = jnp.zeros_like(ids)
    mask = jnp.ones_like(ids).at[1, 9:].set(0)
    models = {k: BertForPreTraining(BertConfig.preset("tiny", dtype="float32", vocab_size=97,
                                                      max_position_embeddings=32, kernels=k), rngs=nnx.Rngs(0))
              for k in ("xla", "pallas")}

    def loss(model, deterministic):
        out = model(ids, types, mask, deterministic=deterministic, dropout_key=jax.random.key(5))
        return jnp.sum(out.mlm_logits * 1e-2) + jnp.sum(out.nsp_logits)

    grad = nnx.jit(nnx.value_and_grad(loss), static_argnums=1)
    with jax.default_matmul_precision("highest"):
        for deterministic in (True, False):
            res = {k: grad(m, deterministic) for k, m in models.items()}
            assert _rel(res["pallas"][0], res["xla"][0]) < 1e-5
            leaves = zip(jax.tree.leaves(nnx.state(res["pallas"][1])), jax.tree.leaves(nnx.state(res["xla"][1])))
            for a, b in leaves:
                assert _rel(a, b) < 1e-4


@pytest.mark.slow
def test_mlm_cross_entropy_pallas_equals_xla_and_logits():
    """The train step's MLM loss (the model called with masked_labels): the cross-entropy of kernels='pallas' (in
    float32 the chunked loss; the fused kernels' case is the next test) equals kernels='xla' and the loss on the
    logits (values, predictions, gradients), and its program holds no (B, P, V) logits as the reference's does.
    V = 200 is padded to 256: the padded columns must stay out of both."""
    ids = jax.random.randint(jax.random.key(0), (2, 16), 0, 200)
    types, mask = jnp.zeros_like(ids), jnp.ones_like(ids).at[1, 9:].set(0)
    pos = jnp.array([[1, 4, 8, 15], [0, 2, 3, 8]])
    labels = jnp.array([[199, 0, 5, 50], [7, 198, 199, 1]])
    weights = jnp.array([[1.0, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    models = {k: BertForPreTraining(BertConfig.preset("tiny", dtype="float32", vocab_size=200,
                                                      max_position_embeddings=32, kernels=k), rngs=nnx.Rngs(0))
              for k in ("xla", "pallas")}

    def loss(model, via_labels):
        if via_labels:
            out = model(ids, types, mask, pos, masked_labels=labels)
            nll, pred = out.mlm_nll, out.mlm_predictions
            assert out.mlm_logits is None
        else:
            logits = model(ids, types, mask, pos).mlm_logits
            nll = jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, labels[..., None], -1)[..., 0]
            pred = jnp.argmax(logits, -1)
        return jnp.sum(nll * weights), pred

    with jax.default_matmul_precision("highest"):
        grad = nnx.jit(nnx.value_and_grad(loss, has_aux=True), static_argnums=1)
        ref = grad(models["xla"], False)
        for k, via in (("xla", True), ("pallas", True)):
            (val, pred), grads = grad(models[k], via)
            assert _rel(val, ref[0][0]) < 1e-5, k
            np.testing.assert_array_equal(pred, ref[0][1])
            for a, b in zip(jax.tree.leaves(nnx.state(grads)), jax.tree.leaves(nnx.state(ref[1]))):
                assert _rel(a, b) < 1e-4, k

    def shapes(kernels):
        graphdef, state = nnx.split(models[kernels])
        jaxpr = jax.make_jaxpr(lambda st: nnx.merge(graphdef, st)(ids, types, mask, pos, masked_labels=labels))(state)
        return {tuple(v.aval.shape) for eqn in jaxpr.jaxpr.eqns for v in eqn.outvars}
    assert (2, 4, 256) in shapes("xla") and (2, 4, 256) not in shapes("pallas")


@pytest.mark.slow
def test_mlm_cross_entropy_fused_in_bf16():
    """In bfloat16 (the default compute dtype) kernels='pallas' runs the fused MLM kernels (interpret mode here): the
    loss, its gradients and the predictions against kernels='xla' on the same weights, V = 200 padded to 256."""
    ids = jax.random.randint(jax.random.key(1), (2, 16), 0, 200)
    types, mask = jnp.zeros_like(ids), jnp.ones_like(ids)
    pos = jnp.array([[1, 4, 8, 15], [0, 2, 3, 8]])
    labels = jnp.array([[199, 0, 5, 50], [7, 198, 199, 1]])
    models = {k: BertForPreTraining(BertConfig.preset("tiny", dtype="bfloat16", vocab_size=200,
                                                      max_position_embeddings=32, kernels=k), rngs=nnx.Rngs(0))
              for k in ("xla", "pallas")}

    def loss(model):
        out = model(ids, types, mask, pos, masked_labels=labels)
        return jnp.sum(out.mlm_nll), (out.mlm_nll, out.mlm_predictions)

    res = {k: nnx.jit(nnx.value_and_grad(loss, has_aux=True))(m) for k, m in models.items()}
    (_, (nll, pred)), grads = res["pallas"]
    (_, (nll_ref, pred_ref)), grads_ref = res["xla"]
    assert _rel(nll, nll_ref) < 5e-4  # measured 9e-5: the layers' bf16 kernels differ in rounding, not the loss
    np.testing.assert_array_equal(np.asarray(pred), np.asarray(pred_ref))
    for a, b in zip(jax.tree.leaves(nnx.state(grads)), jax.tree.leaves(nnx.state(grads_ref))):
        assert _rel(a, b) < 3e-2  # measured at most 9e-3


