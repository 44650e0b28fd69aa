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

Types are checked where their values are defined: a constant extent is
non-negative (so is one of a region's domain or any other index-set
attribute), a memory layout's offset and size mention only the layout's own
variables, program symbols and visible values, and every integer constant of a
program (types, attributes, assumptions) lies in the signed 64-bit range, the
index type of every backend (:data:`~tilenest.semantics.ioschema.INT_MAX`).
A ``per`` names the level of an enclosing ``parallel``.

Programs read from text or JSON carry no ``loc`` unless one is written; their
readers pass the position of each op (``sites``, keyed by op id) so that every
diagnostic names line:col or a JSON path.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from typing import Any, cast

import numpy as np

from ..errors import Site, TilenestError, VerifyError
from . import expr as E
from .ioschema import INT_MAX, INT_MIN, ReadSite
from .ir import Block, Operation, TileProgram, Value
from .maps import MemLayout
from .ops import REGISTRY, infer_types
from .space import IndexSet, Space
from .types import MemoryType, StateType, TensorType, TileType

#: largest domain the verifier enumerates to decide layout injectivity
ENUMERATION_BUDGET = 1 << 20

_NEST = ("parallel", "serial", "pipeline", "reduce")


def _types(ts: Any) -> str:
    """A tuple of types or dtypes as the text prints them."""
    return ", ".join(str(t) for t in ts)


#: key of ``sites`` for the program itself (its header)
PROGRAM_SITE = -1


def verify(p: TileProgram, sites: Mapping[int, Site] | None = None) -> None:
    """Raise :class:`VerifyError` (or a TypeCheckError) on the first violation.

    ``sites`` maps op ids (and :data:`PROGRAM_SITE`) to where the op was read;
    an op without its own ``loc`` is reported there."""
    if sites:
        p = located(p, sites)
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


def _each_op(p: TileProgram, fn: Any, **kernel: Any) -> TileProgram:
    """``p`` with ``fn(op)`` (keyword changes of ``Operation.replace``) applied
    to every op of its body and of its reducers' blocks, nested ones
    included, and ``kernel`` applied to the program itself."""
    def block(b: Block) -> Block:
        return Block(b.args, tuple(op_(o) for o in b.ops))

    def op_(o: Operation) -> Operation:
        return o.replace(regions=tuple(block(r) for r in o.regions), **fn(o))

    reducers = tuple(dataclasses.replace(r, merge=block(r.merge),
                                         lift=None if r.lift is None else block(r.lift))
                     for r in p.reducers)
    return dataclasses.replace(p, body=block(p.body), reducers=reducers, **kernel)


def remember_sites(p: TileProgram, sites: Mapping[int, Site]) -> TileProgram:
    """``p`` with each op's and the kernel's ``read_at`` set to where a reader
    found it (``sites`` by op id, :data:`PROGRAM_SITE` for the kernel); the
    program is otherwise unchanged (equal, printed the same)."""
    return _each_op(p, lambda o: {"read_at": sites.get(o.oid, o.read_at)},
                    read_at=sites.get(PROGRAM_SITE, p.read_at))


def located(p: TileProgram, sites: Mapping[int, Site]) -> TileProgram:
    """``p`` with each op's ``loc`` replaced by ``sites[oid]`` (where it was read),
    keeping its own ``loc`` as the site's ``origin``; op ids are kept."""
    def at(key: int, own: Site | None) -> Site | None:
        site = sites.get(key)
        if site is None:
            return own
        if own is not None and isinstance(site, ReadSite):
            return dataclasses.replace(site, origin=own)
        return site

    return _each_op(p, lambda o: {"loc": at(o.oid, o.loc)}, loc=at(PROGRAM_SITE, p.loc))


def _constants(x: Any) -> list[int]:
    """Every integer constant inside an attribute value or type."""
    out: list[int] = []
    stack: list[Any] = [x]
    while stack:
        e = stack.pop()
        if isinstance(e, E.Const):
            out.append(e.value)
        elif isinstance(e, (E.Expr, E.Pred)):
            stack.extend(e.children)
        elif isinstance(e, (tuple, list)):
            stack.extend(e)
        elif isinstance(e, IndexSet):
            stack.extend(e.space.extents)
            stack.append(e.pred)
        elif isinstance(e, (TileType, TensorType)):
            stack.extend(e.space.extents)
        elif isinstance(e, MemoryType):
            stack.extend(e.space.extents)
            stack.extend((e.layout.offset, e.layout.size))
        else:
            lay = getattr(e, "layout", None)
            if lay is not None and hasattr(lay, "outputs"):
                stack.extend(lay.outputs)
    return out


class _Verifier:
    def __init__(self, p: TileProgram):
        self.p = p
        self.defined: set[str] = set()
        self.syms = set(p.syms)

    def check_ints(self, op: Operation | None, x: Any, what: str) -> None:
        for c in _constants(x):
            if not INT_MIN <= c <= INT_MAX:
                raise self.fail(op, f"{what} holds the constant {c}, outside the signed "
                                    "64-bit range of index arithmetic",
                                "index constants, extents and strides are int64")

    def check_type(self, v: Value, op: Operation | None, scope: list[set[str]],
                   vars_: frozenset[str]) -> None:
        """The type of ``v`` is well formed where ``v`` is defined."""
        t = v.type
        what = f"the type of %{v.name}"
        self.check_ints(op, t, what)
        if isinstance(t, (TileType, TensorType, MemoryType)):
            for x in t.space.extents:
                if isinstance(x, E.Const) and x.value < 0:
                    raise self.fail(op, f"{what} has the negative extent {x.value}",
                                    "an extent counts elements and is at least 0")
            exprs: list[Any] = list(t.space.extents)
            own: frozenset[str] = frozenset()
            if isinstance(t, MemoryType):
                lay = t.layout
                if len(set(lay.vars)) != len(lay.vars):
                    raise self.fail(op, f"the layout of %{v.name} names a variable twice")
                own = frozenset(lay.vars)
                exprs += [lay.offset, lay.size]
                for leaf in E.leaves(lay.size):
                    if isinstance(leaf, E.Var) and leaf.name in own:
                        raise self.fail(op, f"the layout size of %{v.name} depends on its "
                                            f"variable ${leaf.name}",
                                        "the size is one number for the whole tile")
            for x in exprs:
                for leaf in E.leaves(x):
                    if isinstance(leaf, E.Var) and leaf.name not in vars_ | own:
                        if isinstance(t, MemoryType):
                            own_list = ", ".join("$" + n for n in t.layout.vars)
                            raise self.fail(op, f"the layout of %{v.name} uses ${leaf.name}, "
                                                f"which is neither one of its variables "
                                                f"({own_list}) nor bound here",
                                            "a layout is ($a, ...) -> offset over its own "
                                            "variables, one per dim")
                        raise self.fail(op, f"{what} mentions ${leaf.name}, which is not "
                                            "bound here")
                    if isinstance(leaf, E.Sym) and leaf.name not in self.syms:
                        raise self.fail(op, f"{what} mentions '{leaf.name}', which is not a "
                                            "kernel parameter")
                    if isinstance(leaf, E.Val) and not self.visible(leaf.name, scope):
                        raise self.fail(op, f"{what} mentions %{leaf.name} where its "
                                            "definition is not visible")

    def fail(self, op: Operation | None, msg: str, hint: str | None = None) -> VerifyError:
        return VerifyError(msg, op.loc if op is not None else self.p.loc, hint)

    def run(self) -> None:
        scope: list[set[str]] = [set(a.name for a in self.p.args)]
        for a in self.p.args:
            self._define(a, None)
            self.check_type(a, None, scope, frozenset())
        self.check_ints(None, self.p.assumptions, "an assumption")
        for r in self.p.reducers:
            if len(r.identity) != len(r.state):
                raise self.fail(None, f"reducer @{r.name} has {len(r.state)} state "
                                      f"components but {len(r.identity)} identities",
                                "give one identity per state component")
            for x, dt in zip(r.identity, r.state, strict=True):
                self.element_constant(None, x, dt, f"the identity of @{r.name}")
            self.reducer_bodies(r)
        for pr in self.p.assumptions:
            for leaf in E.leaves(pr):
                if not isinstance(leaf, E.Sym) or leaf.name not in self.syms:
                    raise self.fail(None, f"assumption mentions '{E.to_str(leaf)}', "
                                          "not a kernel parameter")
        self.check_levels()
        self.levels: tuple[int, ...] = ()
        self.block(self.p.body, scope, frozenset(), top=True)
        _MemoryFlow(self.p).run()

    def reducer_bodies(self, r: Any) -> None:
        """A reducer of state ``(T_1..T_k)`` (R-11): ``merge`` takes ``2k``
        scalars ``(a_1..a_k, b_1..b_k)`` with ``a_i, b_i : T_i`` and yields
        ``k`` scalars ``T_1..T_k``; ``lift`` (when given) takes ``k`` scalars
        ``T_1..T_k`` and yields ``k`` such scalars. The bodies' ops are
        verified like any region (in a scope of their own: they see only their
        arguments)."""
        state = tuple(TileType(dt, Space()) for dt in r.state)
        k = len(state)
        for what, b, ins in (("merge", r.merge, state + state), ("lift", r.lift, state)):
            if b is None:
                continue
            y = b.terminator
            where = y if y is not None else (b.ops[-1] if b.ops else None)
            got = tuple(a.type for a in b.args)
            if got != ins:
                raise self.fail(where, f"the {what} of reducer @{r.name} takes "
                                f"({_types(got)}); a state of {k} component(s) "
                                f"({_types(state)}) needs ({_types(ins)})",
                                "a merge takes two states (a_1..a_k, b_1..b_k), a lift one")
            if y is None:
                raise self.fail(where, f"the {what} of reducer @{r.name} must end with yield")
            outs = tuple(v.type for v in y.operands)
            if outs != state:
                raise self.fail(y, f"the {what} of reducer @{r.name} yields {len(outs)} "
                                f"value(s) ({_types(outs)}), but its state has {k} "
                                f"component(s) ({_types(state)})",
                                "return one value per state component, of the state dtypes "
                                "in order")
            sub = _Verifier(self.p)
            sub.levels = ()
            sub.block(b, [set()], frozenset(), top=True)

    def reduce_contracts(self, op: Operation) -> None:
        """Each custom contract ``@c`` of ``k`` state components covers ``k``
        consecutive states of the reduce jointly (R-10, R-11: its merge
        combines the whole tuple), with the state dtypes ``T_1..T_k`` in order;
        a built-in contract covers one state."""
        contracts = list(op.attrs["contracts"])
        customs = {f"@{r.name}": r for r in self.p.reducers}
        i = 0
        while i < len(contracts):
            c = contracts[i]
            if c is None or not c.startswith("@"):
                i += 1
                continue
            red = customs.get(c)
            if red is None:
                raise self.fail(op, f"unknown reducer contract {c}",
                                "declare it with tn.reducer (a 'reducer @name' entry)")
            k = len(red.state)
            run = 1
            while i + run < len(contracts) and contracts[i + run] == c:
                run += 1
            if run % k:
                raise self.fail(
                    op, f"reducer {c} has {k} state component(s) ({_types(red.state)}) but "
                    f"covers {run} consecutive state(s) of this reduce; its merge combines "
                    f"groups of {k}",
                    f"update {k} states in the region (one per component, in order), or "
                    f"declare a reducer whose state matches the region's states")
            for j in range(run):
                v = op.operands[i + j]
                dt = getattr(v.type, "dtype", None)
                want = red.state[j % k]
                if dt != want:
                    raise self.fail(
                        op, f"state %{v.name} of this reduce is {dt}, but component "
                        f"{j % k + 1} of reducer {c} is {want}",
                        "the states a custom reducer covers have its state dtypes, in order")
            for g in range(i, i + run, k):
                self.group_dims(op, red, c, [op.operands[g + j] for j in range(k)])
            i += run

    def group_dims(self, op: Operation, red: Any, c: str, states: list[Value]) -> None:
        """The states of one group of custom reducer ``c`` are merged element by
        element of the widest (R-11): every state's dims are among the widest
        state's, and a component depends, through the merge, only on
        components whose dims are among its own (a narrower state is the
        same at every element of the dims it lacks)."""
        dims = [tuple(getattr(v.type, "dims", ())) for v in states]
        wide = max(dims, key=len)
        for v, d in zip(states, dims, strict=True):
            if not set(d) <= set(wide):
                raise self.fail(
                    op, f"state %{v.name} of reducer {c} has dims that the group's widest "
                    f"state lacks; the merge runs element by element of the widest",
                    "give the states of one reducer group the same dims, or dims that are a "
                    "subset of one state's")
        if all(d == wide for d in dims):
            return
        k = len(states)
        deps: dict[str, set[int]] = {a.name: {n % k} for n, a in enumerate(red.merge.args)}
        for o in red.merge.ops:
            got = set().union(*(deps.get(x.name, set()) for x in o.operands))
            if o.name == "yield":
                for j, x in enumerate(o.operands):
                    for n in sorted(deps.get(x.name, set())):
                        if not set(dims[n]) <= set(dims[j]):
                            raise self.fail(
                                op, f"component {j + 1} of reducer {c} (state "
                                f"%{states[j].name}) has fewer dims than component {n + 1} "
                                f"(%{states[n].name}), which its merge reads",
                                "a narrower state must merge from narrower or equal states "
                                "only, or give it the wider state's dims")
                break
            for r in o.results:
                deps[r.name] = got

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

    def block(self, b: Block, scope: list[set[str]], vars_: frozenset[str], top: bool = False,
              owner: Operation | None = None) -> None:
        local: set[str] = set()
        scope = scope + [local]
        for a in b.args:
            self._define(a, owner)
            local.add(a.name)
            self.check_type(a, owner, scope, vars_)
        for i, op in enumerate(b.ops):
            if op.name == "yield" and i != len(b.ops) - 1:
                raise self.fail(op, "yield must be the last op of its region")
            self.op(op, scope, vars_)
            for r in op.results:
                self._define(r, op)
                local.add(r.name)
        if not top and b.terminator is None:
            where = f" of '{owner.name}'" if owner is not None else ""
            raise self.fail(owner, f"a region{where} must end with yield",
                            "write 'yield' (with the region's outputs) as its last op")

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
        known_attrs = {n for n, _ in d.all_attrs()}
        for n in op.attrs:
            if n not in known_attrs:
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
            self.check_ints(op, v, f"attribute '{k}' of '{op.name}'")
            if isinstance(v, IndexSet):  # a region's domain, as a type's space
                for x in v.space.extents:
                    if isinstance(x, E.Const) and x.value < 0:
                        raise self.fail(op, f"the {k} of '{op.name}' has the negative extent "
                                            f"{x.value}", "an extent counts elements and is "
                                                          "at least 0")
            for leaf in _leaves(v):
                if isinstance(leaf, E.Var) and leaf.name not in allowed:
                    raise self.fail(op, f"index variable ${leaf.name} in '{op.name}' "
                                        f"attribute '{k}' is not bound here")
                if isinstance(leaf, E.Sym) and leaf.name not in self.syms:
                    raise self.fail(op, f"symbol '{leaf.name}' is not a kernel parameter")
                if isinstance(leaf, E.Val) and not self.visible(leaf.name, scope):
                    raise self.fail(op, f"%{leaf.name} is used in an index of '{op.name}' "
                                        "where its definition is not visible")
        # (3) types: well formed as written, then as the type rule recomputes them
        for r in op.results:
            self.check_type(r, op, scope, vars_)
        hint = tuple(r.type for r in op.results)
        try:
            got = infer_types(op.name, tuple(o.type for o in op.operands), op.attrs, hint)
        except TilenestError as e:
            raise e.with_site(op.loc) from None
        if tuple(got) != hint:
            from .ioschema import DimNames
            from .printer import print_type

            names = DimNames(self.p.dims)
            written = ", ".join(print_type(t, names) for t in hint) or "nothing"
            rule = ", ".join(print_type(t, names) for t in got) or "nothing"
            raise self.fail(op, f"'{op.name}' is typed {written}, but its type rule gives "
                                f"{rule}", "write the result types the op's rule derives")
        self.element_constants(op)
        if op.name == "per" and op.attrs["level"] not in self.levels:
            raise self.fail(op, f"'per' names level {op.attrs['level']}, which is not the "
                                "level of an enclosing parallel",
                            "enclosing parallel levels here: " + (
                                ", ".join(map(str, self.levels)) or "none"))
        # (4) regions
        outer_levels = self.levels
        if op.name == "parallel":
            self.levels = outer_levels + (op.attrs["level"],)
        try:
            for region in op.regions:
                self.block(region, scope, inner_vars, owner=op)
        finally:
            self.levels = outer_levels
        self.region_rules(op)

    def element_constant(self, op: Operation | None, value: Any, dt: Any, what: str) -> None:
        """``value`` is a literal of dtype ``dt`` (see ``numerics.constant``)."""
        from .numerics import constant

        try:
            constant(value, dt)
        except (ValueError, OverflowError, TypeError):
            raise self.fail(op, f"{what} {value!r} is not a value of {dt}",
                            f"write a literal that {dt} holds exactly (integers must fit its "
                            "range; floats only in float dtypes)") from None

    def element_constants(self, op: Operation) -> None:
        """Literals held by an op (a constant, a fill, a fallback) fit the dtype
        they are converted to when the op runs."""
        n = op.name
        if n == "const" and isinstance(op.results[0].type, TileType):
            self.element_constant(op, op.attrs["value"], op.results[0].type.dtype,
                                  "the constant")
        if n == "gather" and isinstance(op.operands[0].type, TileType):
            self.element_constant(op, op.attrs["fallback"], op.operands[0].type.dtype,
                                  "the gather fallback")
        if n == "tensor.load" and isinstance(op.results[0].type, TileType):
            pol = op.attrs["bounds"]
            if pol.fill is not None:
                self.element_constant(op, pol.fill, op.results[0].type.dtype, "the fill value")

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
            self.reduce_contracts(op)
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
            check_layout(cast(MemoryType, op.results[0].type), op)


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


def magnitude(x: E.Expr, bounds: Mapping[str, int]) -> int | None:
    """An upper bound on the magnitude of ``x`` and of every subexpression of it
    when each variable ``$v`` lies in ``[0, bounds[v]]``; None when unbounded
    (symbols, values, shifts by a large amount). When it is below 2**62, int64
    evaluation of ``x`` never overflows, so it is exact."""
    if isinstance(x, E.Const):
        return abs(x.value)
    if isinstance(x, E.Var):
        return bounds.get(x.name)
    found = [magnitude(c, bounds) for c in x.children]
    parts = [m for m in found if m is not None]
    if len(parts) != len(found) or not parts:
        return None
    if isinstance(x, E.Add):
        return sum(parts)
    if isinstance(x, E.Mul):
        out = 1
        for m in parts:
            out *= max(m, 1)
        return out
    if isinstance(x, (E.FloorDiv, E.Mod, E.MinMax)):
        return max(parts)
    if isinstance(x, E.BitOp):
        a, b = parts
        if x.op == "<<":
            return max(a, b) << b if b <= 128 else None
        if x.op == ">>":
            return max(a, b)
        # & | ^ on two's complement values in [-2**k, 2**k) stay in that range
        return 1 << max(a, b).bit_length()
    return None


#: above this many elements a layout whose offsets may leave int64 is not
#: enumerated with Python integers (it is left to ``tilenest check``)
EXACT_ENUMERATION_BUDGET = 1 << 14


def check_layout(mt: MemoryType, op: Operation) -> None:
    """Whole-tile storage needs an injective, in-range layout. Decided exactly by
    enumeration when all extents are constant and small; otherwise left as a
    proof obligation (``tilenest check``). Offsets are computed in int64 when
    :func:`magnitude` shows that exact, else with Python integers."""
    lay: MemLayout = mt.layout
    ext = mt.space.extents
    sizes = [x.value for x in ext if isinstance(x, E.Const)]
    if len(sizes) != len(ext) or any(k < 0 for k in sizes) or len(lay.vars) != len(ext):
        return
    n = int(np.prod(sizes)) if sizes else 1
    if n == 0 or n > ENUMERATION_BUDGET:
        return
    if any(isinstance(lf, (E.Sym, E.Val)) or isinstance(lf, E.Var) and lf.name not in lay.vars
           for lf in E.leaves(lay.offset)):
        return
    bound = magnitude(lay.offset, {v: k - 1 for v, k in zip(lay.vars, sizes, strict=True)})
    exact = bound is not None and bound < (1 << 62)
    if not exact and n > EXACT_ENUMERATION_BUDGET:
        return
    dtype: Any = np.int64 if exact else object
    grids = np.meshgrid(*[np.arange(k) for k in sizes], indexing="ij")
    env: dict[E.Expr, Any] = {E.Var(v): g.ravel().astype(dtype)
                              for v, g in zip(lay.vars, grids, strict=True)}
    try:
        with np.errstate(all="ignore"):
            off = np.asarray(E.evaluate(lay.offset, env), dtype=dtype) * np.ones(n, dtype=dtype)
    except ZeroDivisionError:
        raise VerifyError("memory layout divides by zero for some element", op.loc,
                          "a layout offset's divisors and moduli are nonzero") from None
    except (ValueError, OverflowError):  # e.g. a negative shift count: not decided here
        return
    if not exact and any(not INT_MIN <= int(o) <= INT_MAX for o in off):
        raise VerifyError("memory layout maps an element to an offset outside the signed "
                          "64-bit range", op.loc, "fix the layout's strides")
    off = off.astype(np.int64)
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
        st_ops = [(i, o, t.memory) for i, o in enumerate(op.operands)
                  if isinstance(t := o.type, StateType)]
        for _, o, mem in st_ops:
            if cur.get(mem) != o.name:
                raise VerifyError(f"'{n}' passes stale state %{o.name} of %{mem}", op.loc)
        may_skip = self._may_skip(op)
        results_init: dict[int, bool] = {}
        for r in op.regions:
            inner = dict(cur)
            args = r.args
            operand_base = 1 if n == "if" else 0
            if n != "if":
                for i, o, mem in st_ops:
                    a = args[i - operand_base] if i - operand_base < len(args) else None
                    if a is not None:
                        inner[mem] = a.name
                        self.init[a.name] = self.init.get(o.name, True)
            self.block(r, inner)
            y = r.terminator
            if y is None:
                continue
            for i, _o, _mem in st_ops:
                if n == "if":
                    continue
                yv = y.operands[i]
                results_init[i] = results_init.get(i, True) and self.init.get(yv.name, True)
            if n == "if":
                for i, yv in enumerate(y.operands):
                    if isinstance(yv.type, StateType):
                        results_init[i] = results_init.get(i, True) and self.init.get(
                            yv.name, True)
        for i, res in enumerate(op.results):
            if isinstance(res.type, MemoryType) and op.regions:
                y = op.regions[0].terminator
                if y is not None and i < len(y.operands):
                    self.alias[res.name] = self.root(y.operands[i].name)
            if not isinstance(res.type, StateType):
                continue
            mem = res.type.memory
            cur[mem] = res.name
            ok = results_init.get(i, True)
            if n != "if" and may_skip:
                inc = op.operands[i]
                ok = ok and self.init.get(inc.name, True)
            self.init[res.name] = ok

    def _may_skip(self, op: Operation) -> bool:
        if op.name == "while":
            return True
        if op.name not in _NEST:
            return False
        dom: IndexSet = op.attrs["domain"]
        if not dom.is_rectangular:
            return True
        ranges: dict[E.Expr, tuple[int | None, int | None]] = {
            E.Sym(s): (0, None) for s in self.p.syms}
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
