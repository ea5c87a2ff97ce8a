"""The pre-training losses: masked-language-model cross-entropy and next-sentence prediction, in float32."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def nll_and_predictions(logits, labels):
    """(..., V) logits and (...) labels -> float32 nll (...) and int32 argmax predictions (...). On logits split over
    V (the model's tensor-parallel path) GSPMD turns the logsumexp, the label pick and the argmax into local work
    plus all-reduces of one number per row: a vocabulary-parallel cross-entropy."""
    logits = logits.astype(jnp.float32)
    logz = jax.nn.logsumexp(logits, axis=-1)
    label_logit = jnp.take_along_axis(logits, labels[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return logz - label_logit, jnp.argmax(logits, axis=-1).astype(jnp.int32)


def per_example_losses(out, batch):
    """The MLM nll and argmax per masked position and the NSP nll and hit per sequence (float32; packed rows: per
    sample slot, (B, K), unused slots included: weigh them with `nsp_weights`). `out` carries either the MLM head's
    per-position `mlm_nll` and `mlm_predictions` (the model called with `masked_labels`, as the steps do) or its
    logits."""
    labels = batch["masked_labels"]
    if getattr(out, "mlm_nll", None) is not None:
        nll, pred = out.mlm_nll, out.mlm_predictions
    else:
        # The padded logits (their extra columns at float32's min add nothing), split over `tensor` on V.
        padded = getattr(out, "padded_mlm_logits", None)
        nll, pred = nll_and_predictions(out.mlm_logits if padded is None else padded, labels)
    nsp_logits = out.nsp_logits.astype(jnp.float32)
    nsp_nll = (jax.nn.logsumexp(nsp_logits, -1)
               - jnp.take_along_axis(nsp_logits, batch["nsp_labels"][..., None], -1)[..., 0])
    return nll, pred, nsp_nll, jnp.argmax(nsp_logits, -1) == batch["nsp_labels"]


def n_samples(batch):
    """The batch's samples, float32: its rows, or the real samples of packed rows (the sum of `nsp_weights`)."""
    if "nsp_weights" not in batch:
        return jnp.asarray(batch["nsp_labels"].shape[0], jnp.float32)
    return jnp.sum(batch["nsp_weights"])


def nsp_sums(nsp_nll, nsp_hit, batch):
    """The NSP nll and hits summed over the samples of `batch` (every row, or the real samples of packed rows:
    `nsp_weights`), and their count."""
    w = batch.get("nsp_weights", 1.0)
    return jnp.sum(nsp_nll * w), jnp.sum(nsp_hit * w), n_samples(batch)


def pretraining_losses(out, batch) -> tuple[jax.Array, dict[str, jax.Array]]:
    """MLM cross-entropy averaged over real masked positions, NSP cross-entropy over samples (float32): over rows,
    or over the real samples of packed rows (`nsp_weights`). `n_seq` counts samples; `n_tokens` the real (not
    padding) tokens."""
    labels, weights = batch["masked_labels"], batch["masked_weights"]
    nll, pred, nsp_nll, nsp_hit = per_example_losses(out, batch)
    n_masked = jnp.maximum(jnp.sum(weights), 1.0)
    mlm_loss = jnp.sum(nll * weights) / n_masked
    mlm_correct = jnp.sum((pred == labels) * weights)
    nsp_total, nsp_correct, n_seq = nsp_sums(nsp_nll, nsp_hit, batch)
    nsp_loss = nsp_total / jnp.maximum(n_seq, 1.0)
    metrics = dict(loss=mlm_loss + nsp_loss, mlm_loss=mlm_loss, nsp_loss=nsp_loss,
                   mlm_correct=mlm_correct, n_masked=jnp.sum(weights), nsp_correct=nsp_correct, n_seq=n_seq,
                   n_tokens=real_tokens(batch))
    return mlm_loss + nsp_loss, metrics


def real_tokens(batch):
    """The batch's real (not padding) tokens, float32: the sum of its attention mask (all tokens without one)."""
    if "attention_mask" not in batch:
        return jnp.asarray(batch["input_ids"].size, jnp.float32)
    return jnp.sum(batch["attention_mask"].astype(jnp.float32))
