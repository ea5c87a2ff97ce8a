"""Parameter constructors: every Param carries its logical axis names (the dimension letters), which
`jaxformer.sharding.PARAM_RULES` maps to mesh axes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from .config import BertConfig


def param(value, names: str) -> nnx.Param:
    """A Param with logical names `names` (one letter per axis, "_" for an axis no rule splits), stored as Flax's
    `out_sharding` metadata. Not sharded eagerly: the trainer places the parameters on its mesh."""
    if len(names) != value.ndim:
        raise ValueError(f"names={names!r} must name the {value.ndim} axes of a parameter of shape {value.shape}")
    return nnx.Param(value, eager_sharding=False, out_sharding=tuple(None if c == "_" else c for c in names))


def normal(rngs: nnx.Rngs, shape, config: BertConfig, names: str) -> nnx.Param:
    """Hugging Face's initialisation: N(0, initializer_range) for weight matrices and embeddings."""
    return param(config.initializer_range * jax.random.normal(rngs.params(), shape, config.parameter_dtype), names)


def zeros(shape, config: BertConfig, names: str) -> nnx.Param:
    return param(jnp.zeros(shape, config.parameter_dtype), names)


def ones(shape, config: BertConfig, names: str) -> nnx.Param:
    return param(jnp.ones(shape, config.parameter_dtype), names)


class LayerNormParams(nnx.Module):
    """Scale and bias of a layernorm; the normalisation itself runs inside the fused operators."""

    def __init__(self, config: BertConfig):
        self.scale = ones((config.hidden_size,), config, "D")
        self.bias = zeros((config.hidden_size,), config, "D")
