"""Static semantics: the execution nest, contexts, anchors, frontiers, Active sets.

Definitions (see ``spec/execution.md``):

* The **execution nest** is the tree of ``parallel`` levels; level 0 is the
  kernel root (a one-point domain). ``P_j`` is the product of the domains on the
  path from the root to level ``j``.
* The **context** of an op is ``C = (P, T)`` plus its reduction path ``R``: ``P``
  is the path of enclosing ``parallel`` levels, ``T`` the enclosing temporal
  regions (serial, pipeline and its stage, while, if), ``R`` the enclosing
  ``reduce`` regions.
* **frontier(op)** = the innermost enclosing ``parallel`` level.
* **anchor(op)** = the least prefix consistent with the op's inputs: the
  deepest level among the anchors of its operands (including data-dependent
  index values) and the levels whose coordinate variables occur free in its
  attributes; ``per(h, x)`` adds ``h``'s level. Temporal coordinates do not
  deepen the anchor. A region's results keep the anchors of their incoming
  values (assignment keeps the ancestor anchor). Always ``anchor <= frontier``.
* **Active(op)** = the IndexSet over ``P_frontier``: the conjunction of the
  enclosing ``parallel`` domains (with their predicates).
* A ``parallel`` region result is a **collective update** of an ancestor value;
  each is classified ``collective`` (the yielded value is anchored above the
  level: one logical update shared by the children) or ``per-child`` (children
  contribute patches that are joined).
* A Memory's **owner** is the frontier of its ``memory.alloc``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import expr as E
from .ir import Block, Operation, TileProgram
from .space import IndexSet, Space
from .types import MemoryType, TileType


@dataclass(frozen=True)
class Level:
    """One ``parallel`` level of the nest (id 0 = kernel root)."""

    id: int
    parent: int
    depth: int
    domain: IndexSet
    op: int  # oid of the parallel op (-1 for root)
    exec: Any = None


@dataclass
class Nest:
    """The execution nest ``E``: levels and their ancestry."""

    levels: dict[int, Level]

    def path(self, level: int) -> list[int]:
        """Level ids from the root to ``level`` (inclusive)."""
        out = []
        while True:
            out.append(level)
            if level == 0:
                break
            level = self.levels[level].parent
        return out[::-1]

    def depth(self, level: int) -> int:
        return self.levels[level].depth

    def is_ancestor(self, a: int, b: int) -> bool:
        """``a`` is ``b`` or an ancestor of ``b``."""
        return a in self.path(b)

    def prefix(self, level: int) -> IndexSet:
        """``P_level``: the product of the domains on the path, as one IndexSet."""
        space = Space()
        vars_: tuple[str, ...] = ()
        pred: E.Pred = E.TRUE
        for lid in self.path(level)[1:]:
            d = self.levels[lid].domain
            space = space.concat(d.space)
            vars_ = vars_ + d.vars
            pred = E.pand(pred, d.pred)
        return IndexSet(space, vars_, pred)


@dataclass
class Context:
    """``C = (P, T)`` and ``R`` of one op (region oids, outermost first)."""

    P: tuple[int, ...]
    T: tuple[int, ...]
    R: tuple[int, ...]


@dataclass
class Analysis:
    nest: Nest
    anchor: dict[int, int] = field(default_factory=dict)
    frontier: dict[int, int] = field(default_factory=dict)
    context: dict[int, Context] = field(default_factory=dict)
    value_anchor: dict[str, int] = field(default_factory=dict)
    var_level: dict[str, int] = field(default_factory=dict)
    ancestor_updates: dict[int, tuple[str, ...]] = field(default_factory=dict)
    owner: dict[str, int] = field(default_factory=dict)

    def active(self, oid: int) -> IndexSet:
        return self.nest.prefix(self.frontier[oid])

    def describe(self, oid: int) -> str:
        return f"anchor=L{self.anchor[oid]} frontier=L{self.frontier[oid]}"


_TEMPORAL = ("serial", "pipeline", "stage", "while", "if", "reduce")


def analyze(p: TileProgram) -> Analysis:
    """Compute the static semantics of ``p`` (done once per program)."""
    root = Level(0, 0, 0, IndexSet(Space(), ()), -1)
    a = Analysis(Nest({0: root}))
    for v in p.args:
        a.value_anchor[v.name] = 0
    _Walker(a).block(p.body, (0,), (), ())
    return a


class _Walker:
    def __init__(self, a: Analysis):
        self.a = a

    def deeper(self, x: int, y: int) -> int:
        n = self.a.nest
        return x if n.depth(x) >= n.depth(y) else y

    def leaves_anchor(self, x: Any, start: int) -> int:
        lvl = start
        for leaf in _leaves(x):
            if isinstance(leaf, E.Var):
                lv = self.a.var_level.get(leaf.name)
                if lv is not None:
                    lvl = self.deeper(lvl, lv)
            elif isinstance(leaf, E.Val):
                lv = self.a.value_anchor.get(leaf.name)
                if lv is not None:
                    lvl = self.deeper(lvl, lv)
        return lvl

    def block(self, b: Block, P: tuple[int, ...], T: tuple[int, ...], R: tuple[int, ...],
              ctl: int = 0) -> None:
        for op in b.ops:
            self.op(op, P, T, R, ctl)

    def op(self, op: Operation, P: tuple[int, ...], T: tuple[int, ...],
           R: tuple[int, ...], ctl: int = 0) -> None:
        """``ctl``: the anchor of the enclosing dynamic conditions (control
        dependence: an op executed only where a per-instance condition holds is
        itself per-instance)."""
        a = self.a
        frontier = P[-1]
        anchor = ctl
        for o in op.operands:
            anchor = self.deeper(anchor, a.value_anchor.get(o.name, 0))
        for k, v in op.attrs.items():
            if k in ("vars", "domain") and op.regions:
                # the region's own coordinates; its domain may use outer ones
                anchor = self.leaves_anchor(v.pred if k == "domain" else (), anchor) \
                    if k == "domain" else anchor
                if k == "domain":
                    for f in v.space.factors:
                        anchor = self.leaves_anchor(f.extent, anchor)
                continue
            anchor = self.leaves_anchor(v, anchor)
        if op.name == "per":
            anchor = self.deeper(anchor, op.attrs["level"])
        a.context[op.oid] = Context(P, T, R)
        a.frontier[op.oid] = frontier
        if op.name == "parallel":
            lid = op.attrs["level"]
            dom = op.attrs["domain"]
            a.nest.levels[lid] = Level(lid, frontier, len(P), dom, op.oid, op.attr("exec"))
            for v in op.attrs["vars"]:
                a.var_level[v] = lid
            body = op.regions[0]
            for arg, inc in zip(body.args, op.operands, strict=False):
                a.value_anchor[arg.name] = a.value_anchor.get(inc.name, 0)
            self.block(body, P + (lid,), T, R, ctl)
            kinds = []
            y = body.terminator
            for v in (y.operands if y else ()):
                va = a.value_anchor.get(v.name, 0)
                kinds.append("collective" if a.nest.depth(va) < a.nest.depth(lid)
                             else "per-child")
            a.ancestor_updates[op.oid] = tuple(kinds)
            for inc, r in zip(op.operands, op.results, strict=True):
                a.value_anchor[r.name] = self.deeper(a.value_anchor.get(inc.name, 0), frontier)
        elif op.regions:
            for v in op.attr("vars", ()) or ():
                a.var_level[v] = anchor  # temporal coords do not deepen anchors
            inner_T = T + (op.oid,) if op.name in _TEMPORAL and op.name != "reduce" else T
            inner_R = R + (op.oid,) if op.name == "reduce" else R
            carried = [] if op.name == "if" else list(op.operands)
            state = [a.value_anchor.get(o.name, 0) for o in carried]
            for _ in range(8):  # fixpoint: a state's anchor is the deepest definition's
                inner_ctl = anchor if op.name == "if" else ctl
                for reg in op.regions:
                    for arg, sa in zip(reg.args, state, strict=False):
                        a.value_anchor[arg.name] = sa
                    self.block(reg, P, inner_T, inner_R, inner_ctl)
                    if op.name == "while" and reg is op.regions[0] and reg.terminator is not None:
                        cy = reg.terminator.operands[0]
                        inner_ctl = self.deeper(ctl, a.value_anchor.get(cy.name, 0))
                body = op.regions[-1]
                y = body.terminator
                new = list(state)
                if op.name not in ("stage", "map") and y is not None and carried:
                    new = [self.deeper(s_, a.value_anchor.get(v.name, 0))
                           for s_, v in zip(state, y.operands, strict=False)]
                if new == state:
                    break
                state = new
            for i, r in enumerate(op.results):
                if carried and op.name not in ("stage", "map"):
                    a.value_anchor[r.name] = state[i]
                    continue
                va = anchor
                for reg in op.regions:
                    yy = reg.terminator
                    if yy is not None and i < len(yy.operands):
                        va = self.deeper(va, a.value_anchor.get(yy.operands[i].name, 0))
                a.value_anchor[r.name] = va
        else:
            # a result whose extents mention an instance's coordinates (a tile of
            # extent i + 1) differs between instances: the op is per-instance
            anchor = self.leaves_anchor(_type_leaves(op), anchor)
            for r in op.results:
                a.value_anchor[r.name] = anchor
        a.anchor[op.oid] = anchor
        if op.name == "memory.alloc":
            a.owner[op.results[0].name] = frontier


def values_read(op: Operation) -> set[str]:
    """The names of every value ``op`` reads: its operands, the values its index
    expressions and attributes mention (``E.Val``), those its result types'
    extents mention, and, for a region op, every value its blocks read (the
    types of their arguments included) that they do not define."""
    out = {o.name for o in op.operands}
    for v in op.attrs.values():
        out.update(lf.name for lf in attr_leaves(v) if isinstance(lf, E.Val))
    out.update(lf.name for lf in _type_leaves(op) if isinstance(lf, E.Val))
    for r in op.regions:
        inner: set[str] = set()
        own = {a.name for a in r.args}
        inner.update(lf.name for a in r.args for lf in _value_type_leaves(a.type)
                     if isinstance(lf, E.Val))
        for o in r.ops:
            inner |= values_read(o)
            own.update(x.name for x in o.results)
        out |= inner - own
    return out


def _type_leaves(op: Operation) -> list[E.Expr]:
    """The free leaves of the extents (and Memory layouts) of ``op``'s result types."""
    return [lf for r in op.results for lf in _value_type_leaves(r.type)]


def _value_type_leaves(t: Any) -> list[E.Expr]:
    """The free leaves of the extents (and Memory layout) of the type ``t``."""
    if isinstance(t, TileType):
        return attr_leaves(t.extents)
    if isinstance(t, MemoryType):
        own = set(t.layout.vars)
        return [lf for lf in attr_leaves(t.space.extents) +
                attr_leaves((t.layout.size, t.layout.offset))
                if not (isinstance(lf, E.Var) and lf.name in own)]
    return []


def _leaves(x: Any) -> list[E.Expr]:
    """Free leaves of an attribute value (see :func:`attr_leaves`)."""
    return attr_leaves(x)


def attr_leaves(x: Any) -> list[E.Expr]:
    """The free index leaves of an attribute value: expressions, tuples of them,
    an IndexSet (its own variables are bound by it) and an exec layout map (its
    inputs are bound by it)."""
    if isinstance(x, (E.Expr, E.Pred)):
        return list(E.leaves(x))
    if isinstance(x, (tuple, list)):
        return [lf for i in x for lf in attr_leaves(i)]
    if isinstance(x, IndexSet):
        own = set(x.vars)
        return [lf for lf in attr_leaves(x.pred) + attr_leaves(x.space.extents)
                if not (isinstance(lf, E.Var) and lf.name in own)]
    lay = getattr(x, "layout", None)
    if lay is not None and hasattr(lay, "outputs"):
        own = set(lay.inputs)
        return [lf for lf in attr_leaves(lay.outputs)
                if not (isinstance(lf, E.Var) and lf.name in own)]
    return []
