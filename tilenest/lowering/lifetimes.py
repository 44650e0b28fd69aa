"""Shared buffers whose lifetimes are disjoint share one storage (SIMT form).

Two shared buffers ``X`` and ``Y`` of one phase, where every access of ``X``
lies in top-level statements before every access of ``Y``, with a plain block
barrier between the last of the one and the first of the other::

    ... X accessed ...             -- statements up to p
    barrier (keep 0, mma_keep 0)   -- somewhere in (p, q)
    ... Y accessed ...             -- statements from q on

can be one buffer: ``Y``'s accesses are renamed to ``X`` and ``Y`` is
dropped. The barrier completes every earlier access of ``X`` -- other
threads' reads, asynchronous copies into it, warpgroup mmas reading it --
before any access of ``Y``, so ``Y``'s first writes cannot overtake them, and
nothing reads ``X``'s contents after them. Each top-level statement of a
phase runs once per program, in order, and consecutive programs of a block
are separated by a barrier (the emitter's grid-stride loop), so program
order gives the same order at run time.

A kernel with two key loops over one ring each (attention split into the
key blocks that need no mask and those that do) keeps one ring instead of
two: the second ring was 64 KB of a 64 x 64 bf16 attention block's 148 KB,
and without it two blocks fit a multiprocessor instead of one.

Conditions: both ``shared``, one dtype and one layout (a swizzled tile keeps
its swizzle), sizes equal or both constants (the merged buffer takes the
larger); neither is touched by another phase. A warp-specialized loop
(``For.roles``) is one top-level statement like any other: its producer runs
ahead of the consumers only within the loop, which it enters past every
barrier before it and leaves only when its last copies have been consumed,
the consumers having completed their mmas (``roles.*``; a block barrier
follows every such loop, ``warp_roles.py``), so the barrier between the two
lifetimes orders its accesses as it orders any other's. The
barrier proof (``proofs/barriers.py``, discharged by every compile for a
SIMT target) checks the rewritten kernel, so a merge that let one access
overtake another would be refuted, not trusted.
"""

from __future__ import annotations

from dataclasses import replace

from ..semantics import expr as E
from . import loopir as L
from .inplace import merge_while, touched


def share_disjoint(k: L.Kernel) -> L.Kernel:
    """``k`` with each pair of shared buffers of disjoint lifetimes (module
    doc) merged into the earlier one, one pair at a time until none is left."""
    return merge_while(k, _candidate)


def _candidate(k: L.Kernel) -> tuple[L.Buffer, L.Buffer] | None:
    """A pair ``(Y, X')``: ``Y`` may take the storage of ``X``, ``X'`` being
    ``X`` sized for both; or None."""
    shared = {b.name: b for b in k.locals if b.space == "shared"}
    where = [[touched(s) for s in ph.body] for ph in k.phases]
    phases: dict[str, set[int]] = {}
    for i, w in enumerate(where):
        for d in w:
            for n in d:
                phases.setdefault(n, set()).add(i)
    for i, ph in enumerate(k.phases):
        span: dict[str, tuple[int, int]] = {}
        for p, d in enumerate(where[i]):
            for n in d:
                if n in shared and phases[n] == {i}:
                    first, _ = span.get(n, (p, p))
                    span[n] = (first, p)
        order = sorted(span, key=lambda n: span[n])
        for x in order:
            for y in order:
                if span[x][1] >= span[y][0] or not _compatible(shared[x], shared[y]):
                    continue
                between = ph.body[span[x][1] + 1:span[y][0]]
                if any(_complete(s) for s in between):
                    return shared[y], _sized_for_both(shared[x], shared[y])
    return None


def _compatible(x: L.Buffer, y: L.Buffer) -> bool:
    """Whether ``y``'s elements may live in ``x``'s storage: one dtype, one
    layout, sizes equal or both known."""
    if x.dtype != y.dtype or x.layout != y.layout:
        return False
    return x.size == y.size or (isinstance(x.size, E.Const) and isinstance(y.size, E.Const))


def _complete(s: object) -> bool:
    """Whether ``s`` is a block barrier completing every earlier access, the
    asynchronous copies and overlapped mmas included."""
    return L.is_block_barrier(s) and s.keep == 0 and s.mma_keep == 0  # type: ignore[attr-defined]


def _sized_for_both(x: L.Buffer, y: L.Buffer) -> L.Buffer:
    """``x``, grown to ``y``'s size where that is larger (both constant)."""
    if x.size == y.size:
        return x
    return replace(x, size=E.Const(max(x.size.value, y.size.value)))  # type: ignore[attr-defined]
