"""The TileIR verifier.

Checks, in this fixed order (STYLE #2): (1) structure -- every op is registered,
has its attributes, operand count and regions, and every region ends with a
matching ``yield``; (2) SSA -- every value is defined once and used only where
its definition is visible (earlier in an enclosing block), including values
referenced from index expressions; every index variable is bound and every
symbol is a program parameter; (3) types -- each op's result types are
recomputed with its type rule; (4) region rules -- carried states keep their
types, reduce contracts match the states, pipeline bodies are stage sequences,
memory-state flow (no read before a definite store, no stale state), memory
layouts injective and in range where decidable; (5) static semantics --
``anchor <= frontier`` for every op.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from ..errors import TilenestError, VerifyError
from . import expr as E
from .ir import Block, Operation, TileProgram, Value
from .maps import MemLayout
from .ops import REGISTRY, infer_types
from .space import IndexSet
from .types import MemoryType, StateType, TileType

#: largest domain the verifier enumerates to decide layout injectivity
ENUMERATION_BUDGET = 1 << 20

_NEST = ("parallel", "serial", "pipeline", "reduce")


def verify(p: TileProgram) -> None:
    """Raise :class:`VerifyError` (or a TypeCheckError) on the first violation."""
    v = _Verifier(p)
    v.run()
    check_exec_nesting(p)
    # static semantics
    an = p.analysis
    for op in p.walk():
        a, f = an.anchor.get(op.oid), an.frontier.get(op.oid)
        if a is not None and f is not None and not an.nest.is_ancestor(a, f):
            raise VerifyError(f"'{op.name}' is anchored at level {a}, not above its frontier {f}",
                              op.loc)


class _Verifier:
    def __init__(self, p: TileProgram):
        self.p = p
        self.defined: set[str] = set()
        self.syms = set(p.syms)

    def fail(self, op: Operation | None, msg: str, hint: str | None = None) -> VerifyError:
        return VerifyError(msg, op.loc if op is not None else self.p.loc, hint)

    def run(self) -> None:
        scope: list[set[str]] = [set(a.name for a in self.p.args)]
        for a in self.p.args:
            self._define(a, None)
        for pr in self.p.assumptions:
            for leaf in E.leaves(pr):
                if not isinstance(leaf, E.Sym) or leaf.name not in self.syms:
                    raise self.fail(None, f"assumption mentions '{E.to_str(leaf)}', "
                                          "not a kernel parameter")
        self.check_levels()
        self.block(self.p.body, scope, frozenset(), top=True)
        _MemoryFlow(self.p).run()

    def _define(self, v: Value, op: Operation | None) -> None:
        if v.name in self.defined:
            raise self.fail(op, f"value %{v.name} is defined twice")
        self.defined.add(v.name)

    def check_levels(self) -> None:
        """Parallel levels are distinct positive ids (the nest is a tree)."""
        seen: set[int] = set()
        for op in self.p.walk():
            if op.name == "parallel":
                lv = op.attrs["level"]
                if lv < 1 or lv in seen:
                    raise self.fail(op, f"parallel level {lv} is not a fresh positive id",
                                    "every parallel region declares its own level")
                seen.add(lv)
            for r in op.regions:
                for inner in r.ops:
                    if inner.name == "stage" and op.name != "pipeline":
                        raise self.fail(inner, "a stage op may only appear directly in a "
                                               "pipeline body")
        for op in self.p.body.ops:
            if op.name == "stage":
                raise self.fail(op, "a stage op may only appear directly in a pipeline body")

    def block(self, b: Block, scope: list[set[str]], vars_: frozenset[str], top: bool = False
              ) -> None:
        local: set[str] = set()
        scope = scope + [local]
        for a in b.args:
            self._define(a, None)
            local.add(a.name)
        for i, op in enumerate(b.ops):
            if op.name == "yield" and i != len(b.ops) - 1:
                raise self.fail(op, "yield must be the last op of its region")
            self.op(op, scope, vars_)
            for r in op.results:
                self._define(r, op)
                local.add(r.name)
        if not top and b.terminator is None:
            raise self.fail(None, "a region must end with yield")

    def visible(self, name: str, scope: list[set[str]]) -> bool:
        return any(name in s for s in scope)

    def op(self, op: Operation, scope: list[set[str]], vars_: frozenset[str]) -> None:
        d = REGISTRY.get(op.name)
        if d is None:
            raise self.fail(op, f"unknown op '{op.name}'")
        # (1) structure
        for n, _ in d.attrs:
            if n not in op.attrs:
                raise self.fail(op, f"'{op.name}' lacks attribute '{n}'")
        allowed = {n for n, _ in d.all_attrs()}
        for n in op.attrs:
            if n not in allowed:
                raise self.fail(op, f"'{op.name}' has unknown attribute '{n}'")
        lo, hi = d.operands
        if len(op.operands) < lo or (hi is not None and len(op.operands) > hi):
            raise self.fail(op, f"'{op.name}' takes {lo}..{hi} operands, got {len(op.operands)}")
        if len(op.regions) != d.regions:
            raise self.fail(op, f"'{op.name}' needs {d.regions} region(s)")
        # (2) SSA and bound index variables
        for o in op.operands:
            if not self.visible(o.name, scope):
                raise self.fail(op, f"%{o.name} is used by '{op.name}' where its definition "
                                    "is not visible")
        own = frozenset(op.attr("vars", ()) or ())
        inner_vars = vars_ | own if op.regions else vars_
        allowed = vars_ if op.regions else vars_ | own
        for k, v in op.attrs.items():
            for leaf in _leaves(v):
                if isinstance(leaf, E.Var) and leaf.name not in allowed:
                    raise self.fail(op, f"index variable ${leaf.name} in '{op.name}' "
                                        f"attribute '{k}' is not bound here")
                if isinstance(leaf, E.Sym) and leaf.name not in self.syms:
                    raise self.fail(op, f"symbol '{leaf.name}' is not a kernel parameter")
                if isinstance(leaf, E.Val) and not self.visible(leaf.name, scope):
                    raise self.fail(op, f"%{leaf.name} is used in an index of '{op.name}' "
                                        "where its definition is not visible")
        # (3) types
        hint = tuple(r.type for r in op.results)
        try:
            got = infer_types(op.name, tuple(o.type for o in op.operands), op.attrs, hint)
        except TilenestError as e:
            raise e.with_site(op.loc) from None
        if tuple(got) != hint:
            raise self.fail(op, f"'{op.name}' result types do not match its type rule")
        # (4) regions
        for r in op.regions:
            self.block(r, scope, inner_vars)
        self.region_rules(op)

    def region_rules(self, op: Operation) -> None:
        n = op.name
        if n in _NEST or n == "while":
            body = op.regions[-1]
            if len(body.args) != len(op.operands):
                raise self.fail(op, f"'{n}' body needs one argument per carried value")
            y = body.terminator
            assert y is not None
            if tuple(v.type for v in y.operands) != tuple(o.type for o in op.operands):
                raise self.fail(op, f"'{n}' body yields values whose types differ from the "
                                    "carried values")
            for a, o in zip(body.args, op.operands, strict=True):
                if a.type != o.type:
                    raise self.fail(op, f"'{n}' argument %{a.name} has the wrong type")
            if n in _NEST:
                dom = op.attrs["domain"]
                if tuple(dom.vars) != tuple(op.attrs["vars"]):
                    raise self.fail(op, f"'{n}' domain variables differ from its vars")
        if n == "while":
            cy = op.regions[0].terminator
            if cy is None or len(cy.operands) != 1 or cy.operands[0].type != TileType(
                    _bool()):
                raise self.fail(op, "while condition region must yield one bool scalar")
        if n == "reduce":
            if len(op.attrs["contracts"]) != len(op.operands):
                raise self.fail(op, "reduce needs one contract entry per state")
            from .contracts import check_reduce

            check_reduce(self.p, op)
        if n == "serial" and op.attrs["order"] not in ("forward", "reverse"):
            raise self.fail(op, f"unknown serial order {op.attrs['order']!r}",
                            "use 'forward' or 'reverse'")
        if n == "pipeline":
            pol = op.attrs["policy"]
            if pol.window < 0 or pol.interval < 1:
                raise self.fail(op, f"pipeline policy window={pol.window}, interval="
                                    f"{pol.interval}: the window must be >= 0 and the "
                                    "interval >= 1")
            stages = [o for o in op.regions[0].ops if o.name == "stage"]
            if [s.attrs["ordinal"] for s in stages] != list(range(len(stages))):
                raise self.fail(op, "pipeline stage ordinals must be 0, 1, ... in order")
        if n == "pipeline":
            body = op.regions[0]
            kinds = {o.name for o in body.ops[:-1]}
            if "stage" in kinds and kinds != {"stage"}:
                raise self.fail(op, "a pipeline with stages holds only stage ops")
            names = [o.attrs["name"] for o in body.ops if o.name == "stage"]
            if len(set(names)) != len(names):
                raise self.fail(op, "pipeline stage names must be unique")
        if n in ("stage", "if", "map"):
            for r in op.regions:
                y = r.terminator
                if n == "map":
                    continue
                if y is None or tuple(v.type for v in y.operands) != tuple(
                        x.type for x in op.results):
                    raise self.fail(op, f"'{n}' region yields do not match its results")
        if n == "memory.alloc":
            check_layout(op.results[0].type, op)


#: scope -> the scopes it strictly contains, in every target family that has both
#: (CUDA-like cluster > block > warp > thread; Metal threadgroup(block) > simdgroup(warp)
#: > thread; CPU core > vector). Unrelated pairs are left to the target binder.
_CONTAINS = {
    "cluster": {"block", "warp", "subgroup", "thread"},
    "block": {"warp", "subgroup", "thread"},
    "warp": {"thread"},
    "subgroup": {"thread"},
    "core": {"vector"},
}


def check_exec_nesting(p: TileProgram) -> None:
    """A nested ``parallel`` constrained to a scope that contains its ancestor's
    scope (e.g. a block inside a warp) cannot be realized by any target."""
    def walk(b: Block, outer: list[Operation]) -> None:
        for op in b.ops:
            inner = outer
            if op.name == "parallel":
                ex = op.attr("exec")
                sc = ex.scope if ex is not None else None
                if sc and sc != "infer":
                    for anc in outer:
                        asc = anc.attrs["exec"].scope
                        if sc == asc and sc not in ("thread", "vector"):
                            continue
                        if asc in _CONTAINS.get(sc, set()):
                            raise VerifyError(
                                f"a parallel bound to '{sc}' is nested inside one bound to "
                                f"'{asc}', but a {asc} cannot contain a {sc}",
                                tuple(s for s in (op.loc, anc.loc) if s is not None),
                                f"swap the constraints, or bind the outer level to a scope "
                                f"that contains '{sc}'")
                    inner = outer + [op]
            for r in op.regions:
                walk(r, inner)

    walk(p.body, [])


def _bool() -> Any:
    from .dtypes import bool_

    return bool_


def _leaves(x: Any) -> list[E.Expr]:
    from .analysis import attr_leaves

    return attr_leaves(x)


def check_layout(mt: MemoryType, op: Operation) -> None:
    """Whole-tile storage needs an injective, in-range layout. Decided exactly by
    enumeration when all extents are constant and small; otherwise left as a
    proof obligation (``tilenest check``)."""
    lay: MemLayout = mt.layout
    ext = mt.space.extents
    if not all(isinstance(x, E.Const) for x in ext):
        return
    n = int(np.prod([x.value for x in ext])) if ext else 1
    if n == 0 or n > ENUMERATION_BUDGET:
        return
    if any(isinstance(lf, (E.Sym, E.Val)) for lf in E.leaves(lay.offset)):
        return
    grids = np.meshgrid(*[np.arange(x.value) for x in ext], indexing="ij")
    env = {E.Var(v): g.ravel().astype(np.int64) for v, g in zip(lay.vars, grids, strict=True)}
    off = np.asarray(E.evaluate(lay.offset, env)) * np.ones(n, dtype=np.int64)
    size = lay.size.value if isinstance(lay.size, E.Const) else None
    if size is not None and (off.min() < 0 or off.max() >= size):
        bad = int(np.argmax((off < 0) | (off >= size)))
        coords = tuple(int(g.ravel()[bad]) for g in grids)
        raise VerifyError(
            f"memory layout maps element {coords} to offset {int(off[bad])}, outside its "
            f"size {size}", op.loc, "enlarge the layout's size or fix its strides")
    order = np.argsort(off, kind="stable")
    s = off[order]
    dup = np.nonzero(s[1:] == s[:-1])[0]
    if dup.size:
        i, j = order[dup[0]], order[dup[0] + 1]
        ci = tuple(int(g.ravel()[i]) for g in grids)
        cj = tuple(int(g.ravel()[j]) for g in grids)
        raise VerifyError(
            f"memory layout is not injective: elements {ci} and {cj} share offset {int(s[dup[0]])}",
            op.loc, "whole-tile Memory storage needs a one-to-one layout (check strides/swizzle)")


class _MemoryFlow:
    """MemoryState rules: every load/store uses the *current* state of its
    memory (no stale reuse), and a load's state is definitely initialized.
    A state is *init* after a store; a region result is init iff its body's
    yielded state is init and, for loops that may run zero times, its incoming
    state was init too."""

    def __init__(self, p: TileProgram):
        self.p = p
        self.init: dict[str, bool] = {}
        self.current: dict[str, str] = {}  # memory name -> current state name
        self.state_of: dict[str, str] = {}  # state name -> memory name
        self.alias: dict[str, str] = {}  # memory handle passed through a stage -> original

    def root(self, name: str) -> str:
        while name in self.alias:
            name = self.alias[name]
        return name

    def run(self) -> None:
        self.block(self.p.body, {})

    def block(self, b: Block, current: dict[str, str]) -> dict[str, str]:
        for op in b.ops:
            self.op(op, current)
        return current

    def _state(self, v: Value) -> str | None:
        return v.type.memory if isinstance(v.type, StateType) else None

    def op(self, op: Operation, cur: dict[str, str]) -> None:
        n = op.name
        if n == "memory.alloc":
            m, s = op.results
            cur[m.name] = s.name
            self.init[s.name] = False
            return
        if n in ("memory.store", "memory.load"):
            m, s = op.operands[0], op.operands[1]
            mname = self.root(m.name)
            if cur.get(mname) != s.name:
                raise VerifyError(
                    f"'{n}' uses state %{s.name} of %{m.name}, which is stale "
                    f"(the current state is %{cur.get(mname)})", op.loc,
                    "each store defines a new state; later accesses must use it")
            if n == "memory.load" and not self.init.get(s.name, True):
                raise VerifyError(
                    f"memory %{m.name} is read before a definite store", op.loc,
                    "store to the memory first on every path (a store inside a loop that may "
                    "run zero times does not count)")
            if n == "memory.store":
                cur[mname] = op.results[0].name
                self.init[op.results[0].name] = True
            return
        if not op.regions:
            return
        # region: states passed as operands
        st_ops = [(i, o) for i, o in enumerate(op.operands) if isinstance(o.type, StateType)]
        for _, o in st_ops:
            mem = o.type.memory
            if cur.get(mem) != o.name:
                raise VerifyError(f"'{n}' passes stale state %{o.name} of %{mem}", op.loc)
        may_skip = self._may_skip(op)
        results_init: dict[int, bool] = {}
        for r in op.regions:
            inner = dict(cur)
            args = r.args
            operand_base = 1 if n == "if" else 0
            if n != "if":
                for i, o in st_ops:
                    a = args[i - operand_base] if i - operand_base < len(args) else None
                    if a is not None:
                        inner[o.type.memory] = a.name
                        self.init[a.name] = self.init.get(o.name, True)
            self.block(r, inner)
            y = r.terminator
            if y is None:
                continue
            for i, _o in st_ops:
                if n == "if":
                    continue
                yv = y.operands[i]
                results_init[i] = results_init.get(i, True) and self.init.get(yv.name, True)
            if n == "if":
                for i, yv in enumerate(y.operands):
                    if isinstance(yv.type, StateType):
                        results_init[i] = results_init.get(i, True) and self.init.get(
                            yv.name, True)
        for i, r in enumerate(op.results):
            if isinstance(r.type, MemoryType) and op.regions:
                y = op.regions[0].terminator
                if y is not None and i < len(y.operands):
                    self.alias[r.name] = self.root(y.operands[i].name)
            if not isinstance(r.type, StateType):
                continue
            mem = r.type.memory
            cur[mem] = r.name
            ok = results_init.get(i, True)
            if n != "if" and may_skip:
                inc = op.operands[i]
                ok = ok and self.init.get(inc.name, True)
            self.init[r.name] = ok

    def _may_skip(self, op: Operation) -> bool:
        if op.name == "while":
            return True
        if op.name not in _NEST:
            return False
        dom: IndexSet = op.attrs["domain"]
        if not dom.is_rectangular:
            return True
        ranges = {E.Sym(s): (0, None) for s in self.p.syms}
        for pr in self.p.assumptions:
            if isinstance(pr, E.Cmp) and isinstance(pr.a, E.Sym) and isinstance(pr.b, E.Const):
                lo = {">=": pr.b.value, ">": pr.b.value + 1}.get(pr.op)
                if lo is not None:
                    ranges[pr.a] = (max(lo, 0), None)
        for x in dom.space.extents:
            lo, _ = E.interval(x, ranges)
            if lo is None or lo < 1:
                return True
        return False


_ = itertools
