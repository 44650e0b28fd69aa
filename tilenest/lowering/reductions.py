"""Lowering of ``reduce`` regions (``spec/reductions.md``).

Two realizations, both members of every policy's admitted set:

* **Per-element recurrences** (when the body is *pointwise in the state*: every
  op is lazily computable, and every value that depends on the state is an
  elementwise op over (a subset of) the state's dims). Then element ``q`` of
  the result depends only on element ``q`` of the seed and the contributions at
  ``q``, so the loops interchange: for each ``q``, a scalar accumulator runs
  through the domain in order -- lexicographic for ``fold_left`` and the tree
  policies, reversed for ``fold_right`` -- exactly the reference recurrence.
  For a tree policy whose update is its contract's merge
  (``s = merge(s, c)`` or ``merge(c, s)``, ``c`` independent of the state) the
  merge op is marked ``reassoc``: the innermost domain loop may then be
  vectorized and regrouped, which the policy admits (``ordered_tree`` too: the
  built-in merges are commutative). Strict folds never get the flag.
  A tree policy with a *custom* contract (R-11) over a one-dimensional domain
  instead marks its domain loop with a :class:`~tilenest.lowering.loopir.TreeFold`:
  the states it carries, the contract's identity and its merge lowered to
  loop IR, so that a target with threads (``simt.py``) may run the loop as a
  fixed block tree; the loop itself stays ``serial`` (the canonical fold,
  what a target without threads runs).
* **Tile-level iteration** otherwise: the carried state lives in storage and
  the body runs once per domain point in the same order, as a ``serial`` loop.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..errors import ContractError, NotAvailableError
from ..semantics import expr as E
from ..semantics.ir import Block, Operation
from ..semantics.ops.values import ELEMENTWISE
from ..semantics.policies import ReductionPolicy
from ..semantics.reducers import BUILTINS, CustomReducer
from ..semantics.types import TileType
from . import loopir as L
from .core import Lowerer, rule
from .handles import BufH, Index, VarH
from .regions import loop_region
from .schedule import LAZY_OPS


def pointwise(op: Operation) -> bool:
    """Whether ``op``'s body is pointwise in its state (see module docstring)."""
    body: Block = op.regions[0]
    if not op.operands:
        return False
    t0 = op.operands[0].type
    if not all(isinstance(o.type, TileType) and o.type.space == t0.space for o in op.operands):
        return False
    sdims = set(t0.dims)
    dep = {a.name for a in body.args}
    local = set()
    for o in body.ops:
        if o.name == "yield":
            continue
        if o.name not in LAZY_OPS or o.regions and o.name != "map":
            return False
        for x in _attr_exprs(o):
            if any(isinstance(lf, E.Val) and lf.name in local for lf in E.leaves(x)):
                return False
        if any(v.name in dep for v in o.operands):
            if o.name not in ELEMENTWISE and o.name != "map":
                return False
            if any(not set(r.type.dims) <= sdims for r in o.results):
                return False
            dep.update(r.name for r in o.results)
        local.update(r.name for r in o.results)
    return True


def _attr_exprs(o: Operation) -> list:
    out = []
    for k in ("map", "value", "origin"):
        x = o.attrs.get(k) if hasattr(o.attrs, "get") else None
        if x is None:
            continue
        out.extend(x if isinstance(x, tuple) else [x])
    return [x for x in out if isinstance(x, (E.Expr, E.Pred))]


def merge_ops(op: Operation) -> set[int]:
    """Op ids of the body ops that are the contract's merge of a state with a
    state-independent contribution (candidates for ``reassoc``)."""
    body: Block = op.regions[0]
    contracts = op.attrs["contracts"]
    y = body.terminator
    if y is None:
        return set()
    defs = {r.name: o for o in body.ops for r in o.results}
    dep = {a.name for a in body.args}
    for o in body.ops:
        if any(v.name in dep for v in o.operands):
            dep.update(r.name for r in o.results)
    out: set[int] = set()
    for i, (a, yv) in enumerate(zip(body.args, y.operands, strict=True)):
        c = contracts[i] if i < len(contracts) else None
        if c is None or c not in BUILTINS:
            continue
        m = defs.get(yv.name)
        if m is None or m.name != BUILTINS[c].op or len(m.operands) != 2:
            continue
        x, z = m.operands
        other = z if x.name == a.name else x if z.name == a.name else None
        if other is not None and other.name not in dep:
            out.add(m.oid)
    return out


@rule("reduce")
def _reduce(lw: Lowerer, op: Operation) -> None:
    policy: ReductionPolicy = op.attrs["policy"]
    contracts = op.attrs["contracts"]
    if policy.is_tree and any(c is None for c in contracts):
        raise ContractError(f"reduce with policy {policy.value} has a state without a reducer "
                            "contract", op.loc, "use fold_left/fold_right for a strict order")
    reverse = policy is ReductionPolicy.fold_right
    granted: set[int] = set()
    auto = policy.is_tree and lw.sched.reduction(op.oid) == "auto"
    if auto:
        granted = merge_ops(op)
    if pointwise(op):
        # a run of a reduce split over programs folds in order (its RunTree)
        tree = custom_tree(lw, op) if auto and op.oid not in lw.chunks else None
        _per_element(lw, op, reverse, set() if tree is not None else granted, tree)
    else:  # whole tiles folded in order, as a serial region carries them
        loop_region(lw, op, reverse)


def contract_groups(lw: Lowerer, op: Operation) -> list[tuple[list[int], Any]] | None:
    """The states of ``op`` in their contract groups (R-11): a custom reducer
    of ``k`` components covers ``k`` consecutive states of its dtypes, merged
    jointly; a builtin covers one. None when a state has no contract or a
    custom group is malformed (the verifier reports that)."""
    contracts = list(op.attrs["contracts"])
    reducers = {f"@{r.name}": r for r in lw.prog.reducers}
    dts = [o.type.dtype for o in op.operands]
    plan: list[tuple[list[int], Any]] = []
    i = 0
    while i < len(contracts):
        c = contracts[i]
        if c in reducers:
            red = reducers[c]
            k = len(red.state)
            if contracts[i:i + k] != [c] * k or tuple(dts[i:i + k]) != tuple(red.state):
                return None
            plan.append((list(range(i, i + k)), red))
            i += k
        elif c in BUILTINS:
            plan.append(([i], BUILTINS[c]))
            i += 1
        else:
            return None
    return plan


def identity_of(r: Any, dt: Any, j: int = 0) -> Any:
    """The identity of component ``j`` of contract ``r`` (custom or builtin)
    as the Python number a loop-IR constant of ``dt`` holds."""
    return _literal(r.identity[j] if isinstance(r, CustomReducer) else r.identity(dt), dt)


def lower_merge(lw: Lowerer, r: Any, a: list[Any], b: list[Any], dts: list[Any]) -> list[Any]:
    """Loop-IR expressions of ``merge(a, b)`` for contract ``r`` on scalar
    variables ``a`` and ``b`` (one per component); the statements the merge
    needs are emitted where the caller collects (:func:`merge_values`)."""
    if not isinstance(r, CustomReducer):
        return [L.Bin(r.op, L.Ref(a[0]), L.Ref(b[0]), dts[0])]
    outs = merged_names(r)
    got = merge_values(lw, r, a, b, outs)
    return [got[n] for n in outs]


def merged_names(r: CustomReducer) -> list[str]:
    """The names of the values custom contract ``r``'s merge yields, one per
    component, in order."""
    (y,) = [o for o in r.merge.ops if o.name == "yield"] or [None]
    if y is None:
        raise ContractError(f"the merge of {r.name} yields nothing", None,
                            "end the merge region with its merged components")
    return [x.name for x in y.operands]


def merge_needs(r: CustomReducer, want: list[str], given: set[str]
                ) -> tuple[list[Operation], set[str]]:
    """The ops of ``r``'s merge that computing the values named ``want``
    runs when those named ``given`` are known (in program order), and every
    name those ops and ``want`` read."""
    need: set[str] = set(want)
    run: list[Operation] = []
    for o in reversed([o for o in r.merge.ops if o.name != "yield"]):
        if any(x.name in need for x in o.results) and not all(x.name in given for x in o.results):
            run.append(o)
            need.update(x.name for x in o.operands)
    run.reverse()
    return run, need


def row_values(r: CustomReducer, narrow: list[int]) -> list[str]:
    """The values of ``r``'s merge that depend only on the components
    ``narrow`` (both sides' arguments) and that an op depending on another
    component reads: what a merge over the widest state's elements needs of
    the narrow states, beyond their own values (the online-softmax merge's
    two rescaling factors, functions of the maxima alone)."""
    k = len(r.merge.args) // 2
    own = {r.merge.args[side * k + n].name for side in (0, 1) for n in narrow}
    derived = set(own)
    out: list[str] = []
    for o in r.merge.ops:
        if o.name == "yield":
            continue
        if all(x.name in derived for x in o.operands):
            derived.update(x.name for x in o.results)
            continue
        out.extend(x.name for x in o.operands
                   if x.name in derived and x.name not in own and x.name not in out)
    return out


def merge_values(lw: Lowerer, r: CustomReducer, a: list[Any], b: list[Any],
                 want: list[str], given: dict[str, Any] | None = None) -> dict[str, Any]:
    """Loop-IR expressions of the values named ``want`` of custom contract
    ``r``'s merge region on scalar variables ``a`` and ``b`` (its arguments,
    one per component each), lowering only the ops they need; a value in
    ``given`` (name -> scalar variable holding it) is read from there instead
    of computed. The statements the values need are emitted where the caller
    collects.

    A value that two or more of the lowered ops (or ``want``) read is
    assigned to a variable once, where it is computed, and read from there:
    the online-softmax merge's new maximum feeds both rescaling factors and
    each factor two components, and an expression repeated at every use is
    evaluated again at each (a compiler cannot always merge the copies: the
    CUDA maximum is an inline instruction it does not deduplicate)."""
    given = given or {}
    ops = [o for o in r.merge.ops if o.name != "yield"]
    run, _ = merge_needs(r, want, set(given))
    reads: dict[str, int] = {n: 1 for n in want}
    for o in run:
        for x in o.operands:
            reads[x.name] = reads.get(x.name, 0) + 1
    # the merge's own names must not shadow the program's
    mine = [v.name for v in r.merge.args] + [x.name for o in ops for x in o.results]
    saved = {nm: lw.env[nm] for nm in mine if nm in lw.env}
    lw.expr_mode += 1
    try:
        for v, x in zip(r.merge.args, [*a, *b], strict=True):
            lw.env[v.name] = VarH(x)
        for nm, x in given.items():
            lw.env[nm] = VarH(x)
        for o in run:
            lw.lower_op(o)
            for x in o.results:
                h = lw.env[x.name]
                if reads.get(x.name, 0) > 1 and not isinstance(h, VarH):
                    var = lw.fresh(x.name, x.type.dtype)
                    lw.emit(L.Assign(var, h.at(lw, {})))
                    lw.env[x.name] = VarH(var)
        return {n: lw.env[n].at(lw, {}) for n in want}
    finally:
        lw.expr_mode -= 1
        for nm in mine:
            lw.env.pop(nm, None)
        lw.env.update(saved)


def custom_tree(lw: Lowerer, op: Operation) -> Any:
    """For a tree-policy ``reduce`` with a custom contract over a
    one-dimensional domain: a function of the states' accumulators that
    builds the :class:`~tilenest.lowering.loopir.TreeFold` of its domain loop
    (identity and merge of every state, builtin ones too); None otherwise
    (built-in contracts take the ``reassoc`` route, folds stay in order).
    The states are merged in their :func:`contract_groups`."""
    contracts = list(op.attrs["contracts"])
    if not any(c.startswith("@") for c in contracts) or len(op.attrs["vars"]) != 1:
        return None
    plan = contract_groups(lw, op)
    if plan is None:
        return None  # no joint merge: the verifier reports it; stay in order
    dts = [o.type.dtype for o in op.operands]
    ordered = op.attrs["policy"] is ReductionPolicy.ordered_tree or any(
        isinstance(r, CustomReducer) and not r.commutative for _, r in plan)

    def build(accs: list[L.LVar]) -> L.TreeFold:
        a = [lw.fresh("ta", dt) for dt in dts]
        b = [lw.fresh("tb", dt) for dt in dts]
        ident: list[L.Const] = [L.Const(0, dt) for dt in dts]
        outs: list[Any] = [None] * len(dts)
        with lw.collect() as stmts:
            for idx, r in plan:
                for n, j in enumerate(idx):
                    ident[j] = L.Const(identity_of(r, dts[j], n), dts[j])
                got = lower_merge(lw, r, [a[j] for j in idx], [b[j] for j in idx],
                                  [dts[j] for j in idx])
                for j, x in zip(idx, got, strict=True):
                    outs[j] = x
        return L.TreeFold(op.oid, tuple(accs), tuple(ident), tuple(a), tuple(b), tuple(stmts),
                          tuple(outs), ordered)

    return build


def _literal(v: Any, dt: Any) -> Any:
    """``v`` as the Python number a loop-IR constant of ``dt`` holds."""
    if dt.is_float:
        return float(v)
    if dt.is_bool:
        return bool(v)
    return int(v)


def _per_element(lw: Lowerer, op: Operation, reverse: bool, granted: set[int],
                 tree: Any = None) -> None:
    seeds = [lw.handle(o) for o in op.operands]
    t0: TileType = op.operands[0].type
    ext = lw.extents(t0)
    body: Block = op.regions[0]
    results = [lw.new_storage(r.type, r.name) for r in op.results]
    rows = tree is None and _threads_per_point(lw, op, ext)
    kind = "vector" if granted and not rows else "serial"

    def element(q: Index) -> None:
        accs = [lw.fresh(f"acc_{r.name}", r.type.dtype) for r in op.results]
        for a, s in zip(accs, seeds, strict=True):
            lw.emit(L.Assign(a, s.at(lw, q)))

        def step() -> None:
            lw.expr_mode += 1
            lw.reassoc |= granted
            try:
                outs = lw.lower_block(body, [VarH(a) for a in accs])
                news = [h.at(lw, {d: q[d] for d in h.dims}) for h in outs]
            finally:
                lw.expr_mode -= 1
                lw.reassoc -= granted
            if len(accs) == 1:
                lw.emit(L.Assign(accs[0], news[0]))
                return
            tmps = [lw.fresh("next", a.dtype) for a in accs]
            for t, n in zip(tmps, news, strict=True):
                lw.emit(L.Assign(t, n))
            for a, t in zip(accs, tmps, strict=True):
                lw.emit(L.Assign(a, L.Ref(t)))

        def guards() -> list[E.Pred]:
            # the guards of the contributions' reads at this point, from a
            # lowering of the body whose statements are dropped
            lw.expr_mode += 1
            try:
                with lw.collect():
                    outs = lw.lower_block(body, [VarH(a) for a in accs])
            finally:
                lw.expr_mode -= 1
            return [g for h in outs for g in h.guards({d: q[d] for d in h.dims})]

        if tree is None:
            lw.domain_loops(op, step, reverse=reverse, kind=kind, guards=guards)
        else:  # the one domain loop may run as a block tree (TreeFold): not
            # cut into ranges, so the tree covers the whole domain
            try:
                fold = tree(accs)
            except NotAvailableError:  # a merge the loop IR cannot express: in order
                fold = None
            with lw.collect() as got:
                lw.domain_loops(op, step, reverse=reverse, kind=kind)
            lw.emit(*(replace(s, tree=fold) if isinstance(s, L.For) and fold is not None
                      else s for s in got))
        for r, a in zip(results, accs, strict=True):
            if isinstance(r, VarH):
                lw.emit(L.Assign(r.var, L.Ref(a)))
            else:
                assert isinstance(r, BufH)
                lw.emit(L.Store(r.buf, L.IExpr(r.offset(q)), L.Ref(a)))

    lw.nest(t0.dims, ext, element, kind="vector" if rows else "serial")
    for r, h in zip(op.results, results, strict=True):
        lw.env[r.name] = h
        lw.def_depth[r.name] = lw.depth


#: the most contributions one thread folds alone in :func:`_threads_per_point`
POINT_FOLD = 256


def _threads_per_point(lw: Lowerer, op: Operation, kept: tuple[E.Expr, ...]) -> bool:
    """Whether a SIMT schedule folds each kept point of reduce ``op`` in one
    thread (the kept points a ``vector`` nest, the SIMT form gives one to
    each thread; each folds its contributions in source order, the
    reference order, admitted under every policy) instead of folding the
    points one after another with the whole block on each. Chosen when the
    kept points are many (at least a quarter of the block, at least a warp)
    and each has few contributions (at most :data:`POINT_FOLD`): a row
    reduction of an attention score tile (64 rows of 64 keys) is then 64
    threads folding in parallel rather than 64 block reductions with two
    barriers each. A reduction of the rows of a tensor-core result
    (``Lowerer.row_derived``) takes this shape however few its rows are,
    since its rows then fold in the result's registers."""
    W = lw.sched.block_threads
    if not W or not kept or not all(isinstance(x, E.Const) for x in kept):
        return False
    points = 1
    for x in kept:
        points *= x.value
    n = 1
    for x in op.attrs["domain"].space.extents:
        x = lw.ix(x)
        if not isinstance(x, E.Const):
            return False
        n *= x.value
    # the rows of a tensor-core result fold in its registers (fragments.RowFold)
    # whatever their number: they need this shape
    on_matrix_unit = any(o.name in lw.row_derived for inner in op.regions[0].ops
                         if inner.name == "reindex" for o in inner.operands)
    return (points >= max(32, W // 4) or on_matrix_unit) and n <= POINT_FOLD


