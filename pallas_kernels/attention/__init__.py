"""Multi-head self-attention core: softmax(QK^T/sqrt(H), padding mask) with dropout, times V."""

from .reference import attention

__all__ = ["attention"]
