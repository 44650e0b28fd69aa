"""Fusion of loops over one range: the legality every backend shares, and the
SIMT form's fusion of row folds with the row statements after them.

**Legality** (:func:`fusable`, :func:`independent`). Before fusion every
iteration of the first loop runs before every iteration of the second;
after it, iteration ``j`` of the second runs before iteration ``i > j`` of
the first. That changes nothing when no access of the second loop at ``j``
conflicts with one of the first at another iteration: each buffer one loop
writes and the other touches is accessed by both at one index expression
(the same after renaming), affine in the loop variable with a nonzero
coefficient -- so an element is touched by one iteration of each loop, the
same one, where the order is the original -- and no local that one loop
assigns is read or assigned by the other. Two distinct buffers that may
share storage (aliased parameters) count as one. A statement may move past
a loop when neither writes what the other touches (buffers and locals).
The CPU backend fuses its consecutive vector loops with these rules
(``backends/llvm/fusion.py``).

**Row folds and their row statements** (:func:`fuse_row_nests`, the SIMT
form before distribution). A tile's row reduction is a ``vector`` nest over
the rows whose body folds each row (``acc = init; for j: acc = op(acc,
..); out[i] = acc``); the statements that use the result are often more
nests over the same rows (attention: ``m_new = max(m, rowmax)``, ``alpha =
exp(m - m_new)``; after the row sum, the new denominator and the copies of
the running state). Distributed one by one, each is a thread loop of its
own with a block barrier before the next. Fused into the fold's nest --
a nest over the same constant range of rows, loops of extent 1 aside,
whose body is assignments and stores only, moved up past statements it is
independent of -- they run in the same iteration as the fold, by the thread
(or, for a fold in registers, the quad) that finished the row
(``fragments.RowFold``'s statements after the fold).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..semantics import expr as E
from . import loopir as L
from .fragments import squeeze


def substitute(old: L.LVar, new: L.LVar | E.Expr) -> Callable[[Any], Any]:
    """A :func:`loopir.map_stmts` callback replacing the loop variable
    ``old`` by the variable or index expression ``new``."""
    e = E.Var(new.name) if isinstance(new, L.LVar) else new
    m = {E.Var(old.name): e}

    def f(x: Any) -> Any:
        if isinstance(x, L.IExpr):
            return L.IExpr(E.subst(x.e, m), x.dtype)
        if isinstance(x, L.IPred):
            return L.IPred(E.subst(x.p, m), x.dtype)
        if isinstance(x, L.Ref) and x.var == old:
            return L.Ref(new) if isinstance(new, L.LVar) else L.IExpr(e)
        return None

    return f


def accesses(body: tuple) -> list[tuple[str, Any, bool]]:
    """``(buffer, index, written)`` for every access of ``body`` (a tensor-core
    collective reads its operands and accumulator and writes the latter,
    at no single index: ``None``)."""
    out = []
    for s in L.walk(body):
        if isinstance(s, L.Store):
            out.append((s.buf.name, s.index, True))
        elif isinstance(s, L.WarpMma):
            out += [(f.buf.name, None, False) for f in (s.a, s.b)]
            out.append((s.c.buf.name, None, True))
        for x in L.stmt_exprs(s):
            out += [(y.buf.name, y.index, False) for y in L.subexprs(x) if isinstance(y, L.Load)]
    return out


def local_uses(body: tuple) -> tuple[set[str], set[str]]:
    """(locals assigned, locals read) by ``body``."""
    return set(L.assigned(body)), L.referenced(body)


def fusable(var: L.LVar, a: tuple, b: tuple, alias: Callable[[str, str], bool]) -> bool:
    """Whether bodies ``a`` and ``b`` of loops over one variable ``var`` may
    run as one loop (module doc: every conflicting pair of accesses at one
    index, injective in ``var``; no local passed between them)."""
    (wa, ra), (wb, rb) = local_uses(a), local_uses(b)
    if wa & (wb | rb) or wb & ra:
        return False
    x = E.Var(var.name)
    acc_a, acc_b = accesses(a), accesses(b)
    for na, ia, sa in acc_a:
        for nb, ib, sb in acc_b:
            if not (sa or sb) or not alias(na, nb):
                continue
            if na != nb or ia != ib or not isinstance(ia, L.IExpr) or not E.stride(ia.e, x):
                return False
    return True


def independent(s: Any, loop: L.For, alias: Callable[[str, str], bool]) -> bool:
    """Whether statement ``s`` and ``loop`` may swap places: ``s`` is an
    assignment, a store, a tensor-core collective or a loop of them (a
    check keeps its place, so the error a run reports stays the first one it
    meets), no local one assigns is read or assigned by the other, and no
    buffer one writes is touched by the other."""
    if not all(isinstance(x, (L.Assign, L.Store, L.For, L.WarpMma, L.Comment))
               for x in L.walk((s,))):
        return False
    (ws, rs), (wl, rl) = local_uses((s,)), local_uses((loop,))
    if ws & (wl | rl) or wl & rs:
        return False
    theirs = accesses((loop,))
    return not any((sa or sb) and alias(na, nb)
                   for na, _, sa in accesses((s,)) for nb, _, sb in theirs)


# ---------------------------------------------------------------------------
# row folds and the row statements after them (SIMT form)


def _same(a: str, b: str) -> bool:
    return a == b


def _row_nest(s: Any, nest: Callable) -> tuple[L.For, dict, tuple] | None:
    """``(row loop, unit loop values, innermost body)`` of a ``vector`` nest
    with one loop of extent other than 1, over a constant range, whose body
    runs no thread loop, collective, ``while`` or check; else None."""
    if not (isinstance(s, L.For) and s.kind == "vector" and not s.reverse):
        return None
    loops, inner = nest(s)
    kept, values = squeeze(loops)
    if len(kept) != 1 or not (isinstance(kept[0].lo, E.Const) and isinstance(kept[0].hi, E.Const)):
        return None
    if not all(isinstance(t, (L.Assign, L.Store, L.For)) and not (
            isinstance(t, L.For) and t.kind == "thread") for t in L.walk(inner)):
        return None
    return kept[0], {lp.var: lp.lo for lp in loops if E.Var(lp.var.name) in values}, inner


def _squeezed(row: L.For, units: dict, inner: tuple) -> tuple:
    """``inner`` with each unit loop's variable replaced by its value."""
    for v, lo in units.items():
        inner = L.map_stmts(inner, substitute(v, lo))
    return inner


def _is_fold(inner: tuple) -> bool:
    """A row fold's body: accumulators started by assignments, one loop
    whose body only updates them (``acc = op{reassoc}(acc, c)``), then
    assignments and stores."""
    loops = [k for k, t in enumerate(inner) if isinstance(t, L.For)]
    if len(loops) != 1:
        return False
    pre, fold, post = inner[:loops[0]], inner[loops[0]], inner[loops[0] + 1:]
    if fold.kind not in ("serial", "vector") or fold.reverse or fold.tree is not None:
        return False
    if not all(isinstance(t, L.Assign) for t in pre) or not all(
            isinstance(t, (L.Assign, L.Store)) for t in post):
        return False
    started = {t.var.name for t in pre}
    for t in fold.body:
        b = t.value if isinstance(t, L.Assign) else None
        if not (isinstance(b, L.Bin) and "reassoc" in b.flags and t.var.name in started
                and isinstance(b.a, L.Ref) and b.a.var.name == t.var.name
                and t.var.name not in L.names(b.b)):
            return False
    return True


def fuse_row_nests(body: tuple, nest: Callable) -> tuple:
    """``body`` (a phase body in sequential SIMT form, nested statement lists
    included) with each row fold's nest fused with the row nests after it
    (module doc). ``nest`` is ``simt._nest``."""

    def rec(s: Any) -> Any:
        if isinstance(s, L.For) and s.kind != "vector":
            return replace(s, body=fuse_row_nests(s.body, nest))
        if isinstance(s, L.If):
            return replace(s, then=fuse_row_nests(s.then, nest),
                           orelse=fuse_row_nests(s.orelse, nest))
        return s

    out = [rec(s) for s in body]
    i = 0
    while i < len(out):
        got = _row_nest(out[i], nest)
        if got is None or not _is_fold(got[2]):
            i += 1
            continue
        row, units, inner = got
        a = _squeezed(row, units, inner)
        for j in range(i + 1, len(out)):
            other = _row_nest(out[j], nest)
            if other is None or (other[0].lo, other[0].hi) != (row.lo, row.hi) \
                    or any(isinstance(t, L.For) for t in other[2]):
                continue
            if not all(independent(x, out[j], _same) for x in out[i + 1:j]):
                continue
            b = L.map_stmts(_squeezed(*other), substitute(other[0].var, row.var))
            if not fusable(row.var, a, b, _same):
                continue
            a = a + b
            del out[j]
            break
        else:
            i += 1
            continue
        out[i] = replace(row, body=a)  # fused: try the next row nest too
    return tuple(out)
