"""Bias + exact GELU (+ dropout) (Ivanov et al.'s BAD/BRD): `dropout(gelu(x + bias))`."""

from .reference import bias_gelu

__all__ = ["bias_gelu"]
