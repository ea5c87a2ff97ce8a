"""BERT for pre-training (MLM + NSP) in Flax NNX: embeddings, the encoder stack, the pooler and the two heads.

The encoder layer itself is `jaxformer/layer.py`. Every contraction is an einsum in the dimension letters (B batch,
S query position, T key position, D model width, N heads, H head width, F feed-forward width, V vocabulary, L layers,
C the Q/K/V component, P masked positions); every memory-bound operator is called through `jaxformer.ops`, which
picks the XLA reference or a fused Pallas kernel. Parameters are stored in `param_dtype` (float32) and cast to the
compute `dtype` at use.

The layers' parameters are stacked on a leading L axis; the layers run one after another on slices of them, or in a
`jax.lax.scan` with `BertConfig.scan_layers` (its compile time does not grow with depth, but its stacked residual
buffers cost ~20% of a BERT-large step).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp
from flax import nnx

import layouts.einsum as lx
from pallas_kernels.dropout import seed_from_key
from pallas_kernels.mesh import current_mesh

from . import ops
from .config import BertConfig
from .layer import EncoderLayer
from .losses import nll_and_predictions
from .params import LayerNormParams, normal, param, zeros
from .pipeline import Pipeline
from .sharding import PARAM_RULES, constrain, logical_to_spec


class Embeddings(nnx.Module):
    """Word + position + token-type embeddings, then layernorm and dropout."""

    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.config = config
        d = config.hidden_size
        # VD, tied to the MLM decoder; rows padded with zeros to padded_vocab_size (no token id reaches them)
        word = normal(rngs, (config.vocab_size, d), config, "VD")[...]
        self.word = param(jnp.pad(word, ((0, config.padded_vocab_size - config.vocab_size), (0, 0))), "VD")
        self.position = normal(rngs, (config.max_position_embeddings, d), config, "_D")
        self.token_type = normal(rngs, (config.type_vocab_size, d), config, "_D")
        self.layer_norm = LayerNormParams(config)

    def __call__(self, input_ids, token_type_ids, *, seed, rate: float, position_ids=None):
        """`position_ids` (B, S): each token's position (packed rows restart at each sample); None: 0..S-1."""
        cfg = self.config
        s = input_ids.shape[1]
        # The word (VD) and token-type (_D) rows are gathered inside the operator (a fused kernel under pallas), and
        # with position_ids the position rows too.
        position = self.position[:s] if position_ids is None else self.position[...]
        return constrain(ops.select(cfg.kernels).embedding_layernorm(
            input_ids, token_type_ids, self.word[...], position, self.token_type[...],
            self.layer_norm.scale[...], self.layer_norm.bias[...], seed=seed, rate=rate, eps=cfg.layer_norm_eps,
            dtype=cfg.compute_dtype, position_ids=position_ids), "BSD", between_blocks=True)


_REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


class Encoder(nnx.Module):
    """`num_hidden_layers` EncoderLayers whose parameters are stacked on a leading L axis, run in a Python loop over
    the layers or in a scan (`BertConfig.scan_layers`)."""

    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.config = config

        @nnx.split_rngs(splits=config.num_hidden_layers)
        @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "L"})  # names: L + layer's
        def make_layers(rngs):
            return EncoderLayer(config, rngs=rngs)

        self.layers = make_layers(rngs)

    def __call__(self, x, mask, *, key, deterministic: bool, pipeline: Optional[Pipeline] = None,
                 segments: bool = False):
        """`mask`: the key mask (B, S), or with `segments` the int32 segment ids (B, S) of packed rows."""
        cfg = self.config
        layout = cfg.layout_config.x  # the layers' stored order of x (a transpose in and out when not BSD)
        graphdef, state = nnx.split(self.layers)
        if pipeline is not None and not pipeline.is_plain:  # microbatches through stages: jaxformer/pipeline.py
            def layer_fn(layer_state, h, mask, key):
                # The pipeline splits microbatches on B: keep BSD between layers here, the layer's order inside.
                h = lx.annotate(h, "BSD").to(layout)
                h = nnx.merge(graphdef, layer_state)(h, mask, key=key, deterministic=deterministic,
                                                     segments=segments)
                return lx.annotate(h, layout).to("BSD")

            policy = _REMAT_POLICIES[cfg.remat] if cfg.remat != "none" else None
            return pipeline.run(layer_fn, state, x, mask, key=key, remat_policy=policy)

        def body(h, xs):
            layer_state, index = xs
            layer = nnx.merge(graphdef, layer_state)
            # The dropout key of layer l is fold_in(key, l): masks are independent across layers.
            return layer(h, mask, key=jax.random.fold_in(key, index), deterministic=deterministic,
                         segments=segments), None

        # Remat runs the layers in the scan: in the unrolled loop XLA scheduled each layer's recomputation next to its
        # forward pass (prevent_cse or not) and kept every activation, the peak of no remat (test_model.py).
        scan = cfg.scan_layers or cfg.remat != "none"
        if cfg.remat != "none":
            body = jax.checkpoint(body, policy=_REMAT_POLICIES[cfg.remat], prevent_cse=False)
        x = lx.annotate(x, "BSD").to(layout)
        if scan:
            x, _ = jax.lax.scan(body, x, (state, jnp.arange(cfg.num_hidden_layers)))
        else:  # layer by layer on slices of the stacked parameters: no stacked residual buffers (BertConfig)
            # One `lax.split` per parameter, not L slices: the gradient is then one concatenate of the L layers'
            # gradients; L slices transpose to L zero-pads summed, which XLA left as a 24-way pad+add chain fused
            # into the gradient norm (2.3 ms of BERT-large's 37 ms step: benchmarks/results/train-h200.md, the layer
            # loop's gradients).
            leaves, treedef = jax.tree.flatten(state)
            parts = [jax.lax.split(a, [1] * cfg.num_hidden_layers) for a in leaves]
            for index in range(cfg.num_hidden_layers):
                layer = treedef.unflatten([jax.lax.squeeze(p[index], (0,)) for p in parts])
                x, _ = body(x, (layer, index))
        return lx.annotate(x, layout).to("BSD")


class Pooler(nnx.Module):
    """tanh(dense) of the [CLS] position (packed rows: of each sample's [CLS]), input of the NSP head."""

    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.kernel = normal(rngs, (config.hidden_size, config.hidden_size), config, "D_")  # DD
        self.bias = zeros((config.hidden_size,), config, "D")

    def __call__(self, x, positions=None):
        """x (B, S, D) -> (B, D) at position 0, or with `positions` (B, K) -> (B, K, D) at those positions."""
        dt = self.config.compute_dtype
        if positions is None:
            cls = x[:, 0]  # BD
            return jnp.tanh(jnp.einsum("BD,DE->BE", cls, self.kernel[...].astype(dt)) + self.bias[...].astype(dt))
        cls = jnp.take_along_axis(x, positions[..., None].astype(jnp.int32), axis=1)  # BKD
        return jnp.tanh(jnp.einsum("BKD,DE->BKE", cls, self.kernel[...].astype(dt)) + self.bias[...].astype(dt))


class MLMHead(nnx.Module):
    """Dense + GELU + layernorm, then the decoder tied to the word embeddings plus an output bias."""

    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.config = config
        d = config.hidden_size
        self.kernel = normal(rngs, (d, d), config, "D_")  # DD
        self.bias = zeros((d,), config, "D")
        self.layer_norm = LayerNormParams(config)
        self.output_bias = zeros((config.padded_vocab_size,), config, "V")  # V, padded like the embeddings

    def transform(self, x):
        """x: (B, P, D) -> the decoder's input h (B, P, D): dense, bias + GELU, layernorm, in the compute dtype."""
        cfg, dt = self.config, self.config.compute_dtype
        f = ops.select(cfg.kernels)
        h = f.bias_gelu(jnp.einsum("BPD,DE->BPE", x, self.kernel[...].astype(dt)), self.bias[...])
        return f.layer_norm(h, self.layer_norm.scale[...], self.layer_norm.bias[...], eps=cfg.layer_norm_eps)

    def __call__(self, x, word_embeddings):
        """x: (B, P, D) hidden states; returns float32 logits (B, P, padded V), the padded columns at float32's min
        (they never win an argmax and add nothing to a logsumexp)."""
        cfg, dt = self.config, self.config.compute_dtype
        logits = jnp.einsum("BPD,VD->BPV", self.transform(x), word_embeddings.astype(dt),
                            preferred_element_type=jnp.float32)
        logits = constrain(logits + self.output_bias[...].astype(jnp.float32), "BPV")  # V split over tensor
        real = jnp.arange(logits.shape[-1]) < cfg.vocab_size
        return jnp.where(real, logits, jnp.finfo(jnp.float32).min)

    def cross_entropy(self, x, word_embeddings, labels):
        """x: (B, P, D), labels (B, P) -> float32 nll (B, P) and int32 argmax predictions (B, P), through the
        `mlm_cross_entropy` operator of `jaxformer.ops` (pallas: fused kernels, no (B, P, V) logits). With the
        vocabulary split over `tensor` it stays on the logits (`__call__`): a vocabulary-parallel cross-entropy
        whose only communication is B*P numbers per reduction (Megatron), where chunks would gather the table."""
        cfg = self.config
        mesh = current_mesh()
        if mesh is not None and logical_to_spec("V", PARAM_RULES, mesh, word_embeddings.shape[:1])[0] is not None:
            return nll_and_predictions(self(x, word_embeddings), labels)
        f = ops.select(cfg.kernels)
        return f.mlm_cross_entropy(self.transform(x), word_embeddings, self.output_bias[...], labels,
                                   vocab_size=cfg.vocab_size)


class NSPHead(nnx.Module):
    """Two-way classifier on the pooled [CLS] state (0: B follows A, 1: B is random, as Hugging Face)."""

    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.kernel = normal(rngs, (config.hidden_size, 2), config, "D_")
        self.bias = zeros((2,), config, "_")

    def __call__(self, pooled):
        """pooled (B, D) or (B, K, D) (a packed row's samples) -> float32 logits (B, 2) or (B, K, 2)."""
        dt = self.config.compute_dtype
        logits = jnp.einsum("...D,DC->...C", pooled, self.kernel[...].astype(dt), preferred_element_type=jnp.float32)
        return logits + self.bias[...].astype(jnp.float32)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PreTrainingOutput:
    """Outputs of `BertForPreTraining`: float32 `mlm_logits` (B, P, V) or (B, S, V), float32 `nsp_logits` (B, 2)
    (packed rows: (B, K, 2), a pair per sample),
    and the final hidden states (B, S, D) in the compute dtype. Called with `masked_labels`, the model returns the
    MLM head's per-position float32 `mlm_nll` and int32 `mlm_predictions` (B, P) instead of the logits (None)."""

    mlm_logits: Optional[jax.Array]
    nsp_logits: jax.Array
    hidden_states: jax.Array
    # (B, P, padded V): what the loss uses, so the tensor-split vocabulary is never gathered (the slice to V is not
    # even over `tensor`); padded columns hold float32's min.
    padded_mlm_logits: Optional[jax.Array] = None
    mlm_nll: Optional[jax.Array] = None
    mlm_predictions: Optional[jax.Array] = None


class BertForPreTraining(nnx.Module):
    """BERT with its masked-language-model and next-sentence-prediction heads.

    Build with `BertForPreTraining(config, rngs=nnx.Rngs(seed))`. Dropout draws its keys from the `dropout`
    stream of those rngs (falling back to the default stream), or from an explicit `dropout_key`.
    """

    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        ops.select(config.kernels)  # fail early, naming the missing operator, if the kernels are unavailable
        self.config = config
        self.embeddings = Embeddings(config, rngs=rngs)
        self.encoder = Encoder(config, rngs=rngs)
        self.pooler = Pooler(config, rngs=rngs)
        self.mlm_head = MLMHead(config, rngs=rngs)
        self.nsp_head = NSPHead(config, rngs=rngs)
        self.dropout_rngs = rngs["dropout"].fork()

    def __call__(self, input_ids, token_type_ids=None, attention_mask=None, masked_positions=None, *,
                 deterministic: bool = True, dropout_key: Optional[jax.Array] = None,
                 pipeline: Optional[Pipeline] = None, masked_labels=None, position_ids=None, segment_ids=None,
                 nsp_positions=None) -> PreTrainingOutput:
        """Run the model.

        Args:
          input_ids: (B, S) int token ids.
          token_type_ids: (B, S) segment ids (default all 0).
          attention_mask: (B, S), 1 (True) at real tokens and 0 at padding (default all real).
          masked_positions: optional (B, P) positions at which to run the MLM head; without it, every position.
          deterministic: True disables dropout (evaluation).
          dropout_key: optional PRNG key for dropout; by default one is drawn from the model's `dropout` stream.
          pipeline: optional `Pipeline` schedule for the encoder layers (None: the plain layer stack); the embeddings
            and heads run outside it, replicated over the `pipeline` mesh axis.
          masked_labels: optional (B, P) int labels at `masked_positions`: the MLM head then returns the per-position
            cross-entropy and argmax (`mlm_nll`, `mlm_predictions`) and no logits, which with `kernels="pallas"`
            are never materialised (`MLMHead.cross_entropy`). What the train and eval steps use.
          position_ids: optional (B, S) positions (packed rows: restarting at 0 at each sample's [CLS]); default
            0..S-1 in every row.
          segment_ids: optional (B, S) int sample of each token in a packed row (1..K, 0 at padding): a token attends
            only to the tokens of its own sample, a padding token to the padding (replaces `attention_mask`).
          nsp_positions: optional (B, K) positions of each sample's [CLS] (packed rows): the pooler and NSP head run
            there, giving `nsp_logits` (B, K, 2); default position 0, (B, 2).
        """
        cfg = self.config
        if input_ids.ndim != 2:
            raise ValueError(f"input_ids must be (batch, seq), got shape {input_ids.shape}")
        b, s = input_ids.shape
        if s > cfg.max_position_embeddings:
            raise ValueError(f"sequence length {s} exceeds max_position_embeddings={cfg.max_position_embeddings}")
        if pipeline is not None:
            pipeline.check(cfg.num_hidden_layers, b)
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(input_ids)
        for name, value in (("position_ids", position_ids), ("segment_ids", segment_ids)):
            if value is not None and value.shape != (b, s):
                raise ValueError(f"{name} must have input_ids' shape {(b, s)}, got {value.shape}")
        if nsp_positions is not None and (nsp_positions.ndim != 2 or nsp_positions.shape[0] != b):
            raise ValueError(f"nsp_positions must be (batch, samples per row) = ({b}, K), got {nsp_positions.shape}")
        if segment_ids is not None:  # packed rows: the attention mask is the segment ids
            mask = segment_ids.astype(jnp.int32)
        elif attention_mask is None:
            mask = jnp.ones((b, s), jnp.bool_)
        else:
            mask = attention_mask.astype(jnp.bool_)

        if deterministic:
            key = jax.random.key(0)  # unused: every dropout rate is 0
        else:
            key = self.dropout_rngs() if dropout_key is None else dropout_key
        emb_key, enc_key = jax.random.split(key)
        emb_rate = 0.0 if deterministic else cfg.hidden_dropout_prob
        x = self.embeddings(input_ids, token_type_ids, seed=seed_from_key(emb_key), rate=emb_rate,
                            position_ids=position_ids)
        x = self.encoder(x, mask, key=enc_key, deterministic=deterministic, pipeline=pipeline,
                         segments=segment_ids is not None)

        if masked_positions is None:
            selected = x
        else:
            selected = jnp.take_along_axis(x, masked_positions[..., None].astype(jnp.int32), axis=1)  # BPD
        nsp_logits = self.nsp_head(self.pooler(x, nsp_positions))
        if masked_labels is not None:
            if masked_labels.shape != selected.shape[:-1]:
                raise ValueError(f"masked_labels shape {masked_labels.shape} must be {selected.shape[:-1]} (the "
                                 f"masked positions' shape, or (B, S) without masked_positions)")
            nll, pred = self.mlm_head.cross_entropy(selected, self.embeddings.word[...], masked_labels)
            return PreTrainingOutput(mlm_logits=None, nsp_logits=nsp_logits, hidden_states=x, mlm_nll=nll,
                                     mlm_predictions=pred)
        padded = self.mlm_head(selected, self.embeddings.word[...])
        return PreTrainingOutput(mlm_logits=padded[..., :cfg.vocab_size], nsp_logits=nsp_logits, hidden_states=x,
                                 padded_mlm_logits=padded)
