"""Divisions that depend only on the program, computed once per program (SIMT form).

An index expression that divides by something other than a constant
(``floor(x / y)`` or ``x mod y`` with ``y`` a symbol expression: a GQA
kernel's key head ``h // (HQ // HK)``, a grid coordinate's quotient) costs
a GPU tens of integer instructions -- there is no division unit -- and the
copies of a key loop evaluate it again at every step, in every thread, for
every element group. When such a division reads nothing but the kernel's
symbols and the program's *invariant locals* (the program id, and the
locals assigned once, by an index expression over invariant values, at the
top of the phase body: the grid coordinates), its value is the same at
every evaluation within a program. :func:`hoist_divisions` assigns each
distinct one to a new local at the top of the phase body, right after the
invariant locals it reads, and reads that local wherever the division was.

The meaning is unchanged: the local holds the index expression's value
(``Assign`` of an ``IExpr``: the width proof and the barrier proof see
through it to its definition), and every use lies after the assignment in
program order. The invariant assignments themselves are left as they are
(each runs once per program, and the barrier proof recognizes the grid
coordinates by their expressions).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

from ..semantics import expr as E
from . import loopir as L

#: the name prefix of the hoisted locals
PREFIX = "inv"


def hoist_divisions(k: L.Kernel) -> L.Kernel:
    """``k`` with the program-invariant divisions of every phase computed once
    per program (module docstring)."""
    return replace(k, phases=tuple(_phase(ph) for ph in k.phases))


def _assignments(body: tuple) -> Counter:
    """How many statements of ``body`` (nested ones included) write each local."""
    n: Counter = Counter()
    for st in L.walk(body):
        if isinstance(st, (L.Assign, L.For)):
            n[st.var.name] += 1
        elif isinstance(st, (L.Shuffle, L.LaneReduce)):
            n[st.dst.name] += 1
    return n


def _phase(ph: L.Phase) -> L.Phase:
    writes = _assignments(ph.body)
    #: invariant local -> position of the top-level statement assigning it
    #: (-1: defined before the body, the program id)
    where: dict[str, int] = {ph.pid.name: -1}
    fixed: set[int] = set()  # positions of the invariant assignments

    def invariant(e: E.Expr) -> bool:
        return all(isinstance(lf, E.Sym) or (isinstance(lf, E.Var) and lf.name in where)
                   for lf in E.leaves(e))

    for i, st in enumerate(ph.body):
        if (isinstance(st, L.Assign) and isinstance(st.value, L.IExpr)
                and writes[st.var.name] == 1 and invariant(st.value.e)):
            where[st.var.name] = i
            fixed.add(i)
    hoisted: dict[E.Expr, L.LVar] = {}
    order: list[tuple[int, L.Assign]] = []
    taken = set(L.assigned(ph.body)) | L.referenced(ph.body)

    def fresh() -> L.LVar:
        n = len(hoisted)
        while f"{PREFIX}.h{n}" in taken:
            n += 1
        taken.add(f"{PREFIX}.h{n}")
        return L.LVar(f"{PREFIX}.h{n}", L.INDEX)

    def position(e: E.Expr) -> int:
        return max((where[lf.name] for lf in E.leaves(e) if isinstance(lf, E.Var)), default=-1)

    def expr(e: E.Expr) -> E.Expr:
        if not e.children:
            return e
        e = e.rebuild(tuple(expr(c) for c in e.children))
        if (isinstance(e, (E.FloorDiv, E.Mod)) and not isinstance(e.b, E.Const)
                and invariant(e)):
            v = hoisted.get(e)
            if v is None:
                v = hoisted[e] = fresh()
                at = position(e)
                order.append((at, L.Assign(v, L.IExpr(e))))
                where[v.name] = at
            return E.Var(v.name)
        return e

    def pred(p: Any) -> Any:
        if isinstance(p, E.Cmp):
            return E.cmp(p.op, expr(p.a), expr(p.b))
        if isinstance(p, E.PAnd):
            return E.pand(*(pred(q) for q in p.items))
        if isinstance(p, E.POr):
            return E.por(*(pred(q) for q in p.items))
        if isinstance(p, E.PNot):
            return E.pnot(pred(p.item))
        return p

    def fe(x: Any) -> Any:
        if isinstance(x, L.IExpr):
            return L.IExpr(expr(x.e), x.dtype)
        if isinstance(x, L.IPred):
            return L.IPred(pred(x.p), x.dtype)
        return None

    body = [st if i in fixed else L.map_stmts((st,), fe)[0] for i, st in enumerate(ph.body)]
    if not order:
        return ph
    out: list = [a for at, a in order if at < 0]
    for i, st in enumerate(body):
        out.append(st)
        out.extend(a for at, a in order if at == i)
    return replace(ph, body=tuple(out))
