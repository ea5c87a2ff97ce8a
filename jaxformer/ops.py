"""The one table that says which implementation runs each fused memory-bound operator.

The model never imports a kernel directly: it asks `ops.select(config.kernels)` for the operators and calls them.
Every operator has an `"xla"` implementation (the pure jax.numpy reference in `pallas_kernels/<op>/reference.py`,
left for XLA to fuse) and, where one exists, a `"pallas"` one (fused Pallas kernels, forward and backward).

| operator (Ivanov et al.)                          | xla                       | pallas            |
|---------------------------------------------------|---------------------------|-------------------|
| embedding_layernorm (sum + LN + dropout)          | embedding_layernorm.ref   | not yet           |
| bias_dropout_residual_layernorm (BDRLN / BLNRD)   | bias_dropout_resid...ref  | not yet           |
| layer_norm (the MLM head's)                       | bias_dropout_resid...ref  | not yet           |
| bias_gelu (BAD / BDRB)                            | bias_gelu.ref             | not yet           |
| attention (SM / BS, or fused flash attention)     | attention.ref (unfused)   | not yet           |
"""

from __future__ import annotations

import types

from pallas_kernels.attention import reference as _attention
from pallas_kernels.bias_dropout_residual_layernorm import reference as _bdrln
from pallas_kernels.bias_gelu import reference as _bias_gelu
from pallas_kernels.embedding_layernorm import reference as _embedding_layernorm

TABLE = {
    "embedding_layernorm": {"xla": _embedding_layernorm.embedding_layernorm},
    "bias_dropout_residual_layernorm": {"xla": _bdrln.bias_dropout_residual_layernorm},
    "layer_norm": {"xla": _bdrln.layer_norm},
    "bias_gelu": {"xla": _bias_gelu.bias_gelu},
    "attention": {"xla": _attention.attention},
}


def select(kernels: str) -> types.SimpleNamespace:
    """The operators for `kernels` ("xla" or "pallas"), as attributes named like the rows of `TABLE`."""
    chosen = {}
    for op, impls in TABLE.items():
        if kernels not in impls:
            available = sorted(k for k, impls_ in TABLE.items() if kernels in impls_)
            raise ValueError(f"kernels={kernels!r} has no implementation of {op!r} yet "
                             f"(available for {kernels!r}: {available or 'none'}); use kernels='xla'")
        chosen[op] = impls[kernels]
    return types.SimpleNamespace(**chosen)
