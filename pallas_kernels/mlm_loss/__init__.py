"""MLM cross-entropy of the tied decoder without materialising float32 logits for the whole vocabulary.

Why: the MLM head's logits are (rows, V) float32. At BERT's 1280 masked rows per step (64 x 20) and V = 30522 they
are 1280 * 30522 * 4 B = 156 MB, written by the GEMM, read by logsumexp, the label gather and argmax, kept for the
backward, then read again and a same-sized d_logits written and read twice (dh and dE GEMMs): of the order of a
gigabyte of traffic, and the largest single activation of the step, for an operator whose outputs are a few numbers
per row.

`mlm_cross_entropy` runs one of the implementations in `impls.py`: the fused kernels (`fused.py`), the chunked loss
(`chunked.py`) or the reference (`reference.py`), chosen by the registry for the call or named by `impl=`.
"""

import jax.numpy as jnp

from .. import registry
from .._pallas import resolve_interpret
from ..mesh import current_mesh, shard_counts
from . import reference
from .chunked import check_inputs, mlm_cross_entropy_chunked
from .fused import mlm_cross_entropy_fused
from .impls import Call

__all__ = ["Call", "mlm_cross_entropy", "mlm_cross_entropy_chunked", "mlm_cross_entropy_fused", "reference"]


def mlm_cross_entropy(h, embedding, output_bias, labels, *, vocab_size=None, impl: str | None = None, blocks=None,
                      interpret: bool | None = None):
    """Same contract as `reference.mlm_cross_entropy`: float32 nll (...) and int32 predictions (...) of h (..., D)
    against the (V, D) table. `impl` names an implementation (`impls.py`; default: the registry's choice for the
    call); `blocks` the fused kernels' tile sizes."""
    check_inputs(h, embedding, output_bias, labels)
    v, d = embedding.shape
    rows = h.size // max(d, 1)
    call = Call(rows // shard_counts(current_mesh())[0], v, d, jnp.dtype(h.dtype).name)
    choice = registry.choose("mlm_cross_entropy", call, impl=impl, blocks=blocks,
                             interpret=resolve_interpret(interpret))
    if choice.impl.kernel:
        return mlm_cross_entropy_fused(h, embedding, output_bias, labels, vocab_size=vocab_size, blocks=choice.config,
                                       interpret=interpret)
    return choice.impl.fn(h, embedding, output_bias, labels, vocab_size=vocab_size)
