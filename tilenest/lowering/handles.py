"""How a TileIR value is available to the code being generated.

A *handle* gives, for a coordinate ``q`` of the value's space (one index
expression per dim, keyed by dim identity), a loop-IR expression for the
element ``v[q]`` (:meth:`Handle.at`). The kinds:

* :class:`VarH`  -- a rank-0 value held in a scalar local;
* :class:`BufH`  -- a tile materialized in a local buffer, dense row-major over
  its dims in type order;
* :class:`LazyH` -- a pure value computed at its use (an elementwise chain, a
  view of another handle, a guarded tensor read): ``at`` builds the
  expression. Every lazy handle also reports the guard conjuncts of the reads
  inside it (:meth:`Handle.guards`), so that a loop nest consuming it can be
  range-restricted to where they hold;
* :class:`TensorH`, :class:`MemH`, :class:`StateH` -- kernel tensors, Memory
  objects and their state tokens (not tiles).

A lazy handle captures the bindings of index variables at its definition
(region coordinates are substituted when it is made), so it may be used
anywhere its value is in scope. It may read buffers; the lowering never
writes a buffer that a still-live lazy handle reads (``reads`` lists them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from ..semantics import expr as E
from ..semantics.dtypes import DType
from ..semantics.space import Dim
from . import loopir as L

if TYPE_CHECKING:
    from .core import Lowerer

Index = dict[Dim, E.Expr]


class Handle:
    """Base of tile handles: ``dtype``, ``dims`` and ``extents`` (index
    expressions over kernel symbols and enclosing coordinates)."""

    dtype: DType
    dims: tuple[Dim, ...]
    extents: tuple[E.Expr, ...]
    reads: frozenset[str] = frozenset()

    @property
    def rank(self) -> int:
        return len(self.dims)

    def at(self, lw: "Lowerer", q: Index) -> L.Expr:
        raise NotImplementedError

    def guards(self, q: Index) -> list[E.Pred]:
        return []

    def storage(self) -> Any:
        """The buffer or local holding this value, if materialized."""
        return None


def linear(extents: tuple[E.Expr, ...], coords: list[E.Expr]) -> E.Expr:
    """Row-major offset of ``coords`` in a dense box of ``extents``."""
    off: E.Expr = E.Const(0)
    for c, n in zip(coords, extents, strict=True):
        off = off * n + c
    return off


@dataclass
class VarH(Handle):
    var: L.LVar
    dims: tuple[Dim, ...] = ()
    extents: tuple[E.Expr, ...] = ()

    def __post_init__(self) -> None:
        self.dtype = self.var.dtype
        self.reads = frozenset({self.var.name})

    def at(self, lw: "Lowerer", q: Index) -> L.Expr:
        return L.Ref(self.var)

    def storage(self) -> Any:
        return self.var


@dataclass
class BufH(Handle):
    """A tile in ``buf``, row-major over ``dims`` -- or, with ``order`` (a
    permutation of the dim positions), row-major over ``dims[order[0]],
    dims[order[1]], ...`` (the storage order; ``dims`` and ``extents`` keep
    the tile type's order, which every consumer zips with its own). The
    last dim of the storage order has consecutive elements; consecutive
    lines of it lie ``pitch`` elements apart (default: its extent, dense)."""

    buf: L.Buffer
    dims: tuple[Dim, ...]
    extents: tuple[E.Expr, ...]
    pitch: E.Expr | None = None
    order: tuple[int, ...] | None = None
    #: zero padding: for each listed dim ``d``, every element with
    #: ``q[d] >= zero_from[d]`` holds exactly ``+0`` (the copy of a view read
    #: with ``bounds.zero`` past the tensor's edge)
    zero_from: dict[Dim, E.Expr] | None = None

    def __post_init__(self) -> None:
        self.dtype = self.buf.dtype
        self.reads = frozenset({self.buf.name})
        assert self.order is None or sorted(self.order) == list(range(len(self.dims)))

    def offset(self, q: Index) -> E.Expr:
        order = self.order or range(len(self.dims))
        ext = [self.extents[i] for i in order]
        if self.pitch is not None:
            ext[-1] = self.pitch
        return linear(tuple(ext), [q[self.dims[i]] for i in order])

    def at(self, lw: "Lowerer", q: Index) -> L.Expr:
        return L.Load(self.buf, L.IExpr(self.offset(q)))

    def storage(self) -> Any:
        return self.buf


@dataclass
class LazyH(Handle):
    """A value computed where it is used: ``fn(lw, q)`` gives the expression,
    ``gfn(q)`` the guard conjuncts of the reads inside it."""

    dtype: DType
    dims: tuple[Dim, ...]
    extents: tuple[E.Expr, ...]
    fn: Callable[["Lowerer", Index], L.Expr]
    gfn: Callable[[Index], list[E.Pred]] | None = None
    reads: frozenset[str] = field(default_factory=frozenset)
    cheap: bool = False
    #: ``zero_where(q)``: conjuncts outside of which element ``q`` is exactly
    #: ``+0`` (a read with ``bounds.zero``); None when nothing is known
    zero_where: Callable[[Index], list[E.Pred]] | None = None
    #: a read of a box of a tensor: element ``q`` is ``tensor[coords(q)]``
    #: inside the tensor and ``+0`` outside it (no other condition), so a
    #: bulk tensor copy may fetch it (``loopir.BulkCopy``); None otherwise
    box: "TensorBox | None" = None

    def at(self, lw: "Lowerer", q: Index) -> L.Expr:
        return self.fn(lw, q)

    def guards(self, q: Index) -> list[E.Pred]:
        return self.gfn(q) if self.gfn is not None else []


def const_handle(value: L.Expr, dims: tuple[Dim, ...] = (), extents: tuple = ()) -> LazyH:
    """A handle whose every element is the expression ``value``."""
    return LazyH(value.dtype, dims, extents, lambda lw, q: value, cheap=True)


@dataclass(frozen=True)
class TensorBox:
    """A tile read from a dense tensor: element ``q`` at ``coords(q)``."""

    tensor: "TensorH"
    coords: Callable[[Index], list[E.Expr]]


@dataclass
class TensorH:
    """A kernel tensor: its global buffer and shape (index expressions);
    row-major and dense, or with ``strides`` (elements per step of each
    dimension: a strided view)."""

    buf: L.Buffer
    shape: tuple[E.Expr, ...]
    dims: tuple[Dim, ...]
    strides: tuple[E.Expr, ...] | None = None

    def offset(self, coords: list[E.Expr]) -> E.Expr:
        if self.strides is None:
            return linear(self.shape, coords)
        off: E.Expr = E.Const(0)
        for c, s in zip(coords, self.strides, strict=True):
            off = E.add(off, E.mul(c, s))
        return off

    def in_bounds(self, coords: list[E.Expr]) -> list[E.Pred]:
        out: list[E.Pred] = []
        for c, n in zip(coords, self.shape, strict=True):
            out.append(c.ge(0))
            out.append(c.lt(n))
        return out


@dataclass
class MemH:
    """A Memory object: its storage, logical dims/extents and layout offset map."""

    buf: L.Buffer
    dims: tuple[Dim, ...]
    extents: tuple[E.Expr, ...]
    vars: tuple[str, ...]
    offset: E.Expr

    def offset_at(self, q: Index) -> E.Expr:
        m = {E.Var(v): q[d] for v, d in zip(self.vars, self.dims, strict=True)}
        return E.subst(self.offset, m)


@dataclass
class StateH:
    """A MemoryState token of ``mem``."""

    mem: MemH


def project(q: Index, dims: tuple[Dim, ...]) -> Index:
    """The coordinate restricted to ``dims`` (broadcast: missing dims are dropped)."""
    return {d: q[d] for d in dims}


def union_reads(*hs: Any) -> frozenset[str]:
    out: frozenset[str] = frozenset()
    for h in hs:
        out = out | getattr(h, "reads", frozenset())
    return out
