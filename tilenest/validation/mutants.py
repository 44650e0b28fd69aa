"""Deliberately miscompiled kernels: evidence that validation catches real bugs.

:func:`mutate` rewrites a correct loop-IR kernel into a wrong one of a known
kind, modelling lowering bugs:

* ``flip_index``     -- the first store to a tensor reads its value with the
  innermost loop variable reflected (``v -> lo + hi - 1 - v``): a flipped index;
* ``drop_tail_guard``-- stores to tensors lose their masks: loops restricted
  to the in-view range run over the whole tile and guards become true (the
  ragged tail writes past the view);
* ``reorder_fold``   -- loops that carry a scalar recurrence (a fold) run in the
  opposite direction: a strict fold evaluated in the wrong order;
* ``drop_reduce_seed`` -- an accumulator's initial value becomes 0: the seed
  of a reduction (or a serial carry) is dropped.

:func:`padded` runs a compiled kernel on copies of its arrays embedded in
larger buffers, so the out-of-view writes of a dropped guard land in slack
memory instead of corrupting the heap.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import numpy as np

from ..errors import RuntimeSemanticError
from ..lowering import loopir as L
from ..semantics import expr as E

#: the target whose backend :func:`compile_mutant` builds with (the mutated
#: loop IR runs through the LLVM JIT)
TARGET = "llvm"

MUTATIONS = ("flip_index", "drop_tail_guard", "reorder_fold", "drop_reduce_seed")


def _stores_global(body: tuple) -> bool:
    return any(isinstance(s, L.Store) and s.buf.space == "global" for s in L.walk(body))


def _subst_expr(x: Any, m: dict) -> Any:
    """Substitute index variables inside every index expression of ``x``."""
    if isinstance(x, L.IExpr):
        return L.IExpr(E.subst(x.e, m))
    if isinstance(x, L.IPred):
        return L.IPred(E.subst(x.p, m))
    if isinstance(x, L.Un):
        return replace(x, a=_subst_expr(x.a, m))
    if isinstance(x, L.Bin):
        return replace(x, a=_subst_expr(x.a, m), b=_subst_expr(x.b, m))
    if isinstance(x, L.Fma):
        return L.Fma(*(_subst_expr(y, m) for y in (x.a, x.b, x.c)))
    if isinstance(x, L.Select):
        return L.Select(*(_subst_expr(y, m) for y in (x.c, x.a, x.b)))
    if isinstance(x, (L.Cast, L.Bitcast)):
        return replace(x, a=_subst_expr(x.a, m))
    if isinstance(x, L.Load):
        return replace(x, index=_subst_expr(x.index, m),
                       guard=None if x.guard is None else _subst_expr(x.guard, m),
                       fill=None if x.fill is None else _subst_expr(x.fill, m))
    return x


class _Mutator:
    def __init__(self, kind: str):
        self.kind = kind
        self.done = False

    def body(self, stmts: tuple, loop: L.For | None = None) -> tuple:
        return tuple(self.stmt(s, loop) for s in stmts)

    def stmt(self, s: Any, loop: L.For | None) -> Any:
        k = self.kind
        if isinstance(s, L.For):
            new = replace(s, body=self.body(s.body, s))
            if k == "drop_tail_guard" and _stores_global(s.body):
                new = replace(new, lo=E.Const(0), hi=_tile_extent(s.hi))
                self.done = True
            if k == "reorder_fold" and s.kind == "serial" and not self.done and _carries(s):
                new = replace(new, reverse=not s.reverse)
                self.done = True
            return new
        if isinstance(s, L.If):
            then, orelse = self.body(s.then, loop), self.body(s.orelse, loop)
            if k == "drop_tail_guard" and _stores_global(s.then):
                self.done = True
                return L.If(L.IPred(E.TRUE), then, ())
            return replace(s, then=then, orelse=orelse)
        if isinstance(s, L.While):
            return replace(s, pre=self.body(s.pre, loop), body=self.body(s.body, loop))
        if isinstance(s, L.Store) and s.buf.space == "global":
            if k == "drop_tail_guard" and s.guard is not None:
                self.done = True
                return replace(s, guard=None)
            if k == "flip_index" and not self.done and loop is not None:
                v = E.Var(loop.var.name)
                flipped = loop.lo + loop.hi - 1 - v
                self.done = True
                return replace(s, value=_subst_expr(s.value, {v: flipped}))
        if isinstance(s, L.Assign) and k == "drop_reduce_seed" and not self.done:
            if s.var.name.startswith("acc_") and s.var.dtype.is_float:
                self.done = True
                return replace(s, value=L.Const(0.0, s.var.dtype))
        return s


def _carries(s: L.For) -> bool:
    """Whether the loop body updates a scalar from its own previous value."""
    for t in s.body:
        if isinstance(t, L.Assign) and any(
                isinstance(x, L.Ref) and x.var == t.var for x in L.subexprs(t.value)):
            return True
    return False


def _tile_extent(hi: E.Expr) -> E.Expr:
    """The constant bound inside a ``min(...)`` range end (the whole tile)."""
    if isinstance(hi, E.MinMax):
        for c in (hi.a, hi.b):
            if isinstance(c, E.Const):
                return c
        return _tile_extent(hi.b)
    return hi


def mutate(k: L.Kernel, kind: str) -> L.Kernel:
    """``k`` with one bug of ``kind`` injected (see the module docstring).
    Raises ValueError when the kernel has nothing that mutation applies to."""
    if kind not in MUTATIONS:
        raise ValueError(f"unknown mutation {kind!r}")
    m = _Mutator(kind)
    phases = tuple(replace(ph, body=m.body(ph.body)) for ph in k.phases)
    if not m.done:
        raise ValueError(f"mutation {kind} does not apply to kernel {k.name}")
    return replace(k, phases=phases)


class OutOfBoundsWrite(RuntimeSemanticError):
    """The compiled kernel wrote outside the arrays it was given."""

    kind = "out-of-bounds write"


def padded(fn: Callable, slack: int = 4096) -> Callable:
    """``fn`` run on copies of its arrays placed inside larger buffers
    (``slack`` elements before and after, filled with a canary pattern);
    results are copied back, and a changed canary raises
    :class:`OutOfBoundsWrite` naming the argument."""

    def run(*args: Any, params: dict | None = None, **kw: Any) -> Any:
        inner: list[Any] = []
        bases: list[Any] = []
        for a in args:
            if isinstance(a, np.ndarray):
                base = np.empty(a.size + 2 * slack, dtype=a.dtype)
                base.view(np.uint8)[...] = 0xA5
                view = base[slack:slack + a.size].reshape(a.shape)
                view[...] = a
                inner.append(view)
                bases.append((base, base.copy()))
            else:
                inner.append(a)
                bases.append(None)
        fn(*inner, params=params, **kw)
        for i, (a, v, b) in enumerate(zip(args, inner, bases, strict=True)):
            if isinstance(a, np.ndarray):
                base, before = b
                lo = slice(0, slack)
                hi = slice(slack + a.size, None)
                if (base[lo].tobytes() != before[lo].tobytes()
                        or base[hi].tobytes() != before[hi].tobytes()):
                    raise OutOfBoundsWrite(f"the compiled kernel wrote outside argument {i}")
                a[...] = v
        return None

    return run


def compile_mutant(program: Any, kind: str, schedule: Any = None) -> Callable:
    """A padded callable of ``program`` compiled with bug ``kind``."""
    from ..backends.llvm import build
    from ..lowering import default_schedule, lower_verified

    s = schedule or default_schedule(program)
    k = mutate(lower_verified(program, s), kind)
    return padded(build(program, k, s))
