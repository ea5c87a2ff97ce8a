"""The model compiled for a real GPU: BERT-large forward and gradient in bf16 (skipped without a GPU)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxformer import BertConfig, BertForPreTraining
from jaxformer.losses import pretraining_losses
from jaxformer.steps import build_model

pytestmark = pytest.mark.gpu


def _batch(cfg, b=8, s=128, p=20, seed=0):
    rng = np.random.RandomState(seed)
    mask = np.ones((b, s), np.int32)
    mask[: b // 2, s * 3 // 4:] = 0
    return dict(input_ids=jnp.asarray(rng.randint(0, cfg.vocab_size, (b, s)), jnp.int32),
                token_type_ids=jnp.asarray(rng.randint(0, 2, (b, s)), jnp.int32),
                attention_mask=jnp.asarray(mask),
                masked_positions=jnp.asarray(rng.randint(0, s * 3 // 4, (b, p)), jnp.int32),
                masked_labels=jnp.asarray(rng.randint(0, cfg.vocab_size, (b, p)), jnp.int32),
                masked_weights=jnp.ones((b, p), jnp.float32),
                nsp_labels=jnp.asarray(rng.randint(0, 2, (b,)), jnp.int32))


def test_large_forward_and_gradient_bf16_on_gpu():
    assert jax.devices()[0].platform == "gpu"
    cfg = BertConfig.preset("large")
    model = build_model(cfg, seed=0)
    batch = _batch(cfg)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    @jax.jit
    def loss_and_grad(params, batch):
        def loss_fn(p):
            m = nnx.merge(graphdef, p, rest)
            out = m(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], batch["masked_positions"],
                    deterministic=False, dropout_key=jax.random.key(1))
            return pretraining_losses(out, batch)[0]
        return jax.value_and_grad(loss_fn)(params)

    loss, grads = loss_and_grad(params, batch)
    assert np.isfinite(float(loss))
    # At initialisation the MLM loss is close to log(V) and NSP to log(2).
    assert abs(float(loss) - (np.log(cfg.vocab_size) + np.log(2))) < 1.0
    norms = [float(jnp.linalg.norm(g)) for g in jax.tree.leaves(grads)]
    assert all(np.isfinite(norms)) and sum(n > 0 for n in norms) == len(norms)

    # bf16 forward agrees with an fp32 forward of the same weights within bf16 accuracy.
    rel = float(_relative_error(logits(cfg, params, rest, batch), logits(cfg.replace(dtype="float32"), params, rest,
                                                                         batch)))
    assert rel < 3e-2, rel


def logits(cfg, params, rest, batch):
    """MLM logits of `params` under a model of config `cfg` (its graph built abstractly, no second init)."""
    graphdef, _, _ = nnx.split(nnx.eval_shape(lambda: BertForPreTraining(cfg, rngs=nnx.Rngs(0))), nnx.Param, ...)
    run = jax.jit(lambda p: nnx.merge(graphdef, p, rest)(
        batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], batch["masked_positions"]).mlm_logits)
    return run(params)


def _relative_error(a, b):
    return jnp.linalg.norm(a - b) / jnp.linalg.norm(b)
