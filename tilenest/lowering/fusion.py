"""Loop fusion: adjacent loops over the same range become one loop.

A tile that one loop produces and the next consumes element by element (a
softmax's ``e = exp(x - m)`` and its row sum ``s = sum(e)``) costs, unfused,
a second pass over the elements and, on ``cuda``, a block barrier between
the passes. :func:`fuse_loops` rewrites

    for i in [lo, hi): A(i)          for i in [lo, hi):
    inits                      ->      A(i)
    for j in [lo, hi): B(j)            B(i)

(``inits``: assignments of locals that ``A`` does not touch, moved before
the loops) when running ``B(i)`` right after ``A(i)`` gives every access the
value the sequential order gives it:

* **one iteration each** (``hi - lo == 1`` for constants): the fused loop is
  the two bodies one after the other, which is the sequential order itself;
* otherwise both loops are ``serial`` or both ``vector``, and every buffer
  one of them writes and the other accesses is accessed, in both, only at one
  index that is the same expression of the loop variable, with a nonzero
  constant coefficient (so iteration ``i`` of either loop touches only the
  element of iteration ``i``: no dependence between different iterations
  crosses from one loop to the other); ``B`` reads no local that ``A``
  assigns and the reverse, and neither body contains a barrier, a check, a
  warp collective, a tensor-core step or a loop of threads.

In the fused body a load of ``B`` from the element ``A`` just stored
unconditionally reads the stored value from a local instead (store-to-load
forwarding): the same value, and no wide load of a tile before its wide
store on ``cuda``. The pass runs bottom-up, so the bodies of fused outer
loops are fused in their turn.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

from ..semantics import expr as E
from . import loopir as L

_ids = itertools.count()

#: statements a fused body may not contain (ordering or collectives between
#: iterations, or a failure whose order would change)
_BLOCKING = (L.Barrier, L.Check, L.Shuffle, L.LaneReduce, L.WarpMma, L.While)


def fuse_loops(k: L.Kernel) -> L.Kernel:
    """``k`` with adjacent fusible loops of every phase fused (module docstring)."""
    return replace(k, phases=tuple(replace(ph, body=_body(ph.body)) for ph in k.phases))


def _body(body: tuple) -> tuple:
    out: list = []
    for s in body:
        if isinstance(s, L.For):
            s = replace(s, body=_body(s.body))
        elif isinstance(s, L.If):
            s = L.If(s.cond, _body(s.then), _body(s.orelse))
        out.append(s)
        out = _fuse_tail(out)
    return tuple(out)


def _fuse_tail(out: list) -> list:
    """``out`` with its last loop fused into the loop before it when legal
    (the statements between them being hoistable inits)."""
    b = out[-1]
    if not isinstance(b, L.For):
        return out
    j = len(out) - 2
    while j >= 0 and isinstance(out[j], L.Assign):
        j -= 1
    if j < 0 or not isinstance(out[j], L.For):
        return out
    a, inits = out[j], out[j + 1:-1]
    fused = _fuse(a, inits, b)
    if fused is None:
        return out
    # the two bodies meet: their loops may fuse in turn
    return out[:j] + list(inits) + [replace(fused, body=_body(fused.body))]


def _single(s: L.For) -> bool:
    return (isinstance(s.lo, E.Const) and isinstance(s.hi, E.Const)
            and s.hi.value - s.lo.value == 1)


def _fuse(a: L.For, inits: list, b: L.For) -> L.For | None:
    if a.reverse or b.reverse or a.lo != b.lo or a.hi != b.hi:
        return None
    if a.kind not in ("serial", "vector") or b.kind != a.kind:
        return None
    if any(isinstance(t, _BLOCKING) or (isinstance(t, L.For) and t.kind == "thread")
           for t in L.walk(a.body + b.body)):
        return None
    if _copy_only(a.body) or _copy_only(b.body):
        return None
    a_sets = set(L.assigned(a.body)) | {a.var.name}
    for s in inits:  # moved before `a`: independent of it
        if s.var.name in a_sets or s.var.name in _reads_locals(a.body) \
                or L.names(s.value) & a_sets or _loads(s.value) & _stores(a.body):
            return None
    body_b = _rename(b.body, b.var, a.var)
    if not _single(a):
        b_sets = set(L.assigned(body_b)) - {a.var.name}
        if (a_sets - {a.var.name}) & (_reads_locals(body_b) | b_sets) \
                or b_sets & _reads_locals(a.body):
            return None
        if not _same_iteration(a.body, body_b, a.var):
            return None
        body_b = _forward(a.body, body_b)
        if body_b is None:
            return None
        a_body, body_b = body_b
    else:
        a_body = a.body
    return replace(a, body=tuple(a_body) + tuple(body_b))


def _copy_only(body: tuple) -> bool:
    """Whether ``body`` only copies elements unchanged (``B[i] = A[i]``): a
    staging copy (``Schedule.stage_loads``), which ``async_copy.py`` makes an
    asynchronous copy that never passes through registers. Fused with its
    consumer it would be a load and a store of every element instead."""
    return bool(body) and all(isinstance(t, L.Store) and isinstance(t.value, L.Load)
                              and t.value.buf.dtype == t.buf.dtype for t in body)


def _rename(body: tuple, old: L.LVar, new: L.LVar) -> tuple:
    def fe(x: Any) -> Any:
        if isinstance(x, L.Ref) and x.var.name == old.name:
            return L.Ref(new)
        if isinstance(x, L.IExpr):
            return L.IExpr(E.rename(x.e, {old.name: new.name}))
        if isinstance(x, L.IPred):
            return L.IPred(E.rename(x.p, {old.name: new.name}))
        return None

    return L.map_stmts(body, fe)


def _reads_locals(body: tuple) -> set[str]:
    out: set[str] = set()
    for t in L.walk(body):
        for x in L.stmt_exprs(t):
            out |= L.names(x)
        if isinstance(t, L.For):
            out |= L.names(L.IExpr(t.lo)) | L.names(L.IExpr(t.hi))
    return out


def _loads(x: Any) -> set[str]:
    return {y.buf.name for y in L.subexprs(x) if isinstance(y, L.Load)}


def _stores(body: tuple) -> set[str]:
    return {t.buf.name for t in L.walk(body) if isinstance(t, L.Store)}


def _accesses(body: tuple) -> list[tuple[str, Any]]:
    """(buffer name, index) of every load and store of ``body``."""
    out = [(t.buf.name, t.index) for t in L.walk(body) if isinstance(t, L.Store)]
    for y in L.evaluated(body):
        if isinstance(y, L.Load):
            out.append((y.buf.name, y.index))
    return out


def _injective(index: Any, var: L.LVar) -> bool:
    """Whether ``index`` is ``c var + rest`` with ``c`` a nonzero constant and
    ``rest`` free of ``var``."""
    if not isinstance(index, L.IExpr):
        return False
    v = E.Var(var.name)
    e0, e1, e2 = (E.subst(index.e, {v: n}) for n in (0, 1, 2))
    c = E.add(e1, E.mul(-1, e0))
    return (isinstance(c, E.Const) and c.value != 0 and E.add(e2, E.mul(-2, c)) == e0
            and var.name not in {x.name for x in E.leaves(e0) if isinstance(x, (E.Var, E.Val))})


def _same_iteration(a: tuple, b: tuple, var: L.LVar) -> bool:
    """Every buffer written by one body and accessed by the other is accessed
    at a single index, injective in ``var``, by both."""
    acc_a, acc_b = _accesses(a), _accesses(b)
    shared = ((_stores(a) & {n for n, _ in acc_b}) | (_stores(b) & {n for n, _ in acc_a}))
    for name in shared:
        idx = {str(i) for n, i in acc_a + acc_b if n == name}
        one = next(i for n, i in acc_a + acc_b if n == name)
        if len(idx) != 1 or not _injective(one, var):
            return False
    return True


def _forward(a: tuple, b: tuple) -> tuple[tuple, tuple] | None:
    """Store-to-load forwarding from the top-level unguarded stores of ``a``
    to the loads of ``b`` at the same index: each such store's value goes
    through a fresh local that ``b`` reads instead."""
    fwd: dict[tuple[str, str], L.LVar] = {}
    new_a: list = []
    for t in a:
        if isinstance(t, L.Store) and t.guard is None and t.mode != "async":
            key = (t.buf.name, str(t.index))
            if key in fwd:  # stored twice: forward neither
                return a, b
            v = L.LVar(f"fwd.{next(_ids)}", t.buf.dtype)
            fwd[key] = v
            new_a += [L.Assign(v, t.value), replace(t, value=L.Ref(v))]
        else:
            new_a.append(t)
    if not fwd or any((t.buf.name, str(t.index)) in fwd for t in L.walk(b)
                      if isinstance(t, L.Store)):
        return a, b

    def fe(x: Any) -> Any:
        if isinstance(x, L.Load) and x.guard is None:
            v = fwd.get((x.buf.name, str(x.index)))
            return L.Ref(v) if v is not None else None
        return None

    return tuple(new_a), L.map_stmts(b, fe)
