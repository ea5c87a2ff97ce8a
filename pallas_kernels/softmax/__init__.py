"""Scaled, masked softmax + dropout on attention scores (Ivanov et al.'s SM forward, BS backward)."""

from .reference import scaled_masked_softmax

__all__ = ["scaled_masked_softmax"]
