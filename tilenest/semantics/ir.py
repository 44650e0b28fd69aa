"""TileIR: the immutable in-memory program.

Structure: a :class:`TileProgram` owns one body :class:`Block`; a Block has
argument Values and a sequence of :class:`Operation` s; an Operation has operand
and result Values, attributes, nested Blocks (its regions) and a source
location. Every Value is defined exactly once (SSA) and named uniquely within
its program; equality of programs is structural.

Index variables (region coordinates, map-local coordinates) are not Values:
they are :class:`~tilenest.semantics.expr.Var` leaves bound by the op that
declares them (attribute ``vars``), so index arithmetic stays symbolic.

The eight parts of the calculus' ``TileProgram = (E, R(E), G, M, L, A, Pi, C)``
are views of this one structure; see :class:`TileProgram`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Iterator, Mapping

from ..errors import Site
from .dtypes import DType
from .expr import Pred
from .space import Dim
from .types import MemoryType, TensorType, TileType, Type


class FrozenDict(Mapping[str, Any]):
    """An immutable, hashable mapping with insertion-independent equality."""

    __slots__ = ("_d", "_h")

    def __init__(self, *a: Any, **kw: Any):
        self._d = dict(*a, **kw)
        self._h: int | None = None

    def __getitem__(self, k: str) -> Any:
        return self._d[k]

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._d))

    def __len__(self) -> int:
        return len(self._d)

    def __hash__(self) -> int:
        if self._h is None:
            self._h = hash(tuple(sorted(self._d.items(), key=lambda kv: kv[0])))
        return self._h

    def __eq__(self, o: object) -> bool:
        return isinstance(o, FrozenDict) and self._d == o._d

    def __repr__(self) -> str:
        return f"FrozenDict({self._d!r})"

    def set(self, **kw: Any) -> "FrozenDict":
        d = dict(self._d)
        d.update(kw)
        return FrozenDict(d)


@dataclass(frozen=True)
class Value:
    """An SSA value: its program-unique ``name`` (printed ``%name``) and type."""

    name: str
    type: Type

    def __repr__(self) -> str:
        return f"%{self.name}"


@dataclass(frozen=True)
class Block:
    """A straight-line sequence of ops with arguments; the region of an op.

    A region-holding op's Block ends with a ``yield`` whose operands are the
    block's outputs (per-iteration next states, branch results, ...)."""

    args: tuple[Value, ...] = ()
    ops: tuple["Operation", ...] = ()

    @property
    def terminator(self) -> "Operation | None":
        return self.ops[-1] if self.ops and self.ops[-1].name == "yield" else None

    def walk(self) -> Iterator["Operation"]:
        """Every op in this block and nested blocks, in pre-order."""
        for op in self.ops:
            yield op
            for r in op.regions:
                yield from r.walk()


@dataclass(frozen=True)
class Operation:
    """One operation. ``oid`` is a program-unique id in pre-order (not part of
    equality); analyses key their side tables by it."""

    name: str
    operands: tuple[Value, ...] = ()
    results: tuple[Value, ...] = ()
    attrs: FrozenDict = field(default_factory=FrozenDict)
    regions: tuple[Block, ...] = ()
    loc: Site | None = None
    oid: int = field(default=-1, compare=False)
    #: where a reader found this op in a TileIR text or JSON document (not
    #: part of equality, not printed): the site of its errors when it has no
    #: ``loc`` of its own (:attr:`site`)
    read_at: Site | None = field(default=None, compare=False, repr=False)

    @property
    def site(self) -> Site | None:
        """Where an error about this op points: its ``loc`` (the user's
        source line), else where it was read."""
        return self.loc if self.loc is not None else self.read_at

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    @property
    def result(self) -> Value:
        if len(self.results) != 1:
            raise ValueError(f"{self.name} has {len(self.results)} results")
        return self.results[0]

    def replace(self, **kw: Any) -> "Operation":
        d: dict[str, Any] = dict(name=self.name, operands=self.operands, results=self.results,
                                 attrs=self.attrs, regions=self.regions, loc=self.loc,
                                 oid=self.oid, read_at=self.read_at)
        d.update(kw)
        return Operation(**d)

    def __repr__(self) -> str:
        res = ", ".join(repr(r) for r in self.results)
        ops = ", ".join(repr(o) for o in self.operands)
        return f"<{res + ' = ' if res else ''}{self.name} {ops}>"


#: Region ops that are execution-nest kinds.
NEST_OPS = ("parallel", "serial", "pipeline", "reduce")


@dataclass(frozen=True)
class TileProgram:
    """A whole kernel: ``TileProgram = (E, R(E), G, M, L, A, Pi, C)``.

    Stored: ``name``; ``args`` (tensor and runtime-scalar parameters, in
    signature order); ``syms`` (symbolic integer parameters: extents and
    integer arguments); ``assumptions`` (predicates over ``syms`` the caller
    guarantees); ``dims`` (the program's dim identities, canonical order);
    ``reducers`` (custom reducer contracts); ``body``; ``loc``.

    Views (computed once, cached):

    * :attr:`E`  -- the execution nest (``parallel`` levels and their prefixes);
    * :attr:`R`  -- the region tree (every nest/control region op, pre-order);
    * :attr:`G`  -- dataflow: every op with its operands/results (SSA + effects);
    * :attr:`M`  -- Memory objects (``memory.alloc`` ops);
    * :attr:`L`  -- every coordinate map (views, memory layouts, parallel maps,
      reindexes);
    * :attr:`A`  -- reducer contracts used by ``reduce`` regions;
    * :attr:`Pi` -- pipeline policies;
    * :attr:`C`  -- constraints: assumptions, exec-scope constraints, guards.
    """

    name: str
    args: tuple[Value, ...]
    syms: tuple[str, ...]
    assumptions: tuple[Pred, ...]
    dims: tuple[Dim, ...]
    body: Block
    reducers: tuple[Any, ...] = ()
    loc: Site | None = None
    #: where a reader found the kernel (not part of equality, not printed)
    read_at: Site | None = field(default=None, compare=False, repr=False)

    @property
    def site(self) -> Site | None:
        """Where an error about the whole kernel points: its ``loc``, else
        where it was read."""
        return self.loc if self.loc is not None else self.read_at

    # -- traversal ------------------------------------------------------
    def walk(self) -> Iterator[Operation]:
        return self.body.walk()

    def first_use_of(self, dtype: str) -> tuple[str, str, Site | None] | None:
        """The first place this program holds a value of the dtype named
        ``dtype`` -- an argument (the kernel's site), then an op's result,
        operand or attribute (the op's site) -- as ``(what, detail, site)``
        for a message (``"argument 'w' of kernel k"``, ``""``; or ``"op
        'cast'"``, ``"value %v"``); None when there is none."""
        def has(x: Any) -> bool:
            if isinstance(x, (tuple, list)):
                return any(has(y) for y in x)
            dt = x if isinstance(x, DType) else getattr(x, "dtype", None)
            return isinstance(dt, DType) and dt.name == dtype

        for a in self.args:
            if has(a.type):
                return f"argument '{a.name}' of kernel {self.name}", "", self.site
        for op in self.walk():
            vals = [v for v in (*op.results, *op.operands) if has(v.type)]
            attrs = [k for k, v in op.attrs.items() if has(v)]
            if vals or attrs:
                detail = f"value %{vals[0].name}" if vals else f"attribute '{attrs[0]}'"
                return f"op '{op.name}'", detail, op.site or self.site
        return None

    @cached_property
    def ops_by_id(self) -> dict[int, Operation]:
        return {op.oid: op for op in self.walk()}

    @cached_property
    def tensors(self) -> tuple[Value, ...]:
        return tuple(a for a in self.args if isinstance(a.type, TensorType))

    @cached_property
    def scalars(self) -> tuple[Value, ...]:
        return tuple(a for a in self.args if isinstance(a.type, TileType))

    # -- the eight parts ------------------------------------------------
    @cached_property
    def analysis(self) -> Any:
        """Static semantics (anchors, frontiers, Active sets, nest), computed once."""
        from .analysis import analyze

        return analyze(self)

    @property
    def E(self) -> Any:
        return self.analysis.nest

    @property
    def R(self) -> tuple[Operation, ...]:
        return tuple(op for op in self.walk() if op.regions)

    @property
    def G(self) -> tuple[Operation, ...]:
        return tuple(op for op in self.walk() if op.name != "yield")

    @property
    def M(self) -> tuple[Operation, ...]:
        return tuple(op for op in self.walk() if op.name == "memory.alloc")

    @property
    def L(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for op in self.walk():
            for key in ("map", "layout", "origin"):
                if key in op.attrs:
                    out[f"{op.name}#{op.oid}.{key}"] = op.attrs[key]
            ex = op.attr("exec")
            if ex is not None and getattr(ex, "layout", None) is not None:
                out[f"{op.name}#{op.oid}.exec"] = ex.layout
            for r in op.results:
                if isinstance(r.type, MemoryType):
                    out[f"{r.name}.layout"] = r.type.layout
        return out

    @property
    def A(self) -> dict[int, Any]:
        return {op.oid: (op.attr("policy"), op.attr("contracts"))
                for op in self.walk() if op.name == "reduce"}

    @property
    def Pi(self) -> dict[int, Any]:
        return {op.oid: op.attr("policy") for op in self.walk() if op.name == "pipeline"}

    @property
    def C(self) -> dict[str, Any]:
        return {
            "assumptions": self.assumptions,
            "exec": {op.oid: op.attr("exec") for op in self.walk() if op.name == "parallel"},
            "guards": {op.oid: op.attr("domain").pred for op in self.walk()
                       if op.name in NEST_OPS and not op.attr("domain").is_rectangular},
        }

    def __str__(self) -> str:
        from .printer import print_program

        return print_program(self)
