"""Lowering of region ops (``semantics/ops/regions.py``).

* top-level ``parallel`` -- one phase; each program id is one domain point
  (row-major), its coordinates recovered by division; the domain predicate
  guards the body. Programs are independent, so the runtime may run them on
  any core in any order.
* nested ``parallel`` -- the children in row-major order inside the program
  (an admitted order: children are independent). Updates of ancestor values
  join per child (:func:`classify_updates`): ``put`` patches go straight into
  the result, collective values are stored by every child.
* ``serial`` / ``pipeline`` -- loops over the domain in lexicographic (or
  reversed) order; ``stage`` bodies are inlined in order (the reference
  meaning of a pipeline; software prefetching is a schedule for later).
* carried values live in per-program storage (a local or a buffer) for the
  duration of the loop: the seed is copied in, block arguments read it, and
  at each ``yield`` all new values are computed before any is written back
  (:func:`carry_update`), so a yield that reads another carried value sees
  the old one.
* ``if`` / ``while`` -- structured control flow on a bool scalar; results
  are written to fresh storage by each branch.
"""

from __future__ import annotations

from typing import Any

from ..semantics import expr as E
from ..semantics.ir import Operation
from ..semantics.types import TileType
from . import loopir as L
from .core import Lowerer, rule, unsupported
from .handles import BufH, Handle, LazyH, VarH


def lower_phase_parallel(lw: Lowerer, op: Operation, prefix: list[Operation], k: int) -> L.Phase:
    """The phase of a top-level ``parallel``: root ops in ``prefix`` are
    replayed first in every program."""
    dom = op.attrs["domain"]
    vars_ = op.attrs["vars"]
    exts = tuple(lw.ix(x) for x in dom.space.extents)
    pid = lw.fresh("pid", L.INDEX)
    binding = lw.sched.binding(op.oid, 1)
    with lw.collect() as body:
        for p in prefix:
            lw.lower_op(p)
        coords = L.delinearize(E.Var(pid.name), exts)
        mark = lw.facts.push([])
        for v, c, n in zip(vars_, coords, exts, strict=True):
            cv = lw.fresh(v, L.INDEX)
            lw.emit(L.Assign(cv, L.IExpr(c)))
            lw.ivars[v] = E.Var(cv.name)
            lw.facts.push([E.Var(cv.name).ge(0), E.Var(cv.name).lt(n)])
        pred = lw.ix(dom.pred)
        with lw.collect() as inner:
            if pred != E.TRUE:
                lw.facts.push([pred])
            lw.lower_block(op.regions[0], [])
        lw.facts.pop(mark)
        if pred != E.TRUE and inner:
            lw.emit(L.If(L.IPred(pred), tuple(inner)))
        else:
            lw.emit(*inner)
    return L.Phase(f"{lw.prog.name}_{k}", exts, pid, tuple(body), binding == "cores")


@rule("parallel")
def _parallel(lw: Lowerer, op: Operation) -> None:
    if not op.operands:
        lw.domain_loops(op, lambda: lw.lower_block(op.regions[0], []))
        return
    _parallel_updates(lw, op)


def classify_updates(lw: Lowerer, op: Operation) -> list[tuple[str, list[int]]]:
    """How each child updates each carried ancestor value (``execution.md``):
    ``same`` (yields its entry value), ``patch`` (a chain of ``put`` s on the
    entry value, each result used only by the next; the op ids), ``collective``
    (a value anchored above this level: every child computes the same one), or
    ``whole`` (a per-child value covering the whole tile)."""
    body = op.regions[0]
    y = body.terminator
    an = lw.prog.analysis
    depth = next(lv.depth for lv in an.nest.levels.values() if lv.op == op.oid)
    defs = {r.name: o for o in body.walk() for r in o.results}
    out: list[tuple[str, list[int]]] = []
    for a, v in zip(body.args, y.operands, strict=True):
        if v.name == a.name:
            out.append(("same", []))
            continue
        chain: list[int] = []
        cur = v.name
        while cur in defs and defs[cur].name == "put" and (cur == v.name
                                                            or lw.uses.get(cur, 0) == 1):
            chain.append(defs[cur].oid)
            cur = defs[cur].operands[0].name
        if chain and cur == a.name and lw.uses.get(cur, 0) == 1:
            out.append(("patch", chain))
        elif an.nest.depth(an.value_anchor.get(v.name, 0)) < depth:
            out.append(("collective", []))
        else:
            out.append(("whole", []))
    return out


def _parallel_updates(lw: Lowerer, op: Operation) -> None:
    """Children in row-major order; each starts from the entry values (kept
    unmodified), and the results join the children's updates: ``put`` patches
    are written straight into the result storage, a collective value (the same
    in every child) or a whole-tile per-child value is stored by each child.
    Overlapping per-child footprints are a race the interpreter reports; here
    the last child wins."""
    entries = [lw.handle(o) for o in op.operands]
    results = carry_init(lw, op, entries)
    kinds = classify_updates(lw, op)
    body = op.regions[0]
    for (kind, chain), r in zip(kinds, results, strict=True):
        if kind == "patch":
            for oid in chain:
                lw.put_into[oid] = r
    frozen = {a.name for a in body.args}
    lw.frozen |= frozen

    defs = {r.name: o for o in body.walk() for r in o.results}
    stop = {a.name for a in body.args}

    def child() -> None:
        outs = lw.lower_block(body, list(entries))
        for (kind, _), r, h, v in zip(kinds, results, outs, body.terminator.operands,
                                      strict=True):
            if kind in ("collective", "whole") and isinstance(r, (VarH, BufH)):
                if isinstance(r, BufH) and _traceable(lw, v.name, stop, defs, False):
                    _store_footprint(lw, v.name, stop, defs, h, r)
                else:
                    lw.store_into(h, r)

    try:
        lw.domain_loops(op, child)
    finally:
        lw.frozen -= frozen
    for r, s in zip(op.results, results, strict=True):
        lw.env[r.name] = s
        lw.def_depth[r.name] = lw.depth


def _traceable(lw: Lowerer, name: str, stop: set[str], defs: dict[str, Operation],
               nested: bool) -> bool:
    """Whether the footprint of the child value ``name`` on its entry value can
    be replayed after the child's body (:func:`_store_footprint`): a chain of
    ``put`` s, ``if`` s (not inside a nested parallel, whose conditions are gone
    by then) and nested ``parallel`` s ending at an entry value, or any other
    value (whole-tile footprint)."""
    if name in stop:
        return True
    d = defs.get(name)
    if d is None:
        return True
    if d.name == "put":
        if nested and any(isinstance(lf, E.Val) for o in d.attrs["origin"]
                          for lf in E.leaves(o)):
            return False
        return _traceable(lw, d.operands[0].name, stop, defs, nested)
    if d.name == "if":
        if nested:
            return False
        i = [r.name for r in d.results].index(name)
        return all(_traceable(lw, b.terminator.operands[i].name, stop, defs, nested)
                   for b in d.regions)
    if d.name == "parallel" and d.operands:
        i = [r.name for r in d.results].index(name)
        inner = d.regions[0]
        return (_traceable(lw, d.operands[i].name, stop, defs, nested)
                and _traceable(lw, inner.terminator.operands[i].name,
                               stop | {a.name for a in inner.args}, defs, True))
    return True


def _store_footprint(lw: Lowerer, name: str, stop: set[str], defs: dict[str, Operation],
                     src: BufH | LazyH, dst: BufH) -> None:
    """Copy one child's footprint of the yielded value ``src`` into the join
    result ``dst`` (``execution.md`` E-6/E-11; the reference ``_yield_masks``):
    nothing for the entry value itself, the block of each ``put`` on it, the
    footprint of the branch taken by an ``if``, the union of the children's
    footprints of a nested ``parallel``, and the whole tile for any other
    value. ``name`` is a value whose footprint is part of ``src``'s; every
    element is read from ``src`` (the child's final value)."""
    if name in stop:
        return
    d = defs.get(name)
    if d is None:
        lw.store_into(src, dst)
        return
    if d.name == "put":
        _store_footprint(lw, d.operands[0].name, stop, defs, src, dst)
        origin = [lw.ix(o) for o in d.attrs["origin"]]
        pt: TileType = d.operands[1].type

        def body(u: Any) -> None:
            coords = [o + u[k] for o, k in zip(origin, pt.dims, strict=True)]
            preds: list[E.Pred] = []
            for cc, n in zip(coords, dst.extents, strict=True):
                preds += [cc.ge(0), cc.lt(n)]
            q = dict(zip(dst.dims, coords, strict=True))
            off = L.IExpr(dst.offset(q))
            lw.emit(L.Store(dst.buf, off, src.at(lw, dict(zip(src.dims, coords, strict=True))),
                            lw.guard_of(preds)))

        lw.nest(pt.dims, lw.extents(pt), body)
        return
    if d.name == "if":
        i = [r.name for r in d.results].index(name)
        cond = _bool_expr(lw, lw.handle(d.operands[0]))
        branches = []
        for b in d.regions:
            with lw.collect() as stmts:
                _store_footprint(lw, b.terminator.operands[i].name, stop, defs, src, dst)
            branches.append(tuple(stmts))
        if branches[0] or branches[1]:
            lw.emit(L.If(cond, branches[0], branches[1]))
        return
    if d.name == "parallel" and d.operands:
        i = [r.name for r in d.results].index(name)
        inner = d.regions[0]
        _store_footprint(lw, d.operands[i].name, stop, defs, src, dst)
        stop2 = stop | {a.name for a in inner.args}
        lw.domain_loops(d, lambda: _store_footprint(lw, inner.terminator.operands[i].name,
                                                    stop2, defs, src, dst))
        return
    lw.store_into(src, dst)


# ---------------------------------------------------------------------------
# carried state


def carry_init(lw: Lowerer, op: Operation, seeds: list[Any], first: int = 0) -> list[Handle]:
    """Fresh storage for each carried value, initialized from its seed
    (``seeds``: those of ``op``'s results ``first, first + 1, ...``)."""
    out: list[Handle] = []
    for r, h in zip(op.results[first:first + len(seeds)], seeds, strict=True):
        if not isinstance(r.type, TileType):
            out.append(h)  # memory state tokens: effects happen in place
            continue
        s = lw.new_storage(r.type, r.name)
        lw.store_into(h, s)
        out.append(s)
    return out


def _name(s: Any) -> str | None:
    st = s.storage() if isinstance(s, (VarH, BufH)) else None
    return None if st is None else st.name


def carry_update(lw: Lowerer, states: list[Any], outs: list[Any]) -> None:
    """Write the yielded values back into the carried storage, computing every
    new value before any storage is overwritten."""
    names = {n for n in (_name(s) for s in states) if n is not None}
    direct: list[tuple[Any, Any]] = []
    for s, h in zip(states, outs, strict=True):
        if not isinstance(s, (VarH, BufH)):
            continue
        if _name(h) == _name(s):
            continue  # updated in place
        if getattr(h, "reads", frozenset()) & names:
            t = lw.new_storage(TileType(s.dtype) if s.rank == 0 else _tile_type(s), "next")
            lw.store_into(h, t)
            direct.append((s, t))
        else:
            direct.append((s, h))
    for s, h in direct:
        lw.store_into(h, s)


def _tile_type(h: Any) -> TileType:
    from ..semantics.space import Space

    return TileType(h.dtype, Space.of(*zip(h.dims, h.extents, strict=True)))


def loop_region(lw: Lowerer, op: Operation, reverse: bool) -> None:
    """A region run as one loop over its domain, in order (or reversed),
    carrying its tiles from step to step."""
    seeds = [lw.handle(o) for o in op.operands]
    inits, states = [], []
    for i, seed in enumerate(seeds):  # each carried value's initialization apart
        with lw.collect() as init:
            states.extend(carry_init(lw, op, [seed], i))
        inits.append(init)
    trips = lw.ix(op.attrs["domain"].space.extents[0])

    def body() -> None:
        # the step's position for an accumulator's fold (``accumulators.py``)
        x = lw.ivars[op.attrs["vars"][0]] if len(op.attrs["vars"]) == 1 else None
        if x is not None and not reverse and op.oid not in lw.chunks:
            lw.steps[op.oid] = (x.le(0), x.ge(E.add(trips, -1)), trips.le(0))
        try:
            outs = lw.lower_block(op.regions[0], list(states))
        finally:
            lw.steps.pop(op.oid, None)
        carry_update(lw, states, outs)

    with lw.collect() as loop:
        lw.domain_loops(op, body, reverse=reverse)
    for i, init in enumerate(inits):
        if (op.oid, i) in lw.folded:  # the first step fills it
            lw.emit(L.If(L.IPred(trips.le(0)), tuple(init), ()))
        else:
            lw.emit(*init)
    lw.emit(*loop)
    for r, s in zip(op.results, states, strict=True):
        lw.env[r.name] = s
        lw.def_depth[r.name] = lw.depth


@rule("serial")
def _serial(lw: Lowerer, op: Operation) -> None:
    loop_region(lw, op, op.attrs["order"] == "reverse")


@rule("pipeline")
def _pipeline(lw: Lowerer, op: Operation) -> None:
    loop_region(lw, op, False)


@rule("stage")
def _stage(lw: Lowerer, op: Operation) -> None:
    outs = lw.lower_block(op.regions[0], [])
    for r, h in zip(op.results, outs, strict=True):
        lw.env[r.name] = h
        lw.def_depth[r.name] = lw.depth


def _bool_expr(lw: Lowerer, h: Any) -> L.Expr:
    return h.at(lw, {})


@rule("if")
def _if(lw: Lowerer, op: Operation) -> None:
    cond = _bool_expr(lw, lw.handle(op.operands[0]))
    res = [lw.new_storage(r.type, r.name) if isinstance(r.type, TileType) else None
           for r in op.results]
    branches = []
    for b in op.regions:
        with lw.collect() as stmts:
            outs = lw.lower_block(b, [])
            for s, h in zip(res, outs, strict=True):
                if s is not None:
                    lw.store_into(h, s)
        branches.append(tuple(stmts))
    lw.emit(L.If(cond, branches[0], branches[1]))
    for r, s in zip(op.results, res, strict=True):
        if s is None:
            raise unsupported(op, lw.target, "an if yielding memory states")
        lw.env[r.name] = s
        lw.def_depth[r.name] = lw.depth


@rule("while")
def _while(lw: Lowerer, op: Operation) -> None:
    cond_b, body_b = op.regions
    states = carry_init(lw, op, [lw.handle(o) for o in op.operands])
    lw.depth += 1
    try:
        with lw.collect() as pre:
            (c,) = lw.lower_block(cond_b, list(states))
            cv = lw.fresh("cond", c.dtype)
            lw.emit(L.Assign(cv, c.at(lw, {})))
        with lw.collect() as body:
            outs = lw.lower_block(body_b, list(states))
            carry_update(lw, states, outs)
    finally:
        lw.depth -= 1
    lw.emit(L.While(tuple(pre), L.Ref(cv), tuple(body)))
    for r, s in zip(op.results, states, strict=True):
        lw.env[r.name] = s
        lw.def_depth[r.name] = lw.depth
