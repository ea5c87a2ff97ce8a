"""MLM cross-entropy of the tied decoder without materialising float32 logits for the whole vocabulary.

Why: the MLM head's logits are (rows, V) float32. At BERT's 1280 masked rows per step (64 x 20) and V = 30522 they
are 1280 * 30522 * 4 B = 156 MB, written by the GEMM, read by logsumexp, the label gather and argmax, kept for the
backward, then read again and a same-sized d_logits written and read twice (dh and dE GEMMs): of the order of a
gigabyte of traffic, and the largest single activation of the step, for an operator whose outputs are a few numbers
per row.
`mlm_cross_entropy_chunked` walks the vocabulary in chunks with an online logsumexp and a running argmax, saves only
the float32 logsumexp per row, and recomputes each chunk's logits in the backward (one extra GEMM of 2*N*V*D flop,
cheap next to the bytes it saves).

- `reference.mlm_cross_entropy`: the ground truth, materialises the logits (the model's current math).
- `chunked.mlm_cross_entropy_chunked`: pure JAX (`lax.scan` + `jax.custom_vjp`; XLA does the GEMMs).
- `fused.mlm_cross_entropy_fused`: Pallas kernels (`kernel.py`) whose GEMM tiles reduce to the loss in registers;
  the backward writes d_logits in the compute dtype for two XLA GEMMs. The `pallas` row of `jaxformer/ops.py`.
"""

from .chunked import mlm_cross_entropy_chunked
from .fused import mlm_cross_entropy_fused
from .reference import mlm_cross_entropy

__all__ = ["mlm_cross_entropy", "mlm_cross_entropy_chunked", "mlm_cross_entropy_fused"]
