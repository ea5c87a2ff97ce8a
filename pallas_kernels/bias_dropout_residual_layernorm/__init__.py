"""Bias + dropout + residual + layernorm (Ivanov et al.'s BDRLN): `LN(residual + dropout(x + bias))`."""

from .reference import bias_dropout_residual_layernorm, layer_norm

__all__ = ["bias_dropout_residual_layernorm", "layer_norm"]
