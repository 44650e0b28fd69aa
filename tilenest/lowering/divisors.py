"""Float divisions by a divisor that keeps its value along a loop.

A float division ``a / b`` (f32; f16 and bf16 computed in f32) whose divisor
has the same value in every iteration of the innermost loop around it can be
computed from one reciprocal of ``b`` prepared before the loop: ``y = 1/b``,
``q0 = a y``, ``r = fma(-b, q0, a)``, ``q = fma(r, y, q0)`` is the IEEE
quotient whenever ``|a|`` lies in a range that depends on ``b``'s exponent
alone (spec/lowering.md L-6, *Division by a shared divisor*), and ``a / b``
is used outside it. Every backend asks :func:`shared_divisors` which
divisors qualify; the choice changes speed only, never a value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import loopir as L


def float_division(x: Any) -> bool:
    """Whether ``x`` is a division computed in float (f32, f16, bf16)."""
    return (isinstance(x, L.Bin) and x.op == "div" and x.a.dtype.is_float
            and x.a.dtype.name != "f64")


class LoopFacts:
    """What :func:`invariant` asks of a loop, gathered once: the locals it
    assigns (its variable included), the buffers it stores, and whether it
    holds a barrier or a matrix-unit step."""

    def __init__(self, loop: L.For):
        inner = list(L.walk(loop.body))
        self.assigned = set(L.assigned(loop.body)) | {loop.var.name}
        self.stored = {st.buf.name for st in inner if isinstance(st, L.Store)}
        self.syncs = any(isinstance(st, (L.Barrier, L.WarpMma)) for st in inner)


def invariant(x: Any, loop: LoopFacts, may_alias: Callable[[str, str], bool]) -> bool:
    """Whether expression ``x`` has the same value in every iteration of the
    loop ``loop`` describes (conservatively: see :func:`shared_divisors`;
    ``may_alias(a, b)``: whether buffers ``a`` and ``b`` may share memory)."""
    if L.names(x) & loop.assigned:
        return False
    reads = {y.buf.name for y in L.subexprs(x) if isinstance(y, L.Load)}
    return not reads or not (loop.syncs or any(may_alias(r, w) for r in reads
                                               for w in loop.stored))


def shared_divisors(k: L.Kernel, restrict: bool = True,
                    aliased: frozenset[str] = frozenset()) -> frozenset:
    """Divisors of float divisions (f32, f16, bf16: computed in float) that
    keep their value over the iterations of the innermost loop around every
    division they divide: worth one reciprocal of the divisor, from which
    every quotient is still the IEEE one (L-6), prepared once per loop. The
    choice is one of speed only. A divisor counts as invariant in a
    ``serial`` or ``vector`` loop when the loop assigns none of the locals it
    reads and, where it reads memory, stores to no buffer that may be one it
    reads (the same buffer; with ``restrict`` off or both among ``aliased``,
    any other parameter too) and holds no barrier and no matrix-unit step; a
    division directly under a thread, parallel or while loop (one iteration
    per thread, or unknown) does not count."""
    params = {p.name for p in k.params}

    def may_alias(a: str, b: str) -> bool:
        if a == b:
            return True
        both = a in params and b in params
        return both and (not restrict or (a in aliased and b in aliased))

    known: dict[int, LoopFacts] = {}  # by id: every loop lives as long as k

    def facts(loop: L.For) -> LoopFacts:
        if id(loop) not in known:
            known[id(loop)] = LoopFacts(loop)
        return known[id(loop)]

    good: set = set()
    bad: set = set()
    for ph in k.phases:
        for s, path in L.walk_paths(ph.body):
            divs = [y for x in L.stmt_exprs(s) for y in L.subexprs(x) if float_division(y)]
            if not divs:
                continue
            loops = [p for p in path if isinstance(p, (L.For, L.While))]
            loop = loops[-1] if loops else None
            for d in divs:
                ok = (isinstance(loop, L.For) and loop.kind in ("serial", "vector")
                      and invariant(d.b, facts(loop), may_alias))
                (good if ok else bad).add(d.b)
    return frozenset(good - bad)
