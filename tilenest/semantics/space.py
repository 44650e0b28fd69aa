"""Dimensions, spaces and index sets.

* A :class:`Dim` is a logical dimension *identity*. Two Dims are equal exactly
  when they are the same identity; the optional label is printed in diagnostics
  and never consulted by any rule. Extent does not belong to a Dim.
* A :class:`DimFactor` pairs a Dim with an extent (an index expression): the Dim
  ranges over ``0 <= x < extent`` in this factor.
* A :class:`Space` is an ordered product of DimFactors. Nesting of spaces (an
  execution nest ``E0 |> E1 |> ...``) is a sequence of Spaces kept apart, see
  :mod:`tilenest.semantics.nest`.
* An :class:`IndexSet` is a Space restricted by a predicate over its coordinates
  and the kernel parameters: ``{x in Space | pred(x, params)}``. The rectangular
  case has predicate ``true``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from . import expr as E
from .expr import Expr, Pred

_fresh = itertools.count()


@dataclass(frozen=True)
class DimOrigin:
    """Where and by what a Dim was made -- for diagnostics only, never part of
    its identity. ``what`` reads as a noun phrase ("the fresh dim made by
    tn.zeros"), ``site`` is the source location (a :class:`~tilenest.errors.Site`)
    and ``anonymous`` says the user gave no label (the label was generated)."""

    what: str
    site: Any = None
    anonymous: bool = False

    def __str__(self) -> str:
        return f"{self.what} at {self.site}" if self.site is not None else self.what


@dataclass(frozen=True)
class Dim:
    """A dimension identity. ``key`` is the identity; ``label`` and ``origin``
    are diagnostic only (excluded from equality and hashing)."""

    key: tuple
    label: str | None = field(default=None, compare=False, hash=False)
    origin: DimOrigin | None = field(default=None, compare=False, hash=False, repr=False)

    @staticmethod
    def fresh(label: str | None = None, origin: DimOrigin | None = None) -> "Dim":
        """A new identity distinct from every existing Dim."""
        return Dim(("dsl", next(_fresh)), label, origin)

    def __repr__(self) -> str:
        return f"Dim({self.label or '_'}@{self.key[-1]})"

    def describe(self) -> str:
        return self.label or f"dim{self.key[-1]}"


def dim_names(dims: Iterable[Dim]) -> tuple[dict[Dim, str], tuple[str, ...]]:
    """How the dims of one diagnostic print, and the notes that make it unambiguous.

    Each dim prints as its label (:meth:`Dim.describe`), except that distinct
    identities which would print alike get the suffixes ``#1, #2, ...`` (in the
    order given) and a note each saying where it was made. A dim whose label was
    generated (a fresh dim the user never named) also gets a note naming what
    made it, so "d0" can be traced to its ``tn.zeros`` call."""
    order: list[Dim] = []
    for d in dims:
        if d not in order:
            order.append(d)
    groups: dict[str, list[Dim]] = {}
    for d in order:
        groups.setdefault(d.describe(), []).append(d)
    names: dict[Dim, str] = {}
    notes: list[str] = []
    for label, ds in groups.items():
        if len(ds) == 1:
            d = ds[0]
            names[d] = label
            if d.origin is not None and d.origin.anonymous:
                notes.append(f"'{label}' is {d.origin}")
            continue
        for i, d in enumerate(ds, 1):
            names[d] = f"{label}#{i}"
        known = [d for d in ds if d.origin is not None]
        listed = ", ".join(repr(names[d]) for d in ds[:-1]) + f" and {names[ds[-1]]!r}"
        head = (f"{listed} are distinct dims, "
                f"{'both' if len(ds) == 2 else 'all'} labelled '{label}'")
        notes.append(head + ("" if known else " (where they were made is not recorded)"))
        for d in known:
            notes.append(f"'{names[d]}' is {d.origin}")
    return names, tuple(notes)


@dataclass(frozen=True)
class DimFactor:
    """One factor of a Space: ``dim`` ranging over ``[0, extent)``."""

    dim: Dim
    extent: Expr

    def __post_init__(self) -> None:
        object.__setattr__(self, "extent", E.lift(self.extent))


@dataclass(frozen=True)
class Space:
    """An ordered product of DimFactors; rank 0 is the one-point space."""

    factors: tuple[DimFactor, ...] = ()

    def __post_init__(self) -> None:
        dims = [f.dim for f in self.factors]
        if len(set(dims)) != len(dims):
            raise ValueError(f"space repeats a dim identity: {dims}")

    @staticmethod
    def of(*pairs: tuple[Dim, E.IntLike]) -> "Space":
        return Space(tuple(DimFactor(d, E.lift(x)) for d, x in pairs))

    @property
    def rank(self) -> int:
        return len(self.factors)

    @property
    def dims(self) -> tuple[Dim, ...]:
        return tuple(f.dim for f in self.factors)

    @property
    def extents(self) -> tuple[Expr, ...]:
        return tuple(f.extent for f in self.factors)

    def index(self, d: Dim) -> int:
        for i, f in enumerate(self.factors):
            if f.dim == d:
                return i
        raise KeyError(d)

    def extent_of(self, d: Dim) -> Expr:
        return self.factors[self.index(d)].extent

    def has(self, d: Dim) -> bool:
        return any(f.dim == d for f in self.factors)

    def without(self, dims: Iterable[Dim]) -> "Space":
        drop = set(dims)
        return Space(tuple(f for f in self.factors if f.dim not in drop))

    def concat(self, other: "Space") -> "Space":
        return Space(self.factors + other.factors)

    def replace_dims(self, dims: Sequence[Dim]) -> "Space":
        return Space(tuple(DimFactor(d, f.extent) for d, f in zip(dims, self.factors, strict=True)))

    def size(self) -> Expr:
        out: Expr = E.Const(1)
        for f in self.factors:
            out = out * f.extent
        return out

    def __iter__(self):
        return iter(self.factors)


@dataclass(frozen=True)
class IndexSet:
    """``{(vars) in space | pred}``: a Space with named coordinates and a predicate.

    ``vars[i]`` names the coordinate of ``space.factors[i]``; ``pred`` may mention
    those variables, kernel parameters and enclosing coordinates."""

    space: Space
    vars: tuple[str, ...]
    pred: Pred = E.TRUE

    def __post_init__(self) -> None:
        if len(self.vars) != self.space.rank:
            raise ValueError("IndexSet needs one variable per factor")

    @property
    def rank(self) -> int:
        return self.space.rank

    @property
    def is_rectangular(self) -> bool:
        return self.pred == E.TRUE

    def box(self) -> Pred:
        """The rectangular constraints ``0 <= v < extent`` of every coordinate."""
        return E.pand(*(E.pand(E.Var(v).ge(0), E.Var(v).lt(f.extent))
                        for v, f in zip(self.vars, self.space.factors, strict=True)))

    def constraint(self) -> Pred:
        """Full membership predicate: box and ``pred``."""
        return E.pand(self.box(), self.pred)

    def coords(self) -> tuple[Expr, ...]:
        return tuple(E.Var(v) for v in self.vars)

    def restrict(self, p: Pred) -> "IndexSet":
        return IndexSet(self.space, self.vars, E.pand(self.pred, p))

    def rename(self, new_vars: Sequence[str]) -> "IndexSet":
        m = {a: b for a, b in zip(self.vars, new_vars, strict=True)}
        return IndexSet(self.space, tuple(new_vars), E.rename(self.pred, m))
