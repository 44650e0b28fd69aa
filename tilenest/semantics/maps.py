"""Typed maps between index spaces.

A :class:`Map` is a function ``(x_0, ..., x_{n-1}) -> (e_0, ..., e_{m-1})`` whose
outputs are index expressions over the named input variables (and over kernel
parameters and enclosing coordinates, which are fixed for one use). Maps are
the single representation of every coordinate relation in TileIR:

* view/access maps (tile-local coordinates -> tensor coordinates),
* parallel maps (raw child index -> child coordinate, ``ParallelMap``),
* memory layouts (tile-local coordinates -> one linear storage offset),
* reindex maps (output coordinates -> source coordinates),
* execution transforms ``tau`` (new nest coordinates -> old ones).

Composition ``g o f`` substitutes ``f``'s outputs for ``g``'s inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from . import expr as E
from .expr import Expr, Pred
from .space import IndexSet


@dataclass(frozen=True)
class Map:
    """``inputs -> outputs`` with outputs written over the input variables."""

    inputs: tuple[str, ...]
    outputs: tuple[Expr, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "outputs", tuple(E.lift(o) for o in self.outputs))

    @staticmethod
    def identity(vars: Sequence[str]) -> "Map":
        return Map(tuple(vars), tuple(E.Var(v) for v in vars))

    @property
    def arity(self) -> int:
        return len(self.inputs)

    @property
    def coarity(self) -> int:
        return len(self.outputs)

    def apply(self, args: Sequence[E.IntLike]) -> tuple[Expr, ...]:
        """The outputs with the inputs replaced by ``args`` (exact substitution)."""
        m: dict[E.Expr, E.IntLike] = {E.Var(v): E.lift(a)
                                      for v, a in zip(self.inputs, args, strict=True)}
        return tuple(E.subst(o, m) for o in self.outputs)

    def compose(self, inner: "Map") -> "Map":
        """``self o inner``: first ``inner``, then ``self``."""
        return Map(inner.inputs, self.apply(inner.outputs))

    def project(self, keep: Sequence[int]) -> "Map":
        """Keep only the output components at positions ``keep``."""
        return Map(self.inputs, tuple(self.outputs[i] for i in keep))

    def product(self, other: "Map") -> "Map":
        """``(self x other)(x, y) = (self(x), other(y))`` (inputs must be disjoint)."""
        if set(self.inputs) & set(other.inputs):
            raise ValueError("product of maps with shared input variables")
        return Map(self.inputs + other.inputs, self.outputs + other.outputs)

    def rename_inputs(self, new: Sequence[str]) -> "Map":
        return Map(tuple(new), self.apply([E.Var(v) for v in new]))

    def evaluate(self, env: dict) -> tuple:
        return tuple(E.evaluate(o, env) for o in self.outputs)

    def __str__(self) -> str:
        ins = ", ".join("$" + v for v in self.inputs)
        outs = ", ".join(E.to_str(o) for o in self.outputs)
        return f"({ins}) -> ({outs})"


@dataclass(frozen=True)
class RestrictedMap:
    """A Map considered only on an IndexSet of its inputs (e.g. a split with a tail)."""

    map: Map
    domain: IndexSet

    def __post_init__(self) -> None:
        if tuple(self.domain.vars) != tuple(self.map.inputs):
            raise ValueError("restriction domain must name the map's inputs")

    @property
    def guard(self) -> Pred:
        return self.domain.constraint()


def restrict(m: Map, domain: IndexSet) -> RestrictedMap:
    """``m`` restricted to ``domain`` (its variables are renamed to ``m``'s inputs)."""
    return RestrictedMap(m, domain.rename(m.inputs))


@dataclass(frozen=True)
class MemLayout:
    """A memory object's local address map ``L``: tile coordinates -> storage offset.

    ``offset`` is one linear element offset over the tile's local variables
    ``vars`` (strides, padding, transposition and XOR swizzles all land here);
    ``size`` is the number of storage elements (padding included). Whole-tile
    storage requires ``offset`` to be injective on the tile's space and to stay
    within ``[0, size)``."""

    vars: tuple[str, ...]
    offset: Expr
    size: Expr

    def __post_init__(self) -> None:
        object.__setattr__(self, "offset", E.lift(self.offset))
        object.__setattr__(self, "size", E.lift(self.size))

    def __str__(self) -> str:
        ins = ", ".join("$" + v for v in self.vars)
        return f"({ins}) -> {E.to_str(self.offset)} size {E.to_str(self.size)}"


def strided_layout(vars: Sequence[str], extents: Sequence[E.IntLike],
                   strides: Sequence[E.IntLike] | None = None,
                   order: Sequence[int] | None = None) -> MemLayout:
    """A strided layout. Without ``strides``, dense with the dims laid out in
    ``order`` (slowest first; default row-major). ``size`` is the tight bound
    ``1 + sum((extent-1)*stride)`` for non-negative strides."""
    extents = [E.lift(x) for x in extents]
    if strides is None:
        order = list(range(len(extents))) if order is None else list(order)
        strides_l: list[Expr] = [E.Const(0)] * len(extents)
        acc: Expr = E.Const(1)
        for i in reversed(order):
            strides_l[i] = acc
            acc = acc * extents[i]
        size = acc
    else:
        strides_l = [E.lift(s) for s in strides]
        size = E.Const(1)
        for x, s in zip(extents, strides_l, strict=True):
            size = size + (x - 1) * s
    off: Expr = E.Const(0)
    for v, s in zip(vars, strides_l, strict=True):
        off = off + E.Var(v) * s
    return MemLayout(tuple(vars), off, size)
