"""Fusion of consecutive vector loops over one range (a CPU code-generation stage).

A row kernel computes a value over the row in one ``for.vector`` loop and
reduces it in the next (softmax: ``e = exp(x - m)`` then ``sum(e)``;
LayerNorm: ``d = x - mu`` then ``sum(d * d)``). Run one after the other, the
second loop reads back from the cache everything the first one wrote. Fused,
one loop computes each element and adds it to the sum while it is still in
a register: a pass over the row fewer.

The stage rewrites every statement list of a serial kernel (after
``stage_serial``), in two steps:

* A ``serial`` loop of exactly one iteration (``for i in [c, c + 1)``,
  the row loop of a one-row program) becomes its body with ``c`` for ``i``,
  so that the loops of consecutive statements over the row come next to
  each other and index the row alike.
* Two ``for.vector`` loops over the same range ``[lo, hi)``, separated only
  by statements that can move before the first (:func:`independent`), become
  one loop whose body is the first's followed by the second's (its variable
  renamed), when the result is a loop the vector code generator emits as
  vector code at the lane count of each of the two (:func:`.vector.plan`:
  a pure reduction loop, left to LLVM's loop vectorizer, qualifies once it
  is fused with a loop that stores) and the order of every conflicting
  access is kept (:func:`fusable`).

Legality is the rule every backend shares (``lowering/fusion.py``:
conflicting accesses at one index, injective in the loop variable; no local
passed between the loops; statements moved only past what they do not
touch). The vector loops' own promise (iterations independent, reductions only
through ``reassoc`` merges) holds of the fused loop: its accumulations are
the second loop's, each contribution computed from the same values.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ...lowering import loopir as L
from ...lowering.fusion import fusable, independent
from ...lowering.fusion import substitute as _substitute
from ...semantics import expr as E
from .vector import plan, width


def fuse_kernel(k: L.Kernel, vector_bits: int, may_alias: frozenset[str] = frozenset()
                ) -> L.Kernel:
    """``k`` with its vector loops fused where legal and still vector code
    (module doc); ``may_alias``: parameters that may share storage."""
    params = {p.name for p in k.params}

    def alias(a: str, b: str) -> bool:
        return a == b or (a in params and b in params and a in may_alias and b in may_alias)

    f = _Fuser(vector_bits, alias)
    phases = tuple(replace(ph, body=f.body(ph.body)) for ph in k.phases)
    return k if phases == k.phases else replace(k, phases=phases)


class _Fuser:
    def __init__(self, vector_bits: int, alias: Callable[[str, str], bool]):
        self.bits, self.alias = vector_bits, alias

    def body(self, body: tuple) -> tuple:
        out: list = []
        for s in body:
            s = self.nested(s)
            if _single_trip(s):
                out.extend(L.map_stmts(s.body, _substitute(s.var, s.lo)))
            else:
                out.append(s)
        return self.fuse(out)

    def nested(self, s: Any) -> Any:
        if isinstance(s, L.For):
            return replace(s, body=self.body(s.body))
        if isinstance(s, L.If):
            return replace(s, then=self.body(s.then), orelse=self.body(s.orelse))
        if isinstance(s, L.While):
            return replace(s, pre=self.body(s.pre), body=self.body(s.body))
        return s

    def fuse(self, out: list) -> tuple:
        """Fuse each vector loop with the next one over its range, as long
        as the statements between them can move before it (they do)."""
        i = 0
        while i < len(out):
            found = self.partner(out, i)
            if found is None:
                i += 1
                continue
            j, fused = found
            between = out[i + 1:j]
            out[i:j + 1] = [*between, fused]
            i += len(between)  # the fused loop may take a third one
        return tuple(out)

    def partner(self, out: list, i: int) -> tuple[int, L.For] | None:
        """``(j, fused)`` for the loop ``out[j]`` that ``out[i]`` fuses with."""
        first = out[i]
        if not _vector(first):
            return None
        for j in range(i + 1, len(out)):
            s = out[j]
            if _vector(s) and (s.lo, s.hi) == (first.lo, first.hi):
                fused = self.fused(first, s)
                return None if fused is None else (j, fused)
            if not independent(s, first, self.alias):
                return None
        return None

    def fused(self, a: L.For, b: L.For) -> L.For | None:
        """The loop running ``a``'s body then ``b``'s per iteration, or None
        when that may reorder conflicting accesses or would not be vector code."""
        rename = _substitute(b.var, a.var)
        body = a.body + L.map_stmts(b.body, rename)
        if not fusable(a.var, a.body, body[len(a.body):], self.alias):
            return None
        w = plan(a.var, body, self.bits)
        if w is None or w != width(a.var, a.body, self.bits) or w != width(b.var, b.body,
                                                                            self.bits):
            return None  # not vector code, or at fewer lanes than one of the loops
        return replace(a, body=body)


def _vector(s: Any) -> bool:
    return isinstance(s, L.For) and s.kind == "vector" and not s.reverse


def _single_trip(s: Any) -> bool:
    """A serial loop over ``[c, c + 1)``, ``c`` constant."""
    return (isinstance(s, L.For) and s.kind == "serial" and s.tree is None
            and isinstance(s.lo, E.Const) and isinstance(s.hi, E.Const)
            and int(s.hi.value) - int(s.lo.value) == 1)
