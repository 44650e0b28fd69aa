"""Software prefetch of the next program's rows.

A phase runs its body for program ids ``pid = lo, lo + 1, ...`` on each
worker. A row kernel (softmax, a norm) reads its row in a first pass straight
from memory and then works on it from the cache while writing its output, so
its reads and its writes do not overlap as they do in a plain copy. Here the
last ``for.vector`` loop of the body that reads a kernel argument at an index
moving with the program id also asks for the same element of the next
program (the index with ``pid + 1``), one prefetch per vector step, into the
second-level cache: the next program's first pass then finds its row there.
Only rows read by two passes or more are prefetched: a single pass streams
its row once, which the processor's own prefetchers follow.

A prefetch is a hint with no effect on meaning (it reads nothing the program
observes, cannot fault, and may be dropped by the processor), so any choice
here is safe; only speed depends on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...lowering import loopir as L
from ...semantics import expr as E
from ...semantics.expr import stride


@dataclass(frozen=True)
class Prefetch:
    """Prefetch ``buf[index]`` (``index`` already moved to the next program)
    at each vector step of the loop it is attached to."""

    buf: L.Buffer
    index: E.Expr


def plan(ph: L.Phase, arguments: frozenset[str]) -> dict[str, tuple[Prefetch, ...]]:
    """Loop-variable name -> the prefetches its vector steps issue, for the
    phase ``ph`` whose kernel arguments are the buffers named ``arguments``."""
    pid = E.Var(ph.pid.name)
    ids = {pid}
    for s in ph.body:  # locals that hold the program id itself (``p = pid``)
        if isinstance(s, L.Assign) and isinstance(s.value, L.IExpr) and s.value.e == pid:
            ids.add(E.Var(s.var.name))
    last: dict[str, tuple[str, Prefetch]] = {}
    passes: dict[str, int] = {}

    def visit(body: tuple) -> None:
        for s in body:
            if isinstance(s, L.For):
                if s.kind == "vector" and not s.reverse:
                    x = E.Var(s.var.name)
                    read = set()
                    for ld in loads(s.body):
                        p = _moved(ld, x, ids, arguments)
                        if p is not None:
                            last[ld.buf.name] = (s.var.name, p)
                            read.add(ld.buf.name)
                    for name in read:
                        passes[name] = passes.get(name, 0) + 1
                visit(s.body)
            elif isinstance(s, L.If):
                visit(s.then)
                visit(s.orelse)
            elif isinstance(s, L.While):
                visit(s.pre)
                visit(s.body)

    visit(ph.body)
    out: dict[str, list[Prefetch]] = {}
    for name, (var, p) in last.items():
        if passes[name] >= 2:
            out.setdefault(var, []).append(p)
    return {v: tuple(ps) for v, ps in out.items()}


def _moved(ld: L.Load, x: E.Var, ids: set, arguments: frozenset[str]) -> Prefetch | None:
    """The prefetch of the next program's element for ``ld``, when ``ld``
    reads a kernel argument at a unit-stride index in ``x`` that depends on
    the program id (through one variable holding it)."""
    if ld.buf.name not in arguments or not isinstance(ld.index, L.IExpr):
        return None
    e = ld.index.e
    if stride(e, x) != 1:
        return None
    moving = [v for v in ids if v in E.leaves(e)]
    if len(moving) != 1:
        return None
    v = moving[0]
    return Prefetch(ld.buf, E.subst(e, {v: E.add(v, 1)}))


def loads(x: Any) -> list[L.Load]:
    """Every load in the statements or expression ``x`` (not in nested loops:
    those are visited as loops of their own)."""
    out: list[L.Load] = []

    def walk(y: Any) -> None:
        if isinstance(y, L.Load):
            out.append(y)
        if isinstance(y, L.For):
            return
        if isinstance(y, tuple):
            for z in y:
                walk(z)
        elif hasattr(y, "__dataclass_fields__"):
            for f in y.__dataclass_fields__:
                walk(getattr(y, f))

    walk(x)
    return out
