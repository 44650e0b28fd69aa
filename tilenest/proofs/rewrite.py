"""Mechanical IR rewriting for admitted transforms.

When ``tau`` (new coordinates -> old coordinates) is proved bijective and every
observed cut factors, the dependent maps are rewritten by substitution
(``tile/execution.md``, "Execution transform calculus"):

    Access'   = Access o (tau x id)      every index expression, predicate,
                                         view map, domain and layout mentioning
                                         an old coordinate gets tau substituted
    anchor'   = rho(anchor)              ``per`` ops name rho of their level;
    frontier' = rho(frontier)            ops are placed in the level rho(frontier)

Anchors and frontiers are not stored in TileIR (the analysis infers them), so
the substitution plus placement *is* the rewrite; ``remap.py`` then checks the
re-inferred anchors and frontiers against ``rho``. Everything here is pure
plumbing: immutable ops are rebuilt (STYLE #4), values keep their names unless
their type changes, and fresh names never collide with existing ones.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ..semantics import expr as E
from ..semantics.ioschema import number_ops
from ..semantics.ir import Block, FrozenDict, Operation, TileProgram, Value
from ..semantics.maps import Map, MemLayout
from ..semantics.policies import ExecPolicy
from ..semantics.space import Dim, DimFactor, IndexSet, Space
from ..semantics.types import MemoryType, TileType, Type

if TYPE_CHECKING:
    from .obligation import Obligation

_uid = itertools.count()


def fresh_dim(label: str) -> Dim:
    """A new dim identity for a compiler-created nest axis."""
    return Dim(("proof", next(_uid)), label)


class Names:
    """Fresh variable and value names for one program."""

    def __init__(self, p: TileProgram):
        self.used: set[str] = set()
        for op in p.walk():
            self.used.update(op.attr("vars", ()) or ())
            for r in op.results:
                self.used.add(r.name)
            for reg in op.regions:
                self.used.update(a.name for a in reg.args)
        self.used.update(a.name for a in p.args)

    def fresh(self, base: str) -> str:
        name = base
        k = 0
        while name in self.used:
            k += 1
            name = f"{base}_{k}"
        self.used.add(name)
        return name


# ---------------------------------------------------------------------------
# substitution inside attributes and types


def subst_any(x: Any, m: Mapping[E.Expr, E.Expr]) -> Any:
    """Substitute coordinates in any attribute value (expressions, predicates,
    index sets, maps, exec policies, tuples); other values are returned as is.
    A binder's own variables (an IndexSet's or Map's inputs) are never replaced."""
    if not m:
        return x
    if isinstance(x, (E.Expr, E.Pred)):
        return E.subst(x, m)
    if isinstance(x, IndexSet):
        inner = {k: v for k, v in m.items() if not (isinstance(k, E.Var) and k.name in x.vars)}
        sp = Space(tuple(DimFactor(f.dim, E.subst(f.extent, inner)) for f in x.space.factors))
        return IndexSet(sp, x.vars, E.subst(x.pred, inner))
    if isinstance(x, Map):
        inner = {k: v for k, v in m.items() if not (isinstance(k, E.Var) and k.name in x.inputs)}
        return Map(x.inputs, tuple(E.subst(o, inner) for o in x.outputs))
    if isinstance(x, ExecPolicy):
        return x if x.layout is None else ExecPolicy(x.scope, subst_any(x.layout, m))
    if isinstance(x, tuple) and x and all(isinstance(i, (E.Expr, E.Pred)) for i in x):
        return tuple(E.subst(i, m) for i in x)
    return x


def subst_type(t: Type, m: Mapping[E.Expr, E.Expr]) -> Type:
    if not m:
        return t
    if isinstance(t, TileType):
        return TileType(t.dtype, Space(tuple(DimFactor(f.dim, E.subst(f.extent, m))
                                             for f in t.space.factors)))
    if isinstance(t, MemoryType):
        inner = {k: v for k, v in m.items()
                 if not (isinstance(k, E.Var) and k.name in t.layout.vars)}
        lay = MemLayout(t.layout.vars, E.subst(t.layout.offset, inner),
                        E.subst(t.layout.size, inner))
        sp = Space(tuple(DimFactor(f.dim, E.subst(f.extent, m)) for f in t.space.factors))
        return MemoryType(t.dtype, sp, lay, t.resource)
    return t


class Rebuilder:
    """Rebuilds blocks with a coordinate substitution, a level renaming and a
    value renaming (values whose type changes get the new type, same name)."""

    def __init__(self, m: Mapping[E.Expr, E.Expr], levels: Mapping[int, int] | None = None,
                 values: dict[str, Value] | None = None):
        self.m = dict(m)
        self.levels = dict(levels or {})
        self.values: dict[str, Value] = values if values is not None else {}

    def value(self, v: Value) -> Value:
        return self.values.get(v.name, v)

    def define(self, v: Value) -> Value:
        t = subst_type(v.type, self.m)
        nv = v if t == v.type else Value(v.name, t)
        if nv is not v:
            self.values[v.name] = nv
        return nv

    def op(self, o: Operation) -> Operation:
        attrs = {k: subst_any(v, self.m) for k, v in o.attrs.items()}
        if o.name == "per" and attrs.get("level") in self.levels:
            attrs["level"] = self.levels[attrs["level"]]
        operands = tuple(self.value(v) for v in o.operands)
        regions = tuple(self.block(r) for r in o.regions)
        results = tuple(self.define(r) for r in o.results)
        return o.replace(attrs=FrozenDict(attrs), operands=operands, results=results,
                         regions=regions)

    def block(self, b: Block) -> Block:
        args = tuple(self.define(a) for a in b.args)
        return Block(args, tuple(self.op(o) for o in b.ops))


# ---------------------------------------------------------------------------
# program surgery


def replace_op(p: TileProgram, oid: int, fn: Callable[[Operation], list[Operation]],
               extra_dims: Iterable[Dim] = ()) -> TileProgram:
    """``p`` with the op ``oid`` replaced by the ops ``fn(op)`` in its block
    (ops keep their old ``oid`` until :func:`finish` renumbers them)."""

    def block(b: Block) -> Block:
        out: list[Operation] = []
        for o in b.ops:
            if o.oid == oid:
                out.extend(fn(o))
            elif o.regions:
                out.append(o.replace(regions=tuple(block(r) for r in o.regions)))
            else:
                out.append(o)
        return Block(b.args, tuple(out))

    dims = tuple(p.dims) + tuple(d for d in extra_dims if d not in p.dims)
    return TileProgram(p.name, p.args, p.syms, p.assumptions, dims, block(p.body),
                       p.reducers, p.loc)


def replace_ops(p: TileProgram, ops: Mapping[int, Operation]) -> TileProgram:
    """``p`` with each op whose oid is a key replaced (whole subtree) by its value."""

    def block(b: Block) -> Block:
        out: list[Operation] = []
        for o in b.ops:
            if o.oid in ops:
                out.append(ops[o.oid])
            elif o.regions:
                out.append(o.replace(regions=tuple(block(r) for r in o.regions)))
            else:
                out.append(o)
        return Block(b.args, tuple(out))

    return TileProgram(p.name, p.args, p.syms, p.assumptions, p.dims, block(p.body),
                       p.reducers, p.loc)


def finish(p: TileProgram) -> tuple[TileProgram, dict[int, int]]:
    """Renumber ops in pre-order; returns the program and ``new oid -> old oid``
    for every op that existed before (new structural ops have negative oids)."""
    before = [o.oid for o in p.walk()]
    q = number_ops(p)
    after = [o.oid for o in q.walk()]
    return q, {n: o for n, o in zip(after, before, strict=True) if o >= 0}


def max_level(p: TileProgram) -> int:
    return max([0] + [o.attrs["level"] for o in p.walk() if o.name == "parallel"])


def parallel_op(vars_: tuple[str, ...], domain: IndexSet, level: int, body: Block,
                operands: tuple[Value, ...], results: tuple[Value, ...],
                exec_: ExecPolicy | None, loc: Any) -> Operation:
    attrs: dict[str, Any] = {"vars": vars_, "domain": domain, "level": level}
    if exec_ is not None:
        attrs["exec"] = exec_
    return Operation("parallel", operands, results, FrozenDict(attrs), (body,), loc, -1)


def with_yield(ops: list[Operation], values: tuple[Value, ...], loc: Any) -> Block:
    return Block((), tuple(ops) + (Operation("yield", values, (), FrozenDict(), (), loc, -1),))


def verified(q: TileProgram, sites: tuple) -> "Obligation":
    """The ``rewrite`` obligation of a transform: the rewritten program ``q``
    passes the verifier (refuted with the verifier's message)."""
    from ..errors import TilenestError
    from .obligation import PROVED, REFUTED, Obligation
    from ..semantics.verify import verify

    ob = Obligation("rewrite", "the fused program verifies", sites, formula_text="verify(P')")

    def decide(o: Obligation, timeout: float) -> None:
        try:
            verify(q)
            o.set(PROVED, "structural")
        except TilenestError as e:
            o.set(REFUTED, "structural", e.message)

    ob.decider = decide
    return ob
