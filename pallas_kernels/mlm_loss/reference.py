"""Reference MLM cross-entropy in jax.numpy: materialises the float32 logits (..., V), as `MLMHead` does today."""

import jax
import jax.numpy as jnp


def mlm_cross_entropy(h, embedding, output_bias, labels, *, vocab_size=None):
    """Per-position softmax cross-entropy of the tied MLM decoder and its argmax prediction.

    Args:
      h: (..., D) hidden states after the head's layernorm, in the compute dtype.
      embedding: (V, D) word embeddings (the tied decoder); cast to h's dtype for the dot, as in `MLMHead`.
      output_bias: (V,) decoder bias, added in float32.
      labels: (...) int labels in [0, V).
      vocab_size: columns at and past it are padding, set to float32's min as `MLMHead` does (default: V).

    Returns:
      nll: float32 (...) = logsumexp(logits) - logits[label].
      predictions: int32 (...) = argmax(logits) (first index on ties).
    """
    logits = jnp.einsum("...D,VD->...V", h, embedding.astype(h.dtype), preferred_element_type=jnp.float32)
    logits = logits + output_bias.astype(jnp.float32)
    if vocab_size is not None:
        logits = jnp.where(jnp.arange(logits.shape[-1]) < vocab_size, logits, jnp.finfo(jnp.float32).min)
    return nll_and_predictions(logits, labels)


def nll_and_predictions(logits, labels):
    """(..., V) logits and (...) labels -> float32 nll (...) and int32 argmax predictions (...). On logits split over
    V (the model's tensor-parallel path) GSPMD turns the logsumexp, the label pick and the argmax into local work
    plus all-reduces of one number per row: a vocabulary-parallel cross-entropy."""
    logits = logits.astype(jnp.float32)
    logz = jax.nn.logsumexp(logits, axis=-1)
    label_logit = jnp.take_along_axis(logits, labels[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return logz - label_logit, jnp.argmax(logits, axis=-1).astype(jnp.int32)
