"""Layout-annotated arrays and einsums: every tensor carries the dimension letters of its *stored* order.

The model writes its contractions in logical terms (which letters meet which) and lets a `LayoutConfig` decide the
order in which each activation is stored. An annotated einsum builds its subscripts from the operands' letters and
writes its result in the requested stored order, so `einsum("SBD", x, w)` with `x` stored `BSF` and `w` as `FD`
is `jnp.einsum("BSF,FD->SBD", ...)`: the order is a storage decision, never a change of meaning.

    x = annotate(x_array, "SBD")                      # how x is stored
    w = annotate(w_array, "CDNH")
    qkv = einsum("CBNSH", x, w)                       # BSD,CDNH -> CBNSH in whatever order x is stored
    q = take(qkv, "C", 0)                             # letters "BNSH"
    k = rename(take(qkv, "C", 1), S="T")              # the keys' positions are T
    y = relayout(q, "BSNH")                           # an explicit transpose (a no-op when already BSNH)

Letters are DESIGN.md's (B S T D N H F V L C, plus P and E in the heads); one letter per axis, no repeats.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


def check_letters(layout: str, ndim: int | None = None, *, what: str = "layout") -> str:
    """`layout` if it is a string of distinct upper-case letters (of length `ndim` when given), else ValueError."""
    if not isinstance(layout, str) or not layout.isalpha() or not layout.isupper() or len(set(layout)) != len(layout):
        raise ValueError(f"{what}={layout!r} must be distinct upper-case dimension letters")
    if ndim is not None and len(layout) != ndim:
        raise ValueError(f"{what}={layout!r} has {len(layout)} letters for an array of {ndim} dimensions")
    return layout


def is_permutation(layout: str, logical: str) -> bool:
    return isinstance(layout, str) and len(layout) == len(logical) and sorted(layout) == sorted(logical)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Annotated:
    """An array and the letters of its stored axis order (`layout` is static pytree metadata)."""

    array: jax.Array
    layout: str = dataclasses.field(metadata=dict(static=True))

    @property
    def shape(self) -> tuple[int, ...]:
        return self.array.shape

    @property
    def dtype(self):
        return self.array.dtype

    def size(self, letter: str) -> int:
        return self.array.shape[self.layout.index(letter)]

    def astype(self, dtype) -> "Annotated":
        return Annotated(self.array.astype(dtype), self.layout)

    def to(self, layout: str) -> jax.Array:
        """The array transposed to `layout` (a plain array: the way out of the annotated world)."""
        return relayout(self, layout).array


def annotate(array, layout: str) -> Annotated:
    """Attach the stored order `layout` to `array` (checked against its rank)."""
    return Annotated(array, check_letters(layout, jnp.ndim(array)))


def relayout(t: Annotated, layout: str) -> Annotated:
    """`t` stored in `layout` (a permutation of its letters): an explicit transpose, nothing when already there."""
    if not is_permutation(layout, t.layout):
        raise ValueError(f"layout={layout!r} is not a permutation of the tensor's letters {t.layout!r}")
    if layout == t.layout:
        return t
    return Annotated(jnp.transpose(t.array, [t.layout.index(c) for c in layout]), layout)


def einsum(out: str, *operands: Annotated, **kwargs) -> Annotated:
    """The contraction of `operands` written in stored order `out`: letters absent from `out` are summed over.

    `kwargs` go to `jnp.einsum` (e.g. `preferred_element_type`). Every letter of `out` must appear in an operand.
    """
    check_letters(out, what="out")
    present = set("".join(t.layout for t in operands))
    missing = set(out) - present
    if missing:
        raise ValueError(f"out={out!r} has letters {sorted(missing)} that no operand has "
                         f"(operands: {[t.layout for t in operands]})")
    spec = ",".join(t.layout for t in operands) + "->" + out
    return Annotated(jnp.einsum(spec, *(t.array for t in operands), **kwargs), out)


def take(t: Annotated, letter: str, index: int) -> Annotated:
    """The slice `index` of axis `letter` (e.g. q = take(qkv, "C", 0)); the letter leaves the layout."""
    axis = t.layout.index(letter)
    # A static slice (as `qkv[0]`), not jnp.take's gather.
    return Annotated(jax.lax.index_in_dim(t.array, index, axis, keepdims=False), t.layout.replace(letter, ""))


def rename(t: Annotated, **renames: str) -> Annotated:
    """The same array with letters renamed (`rename(k, S="T")`: the keys' positions are T, not S)."""
    layout = "".join(renames.get(c, c) for c in t.layout)
    return Annotated(t.array, check_letters(layout, t.array.ndim))


def expand(array, layout: str, target: str):
    """`array` (stored `layout`) transposed and given size-1 axes so that it broadcasts against `target`.

    E.g. a CNH bias against a CBNSH activation becomes C1N1H. Every letter of `layout` must be in `target`.
    """
    if not set(layout) <= set(target):
        raise ValueError(f"layout={layout!r} has letters that target={target!r} lacks")
    order = [c for c in target if c in layout]
    array = jnp.transpose(array, [layout.index(c) for c in order])
    return array.reshape([array.shape[order.index(c)] if c in layout else 1 for c in target])
