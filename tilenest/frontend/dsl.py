"""Surface objects of the Python DSL and the ops they build.

These are the loose, convenient objects a kernel body manipulates (STYLE #5):
:class:`Tile` (a staged value), :class:`Index` (a symbolic integer: extents,
coordinates), :class:`Shape`/``coord``, tensor views, Memory objects and scope
handles. Each converts once into canonical IR through the capture context.
"""

from __future__ import annotations

import math
import numbers
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from ..errors import CaptureError, TypeCheckError
from ..semantics import dtypes as D
from ..semantics import expr as E
from ..semantics import numerics as N
from ..semantics.dtypes import DType
from ..semantics.maps import MemLayout, strided_layout
from ..semantics.policies import (ASSUME, CHECKED, EXEC_SCOPES, ZERO, Bounds, BoundsPolicy,
                                  ExecPolicy, MmaPolicy, PipelinePolicy, ReductionPolicy)
from ..semantics.space import Dim, DimFactor, DimOrigin, Space
from ..semantics.types import MemoryType, StateType, TensorType, TileType
from .builder import BValue
from .context import ctx

# ---------------------------------------------------------------------------
# symbolic integers


class Index:
    """A staged integer index expression (extents, coordinates, offsets)."""

    __slots__ = ("expr",)

    def __init__(self, expr: E.IntLike):
        self.expr = E.lift(expr)

    def _bin(self, o: Any, fn: Callable, rfn: bool = False) -> Any:
        if isinstance(o, Tile):
            return NotImplemented
        oe = as_expr(o)
        return Index(fn(oe, self.expr) if rfn else fn(self.expr, oe))

    def __add__(self, o): return self._bin(o, E.add)
    def __radd__(self, o): return self._bin(o, E.add, True)
    def __sub__(self, o): return self._bin(o, lambda a, b: E.add(a, E.mul(-1, b)))
    def __rsub__(self, o): return self._bin(o, lambda a, b: E.add(a, E.mul(-1, b)), True)
    def __mul__(self, o): return self._bin(o, E.mul)
    def __rmul__(self, o): return self._bin(o, E.mul, True)
    def __floordiv__(self, o): return self._bin(o, E.floordiv)
    def __rfloordiv__(self, o): return self._bin(o, E.floordiv, True)
    def __mod__(self, o): return self._bin(o, E.mod)
    def __rmod__(self, o): return self._bin(o, E.mod, True)
    def __xor__(self, o): return self._bin(o, lambda a, b: E.bitop("^", a, b))
    def __and__(self, o): return self._bin(o, lambda a, b: E.bitop("&", a, b))
    def __or__(self, o): return self._bin(o, lambda a, b: E.bitop("|", a, b))
    def __lshift__(self, o): return self._bin(o, lambda a, b: E.bitop("<<", a, b))
    def __rshift__(self, o): return self._bin(o, lambda a, b: E.bitop(">>", a, b))
    def __neg__(self): return Index(E.mul(-1, self.expr))
    def __pos__(self): return self

    def _cmp(self, op: str, o: Any) -> Any:
        if isinstance(o, Tile):
            return NotImplemented
        return IndexCond(E.cmp(op, self.expr, as_expr(o)))

    def __lt__(self, o): return self._cmp("<", o)
    def __le__(self, o): return self._cmp("<=", o)
    def __gt__(self, o): return self._cmp(">", o)
    def __ge__(self, o): return self._cmp(">=", o)
    def __eq__(self, o): return self._cmp("==", o)  # type: ignore[override]
    def __ne__(self, o): return self._cmp("!=", o)  # type: ignore[override]
    __hash__ = None  # type: ignore[assignment]

    def __index__(self) -> int:
        if isinstance(self.expr, E.Const):
            return self.expr.value
        raise CaptureError(
            f"the symbolic extent/index '{self.expr}' has no value at capture time",
            hint="Python loops and sizes need constants; use a region (tn.serial) to "
                 "iterate over a symbolic extent")

    __int__ = __index__

    def __bool__(self) -> bool:
        raise CaptureError(f"Python control flow on the staged index '{self.expr}'",
                           hint="use `if tn.if_(cond):` for a dynamic condition")

    def value(self, dtype: DType = D.INDEX) -> "Tile":
        """This index as a staged scalar of integer dtype ``dtype``."""
        _refuse_coordinates(self.expr, "combine staged values with the result outside the "
                            "function, e.g. `v * 4 + tn.index_tile(shape, lambda i, j: j)`")
        return _index_tile(self.expr, (), dtype)

    def __repr__(self) -> str:
        return f"Index({self.expr})"


#: the element coordinates of the index functions being traced (per thread):
#: ``tn.index_tile`` and ``tn.reindex`` call their function with them
_TRACING = threading.local()


def _coordinates_in(e: "E.Expr | E.Pred") -> set[str]:
    """The element coordinates of an enclosing index function that ``e`` reads."""
    open_ = getattr(_TRACING, "coords", ())
    if not open_:
        return set()
    names = {v for vs in open_ for v in vs}
    return {lf.name for lf in E.leaves(e) if isinstance(lf, E.Var) and lf.name in names}


def _refuse_coordinates(e: "E.Expr | E.Pred", hint: str) -> None:
    """A CaptureError when ``e`` reads an element coordinate of the index
    function being traced: it is about to become a staged value (an operand
    of an elementwise op), outside the element it names."""
    coords = _coordinates_in(e)
    if coords:
        which = ", ".join(f"#{c}" for c in sorted(coords))
        raise CaptureError(
            f"coordinate {which} of a tn.index_tile or tn.reindex function was combined with "
            "a staged value: those functions compute indices from their coordinates, ints, "
            "symbols and region indices only", hint=hint)


def _call_with_coordinates(fn: Callable[..., Any], vars_: tuple[str, ...]) -> Any:
    """``fn`` of the element coordinates ``vars_`` (as indices), traced so that
    a coordinate turned into a staged value is refused (:meth:`Index.value`)."""
    stack = getattr(_TRACING, "coords", ())
    _TRACING.coords = stack + (frozenset(vars_),)
    try:
        return fn(*(Index(E.Var(v)) for v in vars_))
    finally:
        _TRACING.coords = stack


class IndexCond:
    """A staged condition over index expressions (an IndexSet predicate)."""

    __slots__ = ("pred",)

    def __init__(self, pred: E.Pred):
        self.pred = pred

    def __and__(self, o): return _cond_bin(self, o, E.pand, "and")
    def __rand__(self, o): return _cond_bin(o, self, E.pand, "and")
    def __or__(self, o): return _cond_bin(self, o, E.por, "or")
    def __ror__(self, o): return _cond_bin(o, self, E.por, "or")
    def __invert__(self): return IndexCond(E.pnot(self.pred))

    def __bool__(self) -> bool:
        if isinstance(self.pred, E.BoolConst):
            return self.pred.value
        raise CaptureError(f"Python control flow on the staged condition '{self.pred}'",
                           hint="use `if tn.if_(cond):` for a dynamic condition")

    def value(self) -> "Tile":
        """This condition as a staged bool scalar."""
        _refuse_coordinates(self.pred, "build the condition as a tile outside the function, "
                            "e.g. `tn.index_tile(shape, lambda i, j: j) < v`")
        return _pred_tile(self.pred)

    def __repr__(self) -> str:
        return f"IndexCond({self.pred})"


def _cond_bin(a: Any, b: Any, fn: Callable, op: str) -> Any:
    if isinstance(a, IndexCond) and isinstance(b, IndexCond):
        return IndexCond(fn(a.pred, b.pred))
    if isinstance(a, bool):
        a = IndexCond(E.BoolConst(a))
    if isinstance(b, bool):
        b = IndexCond(E.BoolConst(b))
    if isinstance(a, IndexCond) and isinstance(b, IndexCond):
        return IndexCond(fn(a.pred, b.pred))
    return _binary(op, a, b)


def as_expr(x: Any) -> E.Expr:
    """An index expression from an int, an Index or a staged integer scalar."""
    if isinstance(x, Index):
        return x.expr
    if isinstance(x, (bool, np.bool_)):
        raise CaptureError("a bool is not an index")
    if isinstance(x, (int, np.integer)):
        return E.Const(int(x))
    if isinstance(x, E.Expr):
        return x
    if isinstance(x, Tile):
        if not x.type.is_scalar or not x.dtype.is_int:
            raise TypeCheckError(f"only integer scalars can be used as indices, got {x.type_str()}")
        return E.Val(x.v.resolve().tmp_name)
    if isinstance(x, ScopeHandle):
        one = len(x.vars) == 1
        raise CaptureError(
            f"expected an integer index, got the scope handle '{x.name}'",
            hint=(f"use {x.name}.index() for its coordinate" if one else
                  f"use {x.name}.index(axis) for one coordinate of its rank-{len(x.vars)} "
                  "domain") + "; a handle is not a value")
    raise CaptureError(f"expected an integer index, got {type(x).__name__}: {x!r}",
                       hint="indices are Python ints, symbolic extents, handle coordinates "
                            "(h.index()) or integer scalars")


def sym(name: str) -> Index:
    """A named symbolic integer parameter of the kernel."""
    c = ctx()
    c.add_sym(name)
    return Index(E.Sym(name))


def cdiv(a: Any, b: Any) -> Any:
    """Ceiling division of index values (``ceil(a / b)``, positive ``b``)."""
    if isinstance(as_expr(b), E.Const) and as_expr(b).value <= 0:
        raise CaptureError(f"cdiv by {as_expr(b).value}: the divisor must be positive",
                           hint="cdiv counts blocks of a positive size")
    if isinstance(a, int) and isinstance(b, int):
        return -(-a // b)
    return Index(E.cdiv(as_expr(a), as_expr(b)))


# ---------------------------------------------------------------------------
# shapes, dims, coordinates


def _here() -> Any:
    """The source site of the construct being captured (None outside capture)."""
    from .context import active

    return ctx().site() if active() else None


def made_here(what: str, anonymous: bool = False) -> DimOrigin:
    """A DimOrigin for a dim made by ``what`` at the current capture site."""
    return DimOrigin(what, _here(), anonymous)


def dim(label: str | None = None) -> Dim:
    """A fresh dimension identity (the label is for diagnostics only)."""
    return Dim.fresh(label, made_here("the dim made by tn.dim", label is None))


def dims(*labels: str) -> tuple[Dim, ...]:
    return tuple(Dim.fresh(lbl, made_here("a dim made by tn.dims")) for lbl in labels)


@dataclass(frozen=True)
class Axis:
    """A shape entry with an explicit dim identity: ``axis(dim, extent)``."""

    dim: Dim
    extent: E.Expr


def axis(d: Dim | str, extent: Any) -> Axis:
    return Axis(d if isinstance(d, Dim) else Dim.fresh(d, made_here("the dim made by tn.axis")),
                _extent(extent))


def _extent(x: Any) -> E.Expr:
    """An extent: an index expression that is not a negative constant (a
    symbolic extent's sign is the caller's, checked when the call binds it)."""
    e = as_expr(x)
    if isinstance(e, E.Const) and e.value < 0:
        raise CaptureError(f"extent {e.value} is negative",
                           hint="extents count elements: use a value >= 0 (0 is an empty axis)")
    return e


class Shape:
    """An ordered list of extents, each optionally carrying a dim identity."""

    __slots__ = ("entries",)

    def __init__(self, entries: Sequence[tuple[Dim | None, E.Expr]]):
        self.entries = tuple(entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, i: int) -> Index:
        return Index(self.entries[i][1])

    def __iter__(self):
        return (Index(x) for _, x in self.entries)

    @property
    def rank(self) -> int:
        return len(self.entries)

    @property
    def extents(self) -> tuple[E.Expr, ...]:
        return tuple(x for _, x in self.entries)

    def without(self, *ds: Any) -> "Shape":
        drop = set(_dims_arg(ds))
        return Shape([(d, x) for d, x in self.entries if d not in drop])

    def space(self, dims: Sequence[Dim] | None = None, labels: str = "d",
              made_by: str | None = None) -> Space:
        """The Space of this shape; unnamed entries get ``dims`` or fresh dims
        (labelled ``labels`` + position, and remembered as made by ``made_by``)."""
        out = []
        for i, (d, x) in enumerate(self.entries):
            if dims is not None:
                d2 = dims[i]
                if d is not None and d != d2:
                    raise TypeCheckError(f"shape entry {i} already has dim '{d.describe()}'")
                d = d2
            if d is None:
                what = made_by if made_by is not None else "a fresh dim of an unnamed shape entry"
                d = Dim.fresh(f"{labels}{i}", made_here(what, anonymous=True))
            out.append(DimFactor(d, x))
        return Space(tuple(out))

    def __repr__(self) -> str:
        return "shape(" + ", ".join(
            (f"{d.describe()}:" if d else "") + str(x) for d, x in self.entries) + ")"


def shape(*items: Any) -> Shape:
    """``shape(4, N)``, ``shape(axis(m, 32), 8)``, ``shape(other_shape, 2)``."""
    out: list[tuple[Dim | None, E.Expr]] = []
    for it in items:
        if isinstance(it, Shape):
            out.extend(it.entries)
        elif isinstance(it, Axis):
            out.append((it.dim, it.extent))
        elif isinstance(it, (tuple, list)):
            out.extend(shape(*it).entries)
        else:
            out.append((None, _extent(it)))
    return Shape(out)


def _as_shape(x: Any) -> Shape:
    if isinstance(x, Shape):
        return x
    if isinstance(x, (tuple, list)):
        return shape(*x)
    return shape(x)


def space_shape(s: Space) -> Shape:
    return Shape([(f.dim, f.extent) for f in s.factors])


class Coord(tuple):
    """An origin: a tuple of index expressions."""


def coord(*items: Any) -> Coord:
    out: list[E.Expr] = []
    for it in items:
        if isinstance(it, (tuple, list)):
            out.extend(coord(*it))
        else:
            out.append(as_expr(it))
    return Coord(out)


def _dims_arg(ds: Iterable[Any]) -> list[Dim]:
    out: list[Dim] = []
    for d in ds:
        if isinstance(d, Dim):
            out.append(d)
        elif isinstance(d, (tuple, list)):
            out.extend(_dims_arg(d))
        else:
            raise CaptureError(f"expected a dim, got {d!r}", hint="obtain dims with x.dim(i)")
    return out


# ---------------------------------------------------------------------------
# tiles


def _emit(name: str, operands: Sequence[Any] = (), attrs: dict | None = None,
          hint: tuple = (), names: tuple = ()) -> list["Tile"]:
    c = ctx()
    op = c.builder.op(name, [o.v if isinstance(o, Tile) else o for o in operands], attrs,
                      hint, names=names)
    return [Tile(r) for r in op.results]


class Tile:
    """A staged immutable value (rank 0: a Scalar)."""

    __slots__ = ("v",)

    def __init__(self, v: BValue):
        self.v = v

    @property
    def type(self) -> TileType:
        return self.v.resolve().type

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    @property
    def rank(self) -> int:
        return self.type.rank

    def dims(self) -> tuple[Dim, ...]:
        return self.type.dims

    def dim(self, i: int) -> Dim:
        try:
            return self.type.dims[i]
        except IndexError:
            raise CaptureError(f"dim({i}) of a rank-{self.rank} tile") from None

    def shape(self) -> Shape:
        return space_shape(self.type.space)

    def domain(self, *ds: Any) -> Shape:
        """The reduction domain over the given dims of this tile."""
        dl = _dims_arg(ds)
        return Shape([(d, self.type.space.extent_of(d)) for d in dl])

    def extent(self, i: int | Dim) -> Index:
        d = i if isinstance(i, Dim) else self.dim(i)
        return Index(self.type.space.extent_of(d))

    def type_str(self) -> str:
        from ..semantics.ops.values import describe_space

        return f"{self.dtype}{describe_space(self.type.space)}" if self.rank else str(self.dtype)

    def astype(self, dt: DType) -> "Tile":
        return cast(self, dt)

    def at(self, h: "ScopeHandle") -> "Tile":
        """Project this tile at a region's coordinates: the dims of ``h``'s domain
        are fixed to ``h``'s indices (``x.at(column)`` inside a reduce)."""
        h._check_open()
        sub = {d: E.Var(v) for (d, _), v in zip(h.shape.entries, h.vars, strict=True)
               if d is not None}
        keep = [f for f in self.type.space.factors if f.dim not in sub]
        if len(keep) == self.rank:
            raise TypeCheckError("x.at(h): none of the handle's dims are dims of x",
                                 hint="the region domain must be built from x's dims "
                                      "(e.g. x.domain(x.dim(1)))")
        return _reindex_select(self, keep, sub)

    def slice(self, origin: Sequence[Any], shp: Any) -> "Tile":
        """The sub-tile at ``origin`` of extents ``shp`` (same dims; must stay in range)."""
        s = _as_shape(shp)
        o = coord(*origin)
        if len(o) != self.rank or s.rank != self.rank:
            raise TypeCheckError("slice needs an origin and shape of the tile's rank")
        space = Space(tuple(DimFactor(f.dim, x)
                            for f, x in zip(self.type.space.factors, s.extents, strict=True)))
        vars_ = tuple(str(i) for i in range(self.rank))
        m = tuple(oi + E.Var(v) for oi, v in zip(o, vars_, strict=True))
        return _emit("reindex", [self], {"vars": vars_, "map": m}, (TileType(self.dtype, space),))[0]

    # arithmetic
    def __add__(self, o): return _binary("add", self, o)
    def __radd__(self, o): return _binary("add", o, self)
    def __sub__(self, o): return _binary("sub", self, o)
    def __rsub__(self, o): return _binary("sub", o, self)
    def __mul__(self, o): return _binary("mul", self, o)
    def __rmul__(self, o): return _binary("mul", o, self)
    def __truediv__(self, o): return _binary("div", self, o)
    def __rtruediv__(self, o): return _binary("div", o, self)
    def __floordiv__(self, o): return _binary("floordiv", self, o)
    def __rfloordiv__(self, o): return _binary("floordiv", o, self)
    def __mod__(self, o): return _binary("mod", self, o)
    def __rmod__(self, o): return _binary("mod", o, self)
    def __pow__(self, o): return _binary("pow", self, o)
    def __neg__(self): return _unary("neg", self)
    def __pos__(self): return self
    def __abs__(self): return _unary("abs", self)
    def __invert__(self): return _unary("not" if self.dtype.is_bool else "bitnot", self)
    def __and__(self, o): return _binary("and", self, o)
    def __rand__(self, o): return _binary("and", o, self)
    def __or__(self, o): return _binary("or", self, o)
    def __ror__(self, o): return _binary("or", o, self)
    def __xor__(self, o): return _binary("xor", self, o)
    def __rxor__(self, o): return _binary("xor", o, self)
    def __lshift__(self, o): return _binary("shl", self, o)
    def __rshift__(self, o): return _binary("shr", self, o)
    def __lt__(self, o): return _binary("lt", self, o)
    def __le__(self, o): return _binary("le", self, o)
    def __gt__(self, o): return _binary("gt", self, o)
    def __ge__(self, o): return _binary("ge", self, o)
    def __eq__(self, o): return _binary("eq", self, o)  # type: ignore[override]
    def __ne__(self, o): return _binary("ne", self, o)  # type: ignore[override]
    __hash__ = None  # type: ignore[assignment]

    def __bool__(self) -> bool:
        raise CaptureError("Python control flow depends on a staged value",
                           hint="use `if tn.if_(cond):` / `while tn.while_(cond):` for dynamic "
                                "control flow, or tn.ite(cond, a, b) to select values")

    def __iter__(self):
        raise CaptureError("a tile cannot be iterated in Python",
                           hint="use a region (tn.serial / tn.reduce) over its dims")

    def __index__(self) -> int:
        raise CaptureError("a staged value has no Python integer value at capture time",
                           hint="use it as an index through tn.coord(...)")

    def __repr__(self) -> str:
        return f"Tile({self.type_str()})"


def _literal_tile(x: Any, dt: DType) -> Tile:
    """A weakly-typed Python literal as a scalar constant of dtype ``dt``."""
    if isinstance(x, (bool, np.bool_)):
        if not dt.is_bool:
            raise TypeCheckError(f"bool literal {x!r} used with a {dt} value",
                                 hint="use 0/1 or tn.cast")
        v: Any = bool(x)
    elif isinstance(x, numbers.Integral):
        if dt.is_bool:
            raise TypeCheckError(f"integer literal {x!r} used with a bool value")
        if dt.is_int:
            lo, hi = ((-(1 << (dt.bits - 1)), (1 << (dt.bits - 1)) - 1) if dt.is_signed
                      else (0, (1 << dt.bits) - 1))
            if not lo <= int(x) <= hi:
                raise TypeCheckError(f"literal {x} does not fit in {dt}")
            v = int(x)
        else:
            v = float(x)
    elif isinstance(x, numbers.Real):
        if not dt.is_float:
            raise TypeCheckError(f"float literal {x!r} used with a {dt} value",
                                 hint="cast the value to a float dtype first")
        v = float(x)
    else:
        raise CaptureError(f"cannot use {type(x).__name__} {x!r} as a value")
    return _emit("const", [], {"value": v}, (TileType(dt, Space()),))[0]


def _as_tile(x: Any, like: DType | None) -> Tile | None:
    if isinstance(x, Tile):
        return x
    if isinstance(x, Index):
        return x.value()
    if isinstance(x, IndexCond):
        return x.value()
    if like is None:
        return None
    return _literal_tile(x, like)


def _operands(xs: Sequence[Any], what: str) -> list[Tile]:
    like = next((x.dtype for x in xs if isinstance(x, Tile)), None)
    if like is None:
        like = next((D.INDEX for x in xs if isinstance(x, Index)), None)
    if like is None:
        like = next((D.bool_ for x in xs if isinstance(x, IndexCond)), None)
    if like is None:
        raise CaptureError(f"'{what}' needs at least one staged operand",
                           hint="make a value with tn.scalar(v, dtype) or tn.full(...)")
    out = [_as_tile(x, like) for x in xs]
    return out  # type: ignore[return-value]


def _binary(name: str, a: Any, b: Any) -> Tile:
    x, y = _operands([a, b], name)
    if name in ("and", "or", "xor") and (x.dtype.is_bool or y.dtype.is_bool):
        pass
    return _emit(name, [x, y])[0]


def _unary(name: str, a: Any, ulp: float | None = None) -> Tile:
    (x,) = _operands([a], name)
    return _emit(name, [x], {} if ulp is None else {"ulp": ulp})[0]


class Fn:
    """A lifted elementwise function; ``reducer`` names its builtin reducer."""

    def __init__(self, op: str, arity: int, reducer: str | None = None, doc: str = ""):
        self.op, self.arity, self.reducer = op, arity, reducer
        self.__doc__ = doc or f"elementwise {op}"
        self.__name__ = op

    def __call__(self, *args: Any, ulp: float | None = None) -> Tile:
        """The function applied elementwise. ``ulp`` (the functions of
        ``numerics.DECLARABLE_ULP`` only) declares this application's accuracy
        bound, in ulp of its dtype, looser than the function's own: any result
        within it is admitted, and a target may compute it faster (spec V-14,
        *Declared bounds*)."""
        if len(args) != self.arity:
            raise CaptureError(f"{self.op} takes {self.arity} arguments, got {len(args)}")
        if ulp is not None and self.op not in N.DECLARABLE_ULP:
            raise CaptureError(f"tn.{self.op} takes no ulp bound",
                               hint=f"only {', '.join(N.DECLARABLE_ULP)} may declare one")
        return _unary(self.op, args[0], ulp) if self.arity == 1 else _binary(self.op, *args)

    def __repr__(self) -> str:
        return f"tn.{self.op}"


def _index_tile(e: E.Expr, space_vars: tuple, dtype: DType, space: Space = Space()) -> Tile:
    return _emit("index", [], {"vars": space_vars, "value": e}, (TileType(dtype, space),))[0]


def _pred_tile(p: E.Pred) -> Tile:
    if isinstance(p, E.BoolConst):
        return _literal_tile(p.value, D.bool_)
    if isinstance(p, E.Cmp):
        name = {"<": "lt", "<=": "le", ">": "gt", ">=": "ge", "==": "eq", "!=": "ne"}[p.op]
        return _emit(name, [_index_tile(p.a, (), D.INDEX), _index_tile(p.b, (), D.INDEX)])[0]
    if isinstance(p, (E.PAnd, E.POr)):
        out = _pred_tile(p.items[0])
        for q in p.items[1:]:
            out = _emit("and" if isinstance(p, E.PAnd) else "or", [out, _pred_tile(q)])[0]
        return out
    if isinstance(p, E.PNot):
        return _emit("not", [_pred_tile(p.item)])[0]
    raise TypeError(p)


def _reindex_select(x: Tile, keep: list[DimFactor], sub: dict) -> Tile:
    vars_ = tuple(str(i) for i in range(len(keep)))
    pos = {f.dim: E.Var(v) for f, v in zip(keep, vars_, strict=True)}
    m = tuple(sub[f.dim] if f.dim in sub else pos[f.dim] for f in x.type.space.factors)
    return _emit("reindex", [x], {"vars": vars_, "map": m},
                 (TileType(x.dtype, Space(tuple(keep))),))[0]


# constructors -------------------------------------------------------------

def _space_for(shp: Any, dims: Sequence[Dim] | None, maker: str) -> Space:
    """The space of a constructor's ``shp``: ``dims=`` name its dims, else the
    shape's own dims, else fresh dims remembered as made by ``maker``."""
    s = _as_shape(shp)
    if dims is not None:
        dims = _dims_arg(dims)
        if len(dims) != s.rank:
            raise TypeCheckError(f"{len(dims)} dims given for a rank-{s.rank} shape")
    return s.space(dims, made_by=f"the fresh dim made by {maker}")


def full(dtype: DType, shp: Any, value: Any, dims: Sequence[Dim] | None = None) -> Tile:
    """A tile of ``shp`` with every element ``value`` (``dims=`` names its dims)."""
    return _full(dtype, shp, value, dims, "tn.full")


def _full(dtype: DType, shp: Any, value: Any, dims: Sequence[Dim] | None, maker: str) -> Tile:
    space = _space_for(shp, dims, maker)
    c = _literal_tile(value, dtype) if not isinstance(value, Tile) else value
    if isinstance(value, Tile):
        if value.rank:
            raise TypeCheckError("full() needs a scalar value")
        if value.dtype != dtype:
            raise TypeCheckError(f"full({dtype}, ...) given a {value.dtype} value")
    if space.rank == 0:
        return c
    return _emit("broadcast", [c], {}, (TileType(dtype, space),))[0]


def zeros(dtype: DType, shp: Any, dims: Sequence[Dim] | None = None) -> Tile:
    return _full(dtype, shp, False if dtype.is_bool else 0, dims, "tn.zeros")


def scalar(value: Any, dtype: DType) -> Tile:
    """A staged scalar of ``dtype``."""
    if isinstance(value, Index):
        return value.value(dtype) if dtype.is_int else cast(value.value(), dtype)
    return _literal_tile(value, dtype)


def cast(x: Any, dtype: DType, overflow: str | None = None) -> Tile:
    """``x`` converted to ``dtype`` (``numerics.cast``). A cast into an FP8
    format rounds to nearest even and needs ``overflow``: ``'saturate'`` (the
    largest finite value of the sign) or ``'nonfinite'`` (NaN in f8e4m3fn,
    infinity in f8e5m2); no other cast takes it."""
    (t,) = _operands([x], "cast")
    if t.dtype == dtype and (overflow is None or dtype.is_fp8):
        return t
    attrs = {} if overflow is None else {"overflow": overflow}
    return _emit("cast", [t], attrs, (t.type.with_dtype(dtype),))[0]


def bitcast(x: Tile, dtype: DType) -> Tile:
    return _emit("bitcast", [x], {}, (x.type.with_dtype(dtype),))[0]


def ite(c: Any, a: Any, b: Any) -> Tile:
    """If-then-else on values (not lazy): ``c ? a : b`` elementwise."""
    if isinstance(c, (bool, np.bool_)):
        c = _literal_tile(bool(c), D.bool_)
    if isinstance(c, IndexCond):
        c = c.value()
    x, y = _operands([a, b], "ite")
    return _emit("ite", [c, x, y])[0]


def iota(shp: Any, axis: int = 0, dtype: DType = D.INDEX,
         dims: Sequence[Dim] | None = None) -> Tile:
    """``iota(shape, axis)[q] = q[axis]`` (an integer tile)."""
    space = _space_for(shp, dims, "tn.iota")
    vars_ = tuple(str(i) for i in range(space.rank))
    return _index_tile(E.Var(vars_[axis]), vars_, dtype, space)


def index_tile(shp: Any, fn: Callable[..., Any], dtype: DType = D.INDEX,
               dims: Sequence[Dim] | None = None) -> Tile:
    """A tile whose element at local coordinate ``q`` is the index expression
    ``fn(*q)`` (which may use region coordinates and extents)."""
    space = _space_for(shp, dims, "tn.index_tile")
    vars_ = tuple(str(i) for i in range(space.rank))
    e = as_expr(_call_with_coordinates(fn, vars_))
    return _index_tile(e, vars_, dtype, space)


def broadcast(x: Any, shp: Any, dims: Sequence[Dim] | None = None) -> Tile:
    """Broadcast ``x`` to a space containing all of its dims."""
    (t,) = _operands([x], "broadcast")
    if isinstance(shp, Tile):
        space = shp.type.space
    else:
        s = _as_shape(shp)
        if dims is None and all(d is None for d, _ in s.entries):
            raise TypeCheckError("broadcast target needs dims",
                                 hint="pass another tile, a shape with axes, or dims=")
        space = s.space(dims, made_by="the fresh dim made by tn.broadcast")
    return _emit("broadcast", [t], {}, (TileType(t.dtype, space),))[0]


def reshape(x: Tile, shp: Any, dims: Sequence[Dim] | None = None) -> Tile:
    """Row-major reshape to a new space (same element count)."""
    return _emit("reshape", [x], {}, (TileType(x.dtype, _space_for(shp, dims, "tn.reshape")),))[0]


def permute(x: Tile, order: Sequence[Any]) -> Tile:
    """Reorder ``x``'s dims (given as dims or positions)."""
    perm = [x.type.space.index(d) if isinstance(d, Dim) else int(d) for d in order]
    return _emit("permute", [x], {"perm": tuple(perm)})[0]


def reindex(x: Tile, shp: Any, fn: Callable[..., Any], dims: Sequence[Dim] | None = None) -> Tile:
    """``y[q] = x[fn(q)]``; ``fn`` returns one source coordinate per dim of ``x``.
    A source coordinate outside ``x`` is an error (no fill contract)."""
    space = (_space_for(shp, dims, "tn.reindex") if not isinstance(shp, Tile)
             else shp.type.space)
    vars_ = tuple(str(i) for i in range(space.rank))
    src = _call_with_coordinates(fn, vars_)
    src = coord(*(src if isinstance(src, (tuple, list)) else (src,)))
    return _emit("reindex", [x], {"vars": vars_, "map": tuple(src)},
                 (TileType(x.dtype, space),))[0]


def gather(x: Tile, idx: Tile, axis: int | Dim, fallback: Any = 0) -> Tile:
    """``y[q] = x[..., idx[q], ...]`` along ``axis``; invalid indices give ``fallback``."""
    ax = x.type.space.index(axis) if isinstance(axis, Dim) else int(axis)
    if isinstance(fallback, float) and not x.dtype.is_float:
        raise TypeCheckError(f"gather fallback {fallback!r} does not fit {x.dtype}")
    return _emit("gather", [x, idx], {"axis": ax, "fallback": fallback})[0]


def put(x: Tile, origin: Sequence[Any], patch: Tile) -> Tile:
    """A copy of ``x`` with the block at ``origin`` replaced by ``patch``
    (the explicit slice update of an ancestor-owned tile)."""
    (p,) = _operands([patch], "put")
    return _emit("put", [x, p], {"origin": tuple(coord(*origin))})[0]


def mma(a: Tile, b: Tile, acc: Tile, allow_reassociation: bool = True,
        policy: MmaPolicy | None = None) -> Tile:
    """``acc[b,m,n] + sum_k conv(a[b,m,k]) * conv(b[b,k,n])``; roles by dim identity."""
    if policy is not None:
        if not isinstance(policy, MmaPolicy):
            raise CaptureError(f"mma(policy=...): {_what(policy)} is not an mma policy",
                               hint="use tn.MmaPolicy(allow_reassociation=False), or "
                                    "allow_reassociation=False")
        allow_reassociation = policy.allow_reassociation
    return _emit("mma", [a, b, acc], {"allow_reassociation": bool(allow_reassociation)})[0]


def matmul(a: Tile, b: Tile, dtype: DType | None = None) -> Tile:
    """``mma(a, b, zeros)`` with the conventional ``[..., M, K] x [..., K, N]`` roles:
    ``b``'s second-to-last dim is identified with ``a``'s last."""
    if a.rank < 2 or b.rank < 2:
        raise TypeCheckError("matmul needs operands of rank >= 2")
    k = a.dim(-1)
    bs = b.type.space
    if bs.factors[-2].dim != k:
        bt = _emit("reindex", [b], {
            "vars": tuple(str(i) for i in range(b.rank)),
            "map": tuple(E.Var(str(i)) for i in range(b.rank))},
            (TileType(b.dtype, Space(bs.factors[:-2] + (DimFactor(k, bs.factors[-2].extent),
                                                        bs.factors[-1]))),))[0]
    else:
        bt = b
    out_space = Space(a.type.space.factors[:-1] + (bt.type.space.factors[-1],))
    acc = zeros(dtype or a.dtype, space_shape(out_space))
    return mma(a, bt, acc)


def per(h: "ScopeHandle", x: Any) -> Tile:
    """``x`` as a distinct value per instance of the parallel scope ``h``."""
    h._check_open()
    if h.kind != "parallel":
        raise CaptureError("per() takes a parallel scope handle")
    (t,) = _operands([x], "per")
    return _emit("per", [t], {"level": h.level})[0]


def map(*args: Any) -> Tile | tuple[Tile, ...]:
    """``map(v0, ..., vn, fn)``: one lifted elementwise op whose scalar body is
    ``fn`` applied to scalar proxies of the operands."""
    if not args or not callable(args[-1]):
        raise CaptureError("map(values..., fn) needs a function as its last argument")
    fn, vals = args[-1], args[:-1]
    ts = _operands(list(vals), "map")
    from .builder import BBlock

    c = ctx()
    blk = BBlock([BValue(TileType(t.dtype, Space()), f"a{i}") for i, t in enumerate(ts)])
    c.builder.push(blk)
    try:
        out = fn(*(Tile(a) for a in blk.args))
        outs = out if isinstance(out, tuple) else (out,)
        outs_t = [_as_tile(o, ts[0].dtype) for o in outs]
        for o in outs_t:
            if o.rank:
                raise TypeCheckError("the map function must return scalars")
        c.builder.op("yield", [o.v for o in outs_t])
    finally:
        c.builder.pop()
    res = _emit_region_map(ts, blk, tuple(TileType(o.dtype, Space()) for o in outs_t))
    return res[0] if len(res) == 1 else tuple(res)


def _emit_region_map(ts: list[Tile], blk: Any, hint: tuple) -> list[Tile]:
    c = ctx()
    op = c.builder.op("map", [t.v for t in ts], {}, hint, regions=[blk])
    return [Tile(r) for r in op.results]


# ---------------------------------------------------------------------------
# tensors and views


BOUNDS_ALIASES = {"zero": ZERO, "checked": CHECKED, "assume": ASSUME}


class _BoundsNS:
    """``tn.bounds.zero / checked / assume / fill(v)``."""

    zero = ZERO
    checked = CHECKED
    assume = ASSUME

    @staticmethod
    def fill(v: Any) -> BoundsPolicy:
        return BoundsPolicy(Bounds.fill, v)


bounds = _BoundsNS()


class TensorArg:
    """A tensor view (kernel argument, possibly sub-viewed and/or retyped)."""

    def __init__(self, v: BValue, name: str, dims: tuple[Dim, ...],
                 origin: tuple[E.Expr, ...] | None = None,
                 extents: tuple[E.Expr, ...] | None = None):
        self.v = v
        self.name = name
        t: TensorType = v.type
        self._dims = dims
        self.origin = origin or tuple(E.Const(0) for _ in range(t.rank))
        self.extents = extents or t.shape

    @property
    def type(self) -> TensorType:
        return self.v.type

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    @property
    def shape(self) -> tuple[Index, ...]:
        return tuple(Index(x) for x in self.extents)

    @property
    def rank(self) -> int:
        return self.type.rank

    def dims(self) -> tuple[Dim, ...]:
        return self._dims

    def dim(self, i: int) -> Dim:
        return self._dims[i]

    def with_dims(self, *ds: Any) -> "TensorArg":
        """The same view with its axes retyped to the given dim identities."""
        dl = _dims_arg(ds)
        if len(dl) != self.rank:
            raise TypeCheckError(f"with_dims got {len(dl)} dims for the rank-{self.rank} "
                                 f"tensor '{self.name}'")
        if len(set(dl)) != len(dl):
            raise TypeCheckError(f"with_dims repeats a dim for '{self.name}'")
        return TensorArg(self.v, self.name, tuple(dl), self.origin, self.extents)

    def view(self, origin: Sequence[Any], shp: Any) -> "TensorArg":
        """A sub-view: coordinates shift by ``origin``; bounds shrink to ``shp``."""
        o = coord(*origin)
        s = _as_shape(shp)
        if len(o) != self.rank or s.rank != self.rank:
            raise TypeCheckError("view() needs an origin and shape of the tensor's rank")
        return TensorArg(self.v, self.name, self._dims,
                         tuple(a + b for a, b in zip(self.origin, o, strict=True)), s.extents)

    def _access(self, origin: Any, shp: Any, bnd: Any) -> "ViewRef":
        if not isinstance(origin, (tuple, list)):
            origin = (origin,)
        o = coord(*origin)
        s = _as_shape(shp)
        if len(o) != self.rank:
            raise TypeCheckError(f"origin has {len(o)} coordinates for the rank-{self.rank} "
                                 f"tensor '{self.name}'")
        if s.rank != self.rank:
            raise TypeCheckError(f"shape has {s.rank} extents for the rank-{self.rank} "
                                 f"tensor '{self.name}'",
                                 hint="a view keeps the tensor's rank; use extent 1 for "
                                      "a single row/column")
        for i, (d, _) in enumerate(s.entries):
            if d is not None and d != self._dims[i]:
                raise TypeCheckError(
                    f"shape entry {i} names dim '{d.describe()}' but axis {i} of "
                    f"'{self.name}' is '{self._dims[i].describe()}'",
                    hint=f"retype the view first: {self.name}.with_dims(...)")
        return ViewRef(self, o, s, _bounds(bnd))

    def __getitem__(self, key: Any) -> Tile:
        if not isinstance(key, tuple) or len(key) not in (2, 3):
            raise CaptureError(f"load as {self.name}[origin, shape] or "
                               f"{self.name}[origin, shape, bounds]")
        return self._access(*key).load() if len(key) == 3 else self._access(*key, None).load()

    def __setitem__(self, key: Any, value: Any) -> None:
        raise CaptureError(f"'{self.name}[...] = value' is not a store",
                           hint=f"write {self.name}(origin, shape).store(value)")

    def __call__(self, origin: Any, shp: Any, bnd: Any = None) -> "ViewRef":
        return self._access(origin, shp, bnd)

    def tile(self, origin: Any, shp: Any, bnd: Any = None) -> "ViewRef":
        return self._access(origin, shp, bnd)

    def __repr__(self) -> str:
        return f"TensorArg({self.name})"


def _bounds(b: Any) -> BoundsPolicy:
    if b is None:
        return ZERO
    if isinstance(b, BoundsPolicy):
        return b
    if isinstance(b, str) and b in BOUNDS_ALIASES:
        return BOUNDS_ALIASES[b]
    raise CaptureError(f"unknown bounds policy {b!r}",
                       hint="use tn.bounds.zero / checked / assume / fill(v)")


class ViewRef:
    """``A(origin, shape)``: a reference to a block of a tensor (no effect yet)."""

    def __init__(self, t: TensorArg, origin: tuple, shp: Shape, bnd: BoundsPolicy):
        self.t, self.origin, self.shp, self.bnd = t, origin, shp, bnd

    def _map(self) -> tuple[tuple[str, ...], tuple[E.Expr, ...], E.Pred]:
        vars_ = tuple(str(i) for i in range(self.t.rank))
        m = tuple(to + o + E.Var(v)
                  for to, o, v in zip(self.t.origin, self.origin, vars_, strict=True))
        valid: E.Pred = E.TRUE
        full_view = all(isinstance(x, E.Const) and x.value == 0 for x in self.t.origin) and \
            self.t.extents == self.t.type.shape
        if not full_view:
            valid = E.pand(*(E.pand((o + E.Var(v)).ge(0), (o + E.Var(v)).lt(x))
                             for o, v, x in zip(self.origin, vars_, self.t.extents, strict=True)))
        return vars_, m, valid

    def load(self, fill: Any = None) -> Tile:
        bnd = self.bnd if fill is None else BoundsPolicy(Bounds.fill, fill)
        if bnd.kind is Bounds.fill:
            _check_fill(bnd.fill, self.t.dtype)
        vars_, m, valid = self._map()
        space = Space(tuple(DimFactor(d, x) for d, x in
                            zip(self.t.dims(), self.shp.extents, strict=True)))
        return _emit("tensor.load", [self.t.v],
                     {"vars": vars_, "map": m, "valid": valid, "bounds": bnd},
                     (TileType(self.t.dtype, space),))[0]

    def store(self, value: Any) -> None:
        if not isinstance(value, Tile):
            value = _literal_tile(value, self.t.dtype)
        if value.rank == 0 and self.shp.rank:
            value = broadcast(value, space_shape(Space(tuple(
                DimFactor(d, x) for d, x in zip(self.t.dims(), self.shp.extents, strict=True)))))
        if value.rank != self.t.rank:
            raise TypeCheckError(
                f"cannot store a rank-{value.rank} tile {value.type_str()} into a rank-"
                f"{self.t.rank} view of '{self.t.name}'",
                hint="reshape or broadcast the value to the view's rank")
        vdims, tdims = value.dims(), self.t.dims()
        if set(vdims) == set(tdims) and vdims != tdims:
            raise TypeCheckError(
                f"the stored tile's dims are a permutation of the view's dims of '{self.t.name}'",
                hint="stores are positional; tn.permute the value to the view's axis order")
        for i, (a, b) in enumerate(zip(value.type.extents, self.shp.extents, strict=True)):
            if a != b:
                raise TypeCheckError(
                    f"stored tile extent {a} differs from view extent {b} on axis {i} "
                    f"of '{self.t.name}'")
        if value.dtype != self.t.dtype:
            raise TypeCheckError(
                f"cannot store a {value.dtype} tile into the {self.t.dtype} tensor '{self.t.name}'",
                hint=f"convert explicitly: tn.cast(value, tn.{self.t.dtype})")
        vars_, m, valid = self._map()
        c = ctx()
        c.builder.op("tensor.store", [self.t.v, value.v],
                     {"vars": vars_, "map": m, "valid": valid, "bounds": self.bnd})


def _check_fill(v: Any, dt: DType) -> None:
    if isinstance(v, float) and not dt.is_float and not (isinstance(v, float) and v.is_integer()):
        raise TypeCheckError(f"fill value {v!r} is not representable in {dt}")


# ---------------------------------------------------------------------------
# memory


class _MemNS:
    auto = "auto"
    private_ = "private"
    shared = "shared"
    cluster = "cluster"
    global_ = "global"
    tensor = "tensor"


mem = _MemNS()


@dataclass(frozen=True)
class LayoutSpec:
    shape: Shape
    layout: Callable[[tuple[str, ...]], MemLayout]


def layout(shp: Any, strides: Sequence[Any] | None = None, order: Sequence[int] | None = None,
           offset: Callable[..., Any] | None = None, size: Any = None) -> LayoutSpec:
    """A memory layout: strided (``strides``, or dense in ``order``) or a custom
    ``offset(*coords)`` index function (e.g. an XOR swizzle) with ``size``."""
    s = _as_shape(shp)

    def make(vars_: tuple[str, ...]) -> MemLayout:
        if offset is not None:
            off = as_expr(offset(*(Index(E.Var(v)) for v in vars_)))
            sz = as_expr(size) if size is not None else s.space().size()
            return MemLayout(vars_, off, sz)
        st = None if strides is None else [as_expr(x) for x in strides]
        return strided_layout(vars_, s.extents, st, order)

    return LayoutSpec(s, make)


class MemoryObj:
    """An explicit Memory object; ``store`` is its only mutation."""

    def __init__(self, v: BValue, state: BValue, name_site: Any):
        self.v = v
        self.state = state
        self.site = name_site

    @property
    def type(self) -> MemoryType:
        return self.v.resolve().type

    def store(self, value: Any) -> None:
        c = ctx()
        if not isinstance(value, Tile):
            value = _literal_tile(value, self.type.dtype)
        if value.rank == 0 and self.type.space.rank:
            value = broadcast(value, space_shape(self.type.space))
        op = c.builder.op("memory.store", [self.v, self.state, value.v])
        self.state = op.results[0]

    def load(self) -> Tile:
        return _emit("memory.load", [self.v, self.state])[0]

    def __repr__(self) -> str:
        return f"Memory({self.type.dtype})"


def memory(dtype: DType, shape_or_layout: Any, resource: str = "auto",
           dims: Sequence[Dim] | None = None) -> MemoryObj:
    """An explicit Memory: one allocation per instance of the enclosing parallel.
    Its logical dims are fresh unless the shape carries dims or ``dims=`` names them."""
    c = ctx()
    if resource not in ("auto", "private", "shared", "cluster", "global", "tensor"):
        raise CaptureError(f"unknown memory resource {resource!r}",
                           hint="use tn.mem.auto/private_/shared/cluster/global_/tensor")
    spec = shape_or_layout if isinstance(shape_or_layout, LayoutSpec) else layout(shape_or_layout)
    space = spec.shape.space(_dims_arg(dims) if dims is not None else None, labels="mem",
                             made_by="the fresh dim made by tn.memory")
    vars_ = tuple(str(i) for i in range(space.rank))
    lay = spec.layout(vars_)
    mt = MemoryType(dtype, space, lay, resource)
    mv = BValue(mt, "mem")
    st = StateType(mv.tmp_name)
    op = c.builder.op("memory.alloc", [], {}, (mt, st), names=("mem", "state"))
    mv = op.results[0]
    op.results[1].type = StateType(mv.tmp_name)
    m = MemoryObj(mv, op.results[1], c.site())
    c.memories.append(m)
    return m


# ---------------------------------------------------------------------------
# execution constants, policies


class _ExecNS:
    cluster = ExecPolicy("cluster")
    block = ExecPolicy("block")
    warp = ExecPolicy("warp")
    subgroup = ExecPolicy("subgroup")
    thread = ExecPolicy("thread")
    core = ExecPolicy("core")
    vector = ExecPolicy("vector")
    infer = ExecPolicy("infer")

    @staticmethod
    def layout(fn: Callable[..., Any], scope: Any = None) -> "ExecLayoutSpec":
        """Constrain the child map: ``coord = fn(*raw_index)`` (a ParallelMap),
        optionally on a scope (a name or a ``tn.exec`` constant)."""
        if not callable(fn):
            raise CaptureError(f"tn.exec.layout(fn): {_what(fn)} is not a function",
                               hint="pass a function of the raw indices, e.g. "
                                    "tn.exec.layout(lambda i: i * 2)")
        return ExecLayoutSpec(fn, _scope_name(scope))


@dataclass(frozen=True)
class ExecLayoutSpec:
    fn: Callable[..., Any]
    scope: str | None


exec = _ExecNS()  # noqa: A001 - the DSL spelling is tn.exec

unordered_tree = ReductionPolicy.unordered_tree
ordered_tree = ReductionPolicy.ordered_tree
fold_left = ReductionPolicy.fold_left
fold_right = ReductionPolicy.fold_right

_POLICY_NAMES = ", ".join(f"tn.{p.value}" for p in ReductionPolicy)


def _what(v: Any) -> str:
    return repr(v) if isinstance(v, (str, int, float, bool)) or v is None \
        else f"a {type(v).__name__}"


def as_reduction_policy(v: Any, where: str) -> ReductionPolicy:
    """The reduction policy ``v`` denotes: a ``tn`` policy constant, or its
    documented name as a string (``"fold_left"``). Anything else is a
    CaptureError (located by the stager at the statement)."""
    if isinstance(v, ReductionPolicy):
        return v
    if isinstance(v, str):
        try:
            return ReductionPolicy(v.removeprefix("tn."))
        except ValueError:
            pass
    raise CaptureError(f"{where}: {_what(v)} is not a reduction policy",
                       hint=f"use one of {_POLICY_NAMES} (or its name as a string, "
                            "e.g. 'fold_left')")


def as_exec(v: Any) -> ExecPolicy | ExecLayoutSpec | None:
    """The execution constraint ``v`` denotes: None, a ``tn.exec`` constant or
    ``tn.exec.layout(...)``, or a scope name as a string (``"warp"``)."""
    if v is None or isinstance(v, (ExecPolicy, ExecLayoutSpec)):
        return v
    if isinstance(v, str) and v.removeprefix("tn.exec.") in EXEC_SCOPES:
        return ExecPolicy(v.removeprefix("tn.exec."))
    raise CaptureError(f"parallel(exec=...): {_what(v)} is not an execution scope",
                       hint="use one of " + ", ".join(f"tn.exec.{x}" for x in EXEC_SCOPES)
                            + " (or its name as a string, e.g. 'warp'), or tn.exec.layout(fn)")


def _scope_name(scope: Any) -> str | None:
    if scope is None:
        return None
    ex = as_exec(scope)
    if not isinstance(ex, ExecPolicy):
        raise CaptureError(f"tn.exec.layout(fn, scope=...): {_what(scope)} is not a scope name")
    return ex.scope


def pipeline_policy(window: int = 2, interval: int = 1) -> PipelinePolicy:
    """``window``: 0 = planner chooses, 1 = no overlap, N = at most N iterations in
    flight; ``interval`` >= 1."""
    if int(window) < 0 or int(interval) < 1:
        raise CaptureError(f"pipeline_policy(window={window}, interval={interval}): the "
                           "window must be >= 0 and the interval >= 1")
    return PipelinePolicy(int(window), int(interval))


def assume(cond: Any) -> None:
    """Declare a fact about kernel parameters the caller guarantees (``N >= 1``)."""
    if isinstance(cond, bool):
        if not cond:
            raise CaptureError("assume(False)")
        return
    if not isinstance(cond, IndexCond):
        raise CaptureError("assume() takes a condition on symbolic extents, e.g. N >= 1")
    bad = [lf for lf in E.leaves(cond.pred) if not isinstance(lf, E.Sym)]
    if bad:
        raise CaptureError("assume() may only mention kernel parameters (symbolic extents)")
    ctx().assumptions.append(cond.pred)


# ---------------------------------------------------------------------------
# scope handles and region specifications


REGION_KINDS = ("parallel", "serial", "pipeline", "reduce")


@dataclass(eq=False)
class RegionSpec:
    """What a region constructor returns; the kernel stager opens it as a ``for``."""

    kind: str
    shape: Shape
    parent: "ScopeHandle | None"
    exec: ExecPolicy | ExecLayoutSpec | None = None
    order: str = "forward"
    policy: Any = None
    contract: Any = None

    def __iter__(self):
        raise CaptureError(
            f"tn.{self.kind}(...) opens a region only as the iterable of a `for` statement "
            "in a @tn.kernel (or @tn.func) body",
            hint="write `for h in tn.%s(...):`" % self.kind)


class ScopeHandle:
    """The loop variable of a region: gives its coordinates; not a value."""

    def __init__(self, kind: str, vars_: tuple[str, ...], shp: Shape, level: int,
                 parent: "ScopeHandle | None", name: str, site: Any,
                 child_coord: tuple[E.Expr, ...] | None = None):
        self.kind, self.vars, self.shape = kind, vars_, shp
        self.level, self.parent, self.name, self.site = level, parent, name, site
        self.closed = False
        self.child_coord = child_coord if child_coord is not None else tuple(
            E.Var(v) for v in vars_)
        self.stage_count = 0

    def _check_open(self) -> None:
        if self.closed:
            raise CaptureError(
                f"scope handle '{self.name}' is used outside its region"
                + (f" (opened at {self.site})" if self.site else ""),
                hint="a region's coordinates are only readable inside its `for` body")

    def index(self, axis: Any = None) -> Any:
        """The local coordinate (``axis`` by position or dim; whole index if rank 1)."""
        self._check_open()
        if axis is None:
            if len(self.vars) != 1:
                raise CaptureError(
                    f"'{self.name}.index()' on a rank-{len(self.vars)} domain",
                    hint=f"use {self.name}.index(axis) or {self.name}.index(0..."
                         f"{len(self.vars) - 1})")
            return Index(E.Var(self.vars[0]))
        if isinstance(axis, Dim):
            for (d, _), v in zip(self.shape.entries, self.vars, strict=True):
                if d == axis:
                    return Index(E.Var(v))
            raise CaptureError(f"'{axis.describe()}' is not a dim of {self.name}'s domain")
        if not -len(self.vars) <= int(axis) < len(self.vars):
            raise CaptureError(f"axis {axis} out of range for {self.name}")
        return Index(E.Var(self.vars[int(axis)]))

    def coord(self) -> tuple[Index, ...]:
        """The full typed path: ancestors' coordinates then this region's."""
        self._check_open()
        base = self.parent.coord() if self.parent is not None else ()
        return base + tuple(Index(e) for e in self.child_coord)

    def stage(self, name: str | None = None) -> None:
        """Pipeline cursor: close the current stage segment and open the next."""
        from .stager import stage_cut

        self._check_open()
        if self.kind != "pipeline":
            raise CaptureError(f"stage() is a pipeline cursor; '{self.name}' is a {self.kind}")
        stage_cut(self, name)

    def _member(self, kind: str, *a: Any, **kw: Any) -> RegionSpec:
        self._check_open()
        spec = _REGION_CTORS[kind](*a, **kw)
        spec.parent = self
        return spec

    def parallel(self, *a: Any, **kw: Any) -> RegionSpec:
        return self._member("parallel", *a, **kw)

    def serial(self, *a: Any, **kw: Any) -> RegionSpec:
        return self._member("serial", *a, **kw)

    def pipeline(self, *a: Any, **kw: Any) -> RegionSpec:
        return self._member("pipeline", *a, **kw)

    def reduce(self, *a: Any, **kw: Any) -> RegionSpec:
        return self._member("reduce", *a, **kw)

    def __iter__(self):
        raise CaptureError(f"scope handle '{self.name}' is not iterable",
                           hint=f"read coordinates with {self.name}.index(...)")

    def __getitem__(self, k: Any):
        raise CaptureError(f"scope handle '{self.name}' has no [] operator",
                           hint=f"use {self.name}.index(axis); A[origin, shape] loads tensors")

    def __repr__(self) -> str:
        return f"<{self.kind} scope {self.name}>"


def _parallel(domain: Any = None, exec: Any = None) -> RegionSpec:  # noqa: A002
    if domain is None:
        raise CaptureError("parallel() needs a domain shape")
    return RegionSpec("parallel", _as_shape(domain), None, exec=as_exec(exec))


def _serial(domain: Any, order: str | None = None) -> RegionSpec:
    if order is not None and (not isinstance(order, str) or order not in ("forward", "reverse")):
        raise CaptureError(f"serial(order=...): {_what(order)} is not a serial order",
                           hint="use 'forward' (the default, also None) or 'reverse'")
    return RegionSpec("serial", _as_shape(domain), None, order=order or "forward")


def _pipeline(domain: Any, policy: PipelinePolicy | None = None) -> RegionSpec:
    if policy is not None and not isinstance(policy, PipelinePolicy):
        raise CaptureError(f"pipeline(policy=...): {_what(policy)} is not a pipeline policy",
                           hint="use tn.pipeline_policy(window=2, interval=1), or leave it out")
    return RegionSpec("pipeline", _as_shape(domain), None, policy=policy or PipelinePolicy())


def _reduce_region(domain: Any, contract: Any = None,
                   policy: Any = ReductionPolicy.unordered_tree) -> RegionSpec:
    if isinstance(contract, ReductionPolicy) or (
            isinstance(contract, str) and contract.removeprefix("tn.") in
            {p.value for p in ReductionPolicy}):
        contract, policy = None, contract
    return RegionSpec("reduce", _as_shape(domain), None,
                      policy=as_reduction_policy(policy, "reduce(policy=...)"),
                      contract=contract)


_REGION_CTORS: dict[str, Callable[..., RegionSpec]] = {
    "parallel": _parallel, "serial": _serial, "pipeline": _pipeline, "reduce": _reduce_region,
}


def parallel(domain: Any = None, exec: Any = None) -> RegionSpec:  # noqa: A002
    """Independent logical children over ``domain`` (extends the spatial prefix)."""
    return _parallel(domain, exec)


def serial(domain: Any, order: str | None = None) -> RegionSpec:
    """A totally ordered temporal loop over ``domain``."""
    return _serial(domain, order)


def pipeline(domain: Any, policy: PipelinePolicy | None = None) -> RegionSpec:
    """A producer/consumer stage sequence iterated over ``domain``."""
    return _pipeline(domain, policy)


def reduce(x: Any, dims: Any = None, reducer: Any = None, **kw: Any) -> Any:
    """Region form ``reduce(domain, contract=None, policy=unordered_tree)`` (used as
    a ``for`` iterable), or expression form ``reduce(tile, dims, reducer)``."""
    if isinstance(x, Tile):
        from .library import reduce_expr

        return reduce_expr(x, dims, reducer, **kw)
    if dims is not None and "contract" not in kw:
        kw["contract"] = dims
    if reducer is not None:
        kw["policy"] = reducer
    return _reduce_region(x, **kw)


@dataclass(frozen=True)
class IfMarker:
    cond: Any


@dataclass(frozen=True)
class WhileMarker:
    cond: Any


def if_(cond: Any) -> IfMarker:
    """Dynamic conditional on a staged bool scalar: ``if tn.if_(c): ... else: ...``."""
    return IfMarker(cond)


def while_(cond: Any) -> WhileMarker:
    """Dynamic loop on a staged bool scalar: ``while tn.while_(c): ...``."""
    return WhileMarker(cond)


def finite_float(x: float) -> bool:
    return math.isfinite(x)
