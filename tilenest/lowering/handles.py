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
    from .facts import Facts

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


def panel_offset(width: int, extents: tuple[E.Expr, ...], coords: list[E.Expr],
                 facts: "Facts | None" = None) -> E.Expr:
    """The offset of ``coords`` (storage order) in a tile of constant
    ``extents`` whose last dim is cut into column panels of ``width``
    elements (``BufH.panel``): ``j (width R) + line w + c`` for column ``j
    width + c`` (``R`` the lines, ``line`` the row-major index of the other
    coordinates, ``w`` the width of panel ``j``: ``width``, or what is left
    for the last).

    The column is split by its linear form (``j``: the terms whose
    coefficients ``width`` divides, ``c``: the rest); that split is the
    column's quotient and remainder when ``facts`` show ``0 <= c < w`` --
    as they do for a micro-kernel's column block, which starts at a multiple
    of ``width`` and spans at most one panel -- and the offset is then affine.
    Otherwise it is computed by floor division and remainder."""
    *rest, last = extents
    lines = 1
    for x in rest:
        lines *= x.value
    full, tail = divmod(last.value, width)
    line = linear(tuple(rest), coords[:-1])
    col = coords[-1]
    terms, k = E._linear(col)
    j = E.Const(k // width)
    c = E.Const(k % width)
    for x, v in terms.items():
        if v % width == 0:
            j = E.add(j, E.mul(v // width, x))
        else:
            c = E.add(c, E.mul(v, x))
    if isinstance(j, E.Const):
        w = width if j.value < full else tail if j.value == full else 0
    else:
        w = width if facts is not None and facts.implied(j.le(full - 1)) else 0
    if w and (isinstance(c, E.Const) and 0 <= c.value < w or facts is not None and (
            facts.implied(c.ge(0)) and facts.implied(c.lt(w)))):
        return E.add(E.add(E.mul(j, width * lines), E.mul(line, w)), c)
    j, c = E.floordiv(col, width), E.mod(col, width)
    # the width of panel j: ``width``, and ``tail`` for the last narrow one
    w_j: E.Expr = E.Const(width)
    if tail:
        last_one = E.maximum(0, E.minimum(1, E.add(j, 1 - full)))  # 1 at j = full, else 0
        w_j = E.add(width, E.mul(last_one, tail - width))
    return E.add(E.add(E.mul(j, width * lines), E.mul(line, w_j)), c)


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
    lines of it lie ``pitch`` elements apart (default: its extent, dense).

    With ``panel = P`` (constant extents, no pitch) that last dim is cut into
    *column panels* of ``P`` elements, the last one narrower when ``P`` does
    not divide its extent: panel ``j`` holds its columns of every line, the
    lines row-major over the other dims, each line's ``w`` elements (``w``
    the panel's width) consecutive; the panels follow one another. A CPU
    ``mma`` micro-kernel whose column block is one panel then reads its ``b``
    rows from one contiguous stretch (:func:`panel_offset`)."""

    buf: L.Buffer
    dims: tuple[Dim, ...]
    extents: tuple[E.Expr, ...]
    pitch: E.Expr | None = None
    order: tuple[int, ...] | None = None
    #: zero padding: for each listed dim ``d``, every element with
    #: ``q[d] >= zero_from[d]`` holds exactly ``+0`` (the copy of a view read
    #: with ``bounds.zero`` past the tensor's edge)
    zero_from: dict[Dim, E.Expr] | None = None
    #: the width of the column panels of the last storage dim (class doc)
    panel: int | None = None

    def __post_init__(self) -> None:
        self.dtype = self.buf.dtype
        self.reads = frozenset({self.buf.name})
        assert self.order is None or sorted(self.order) == list(range(len(self.dims)))
        assert self.panel is None or (self.pitch is None and all(
            isinstance(x, E.Const) for x in self.extents))

    def storage_dims(self) -> tuple[Dim, ...]:
        """The dims in storage order (the last one's elements consecutive)."""
        return tuple(self.dims[i] for i in (self.order or range(len(self.dims))))

    def offset(self, q: Index, facts: "Facts | None" = None) -> E.Expr:
        """The element offset of ``q`` in ``buf``; ``facts`` (the known facts
        where the access is made) let a panel offset take its affine form."""
        order = self.order or range(len(self.dims))
        ext = [self.extents[i] for i in order]
        coords = [q[self.dims[i]] for i in order]
        if self.panel is not None:
            return panel_offset(self.panel, tuple(ext), coords, facts)
        if self.pitch is not None:
            ext[-1] = self.pitch
        return linear(tuple(ext), coords)

    def at(self, lw: "Lowerer", q: Index) -> L.Expr:
        return L.Load(self.buf, L.IExpr(self.offset(q, lw.facts)))

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
