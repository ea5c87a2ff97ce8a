"""Embedding sum + layernorm + dropout: `dropout(LN(word + position + token_type))`."""

from .reference import embedding_layernorm

__all__ = ["embedding_layernorm"]
