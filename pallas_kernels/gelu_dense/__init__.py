"""The feed-forward's activation and output product, `gelu(x + bias) @ kernel` (Ivanov et al.'s BAD and the GEMM
after it), as one operator so that the backward can put GELU's derivative into the epilogue of the GEMM that forms
the input gradient (`kernel_mgpu.py`).

`gelu_dense` runs one of the implementations in `impls.py`, chosen by the registry for the per-shard call or named
by `impl=`. Every one computes the same forward: bias+GELU, then the product in x's dtype.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from .. import _pallas as pk
from .. import registry
from ..bias_gelu import bias_gelu
from ..bias_gelu import kernel_mgpu as bias_gelu_mgpu
from ..mesh import batch_shard_map, current_mesh, shard_counts
from . import kernel_mgpu, reference  # noqa: F401  (the implementations' modules, for callers)
from .impls import Call

__all__ = ["Call", "gelu_dense", "reference"]


def gelu_dense(x, bias, kernel, *, layout: str = "BSF", out: str = "BSD", interpret: bool | None = None,
               blocks=None, impl: str | None = None):
    """`gelu(x + bias) @ kernel` for x (..., F) stored in `layout` (its letters; F the contracted one), bias (F,) and
    kernel (F, D), written in the stored order `out` (x's letters with D for F), in x's dtype. `impl` names an
    implementation (`impls.py`; default: the registry's choice for the per-shard call); `blocks` its config."""
    if len(layout) != x.ndim or "F" not in layout or "D" in layout:
        raise ValueError(f"layout={layout!r} must name the {x.ndim} axes of x.shape={x.shape}, F among them, not D")
    if sorted(out) != sorted(layout.replace("F", "D")):
        raise ValueError(f"out={out!r} must be a permutation of {layout.replace('F', 'D')!r} (layout with D for F)")
    f = x.shape[layout.index("F")]
    if bias.shape != (f,) or kernel.ndim != 2 or kernel.shape[0] != f:
        raise ValueError(f"bias.shape={bias.shape} and kernel.shape={kernel.shape} must be ({f},) and ({f}, D) for "
                         f"x.shape={x.shape} stored {layout}")
    interpret = pk.resolve_interpret(interpret)
    rows, depth = x.size // f, kernel.shape[1]
    shards, heads = shard_counts(current_mesh(), heads=True)
    call = Call(rows // shards, f // heads, depth, jnp.dtype(x.dtype).name, layout, out)
    choice = registry.choose("gelu_dense", call, registry.Device.current(), impl=impl, blocks=blocks,
                             interpret=interpret)
    if choice.impl.name == "xla":
        return reference.gelu_dense(x, bias, kernel, layout=layout, out=out)
    kernel = kernel.astype(x.dtype)
    if choice.impl.name == "split":
        return jnp.einsum(reference.spec(layout, out), bias_gelu(x, bias, interpret=interpret), kernel)
    return _fused(x, bias, kernel, reference.spec(layout, out), interpret, choice.config)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _fused(x, bias, kernel, spec, interpret, blocks):
    return _fused_fwd(x, bias, kernel, spec, interpret, blocks)[0]


def _gelu_and_grad(x, bias, interpret):
    """gelu(x + bias) and GELU'(x + bias), both in x's dtype, from bias+GELU's Mosaic GPU forward per shard."""
    f = x.shape[-1]
    blocks = bias_gelu_mgpu.default_blocks(x.size // f, f, 0.0, kind=registry.Device.current().kind)

    def run(_row_offset, _col_offset, x, bias):
        return bias_gelu_mgpu.forward(x, bias, pk.seed_words(None), rate=0.0, interpret=interpret, blocks=blocks,
                                      with_grad=True)

    h, g = batch_shard_map(run, 1, head_dims=(1, 0), out_head_dim=1)(x.reshape(-1, f), bias)
    return h.reshape(x.shape), g


def _fused_fwd(x, bias, kernel, spec, interpret, blocks):
    h, g = _gelu_and_grad(x, bias, interpret)
    return jnp.einsum(spec, h, kernel), (g, kernel, h, bias)


def _fused_bwd(spec, interpret, blocks, res, dy):
    g, kernel, h, bias = res
    f, d = kernel.shape
    h2, dy2 = h.reshape(-1, f), dy.reshape(-1, d)  # x's order, F last (`impls.same_order`)

    def run(_row_offset, _col_offset, dy, g, kernel):
        return kernel_mgpu.backward_input(dy, kernel, g, blocks=blocks, interpret=interpret)

    # Rows over the batch axes; F (g's columns, the kernel's rows) over `tensor`, where dy is whole.
    dx, db = batch_shard_map(run, 2, head_dims=(None, 1, 0), out_head_dim=1)(dy2, g, kernel)
    dkernel = jnp.einsum("mf,md->fd", h2, dy2)  # XLA's GEMM, as the product's autodiff
    return dx.reshape(h.shape), jnp.sum(db, axis=0).astype(bias.dtype), dkernel.astype(kernel.dtype)


_fused.defvjp(_fused_fwd, _fused_bwd)
