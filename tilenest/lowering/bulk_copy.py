"""Bulk tensor copies of staged tiles (SIMT form, ``Schedule.tma``).

The lowering marks the loop nest that copies a box of a dense tensor into a
swizzled shared tile (a ``wgmma`` operand, ``Lowerer.bulk_copy``) with a
:class:`~tilenest.lowering.loopir.BulkCopy` permission, which the SIMT form
keeps on the thread loop it becomes and the ring of ``double_buffer.py``
keeps on each version's producer. Once every rewrite is done,
:func:`bulk_copies` settles which permissions stand and what the kernel
needs to honour them:

* a permission stands on a ``thread`` loop whose only store is an
  asynchronous one (``Store.mode == "async"``) into the permission's tile --
  the copy then completes, as the element stores it replaces would, at the
  barrier that orders its group (``Barrier.keep``), so every obligation the
  barrier proof discharged over the element stores holds for the bulk copy;
  anything else loses its permission (the element copies stay);
* a kernel with a standing permission gets one ``shared`` buffer of
  *completion barriers* (:data:`BARRIERS`, 8 bytes each): the copies of the
  group committed at the ``g``-th block barrier of a phase signal barrier
  ``g mod M``, and a block barrier whose ``keep`` is ``N`` waits, in every
  thread, for the groups up to ``g - N`` (on ``cuda``: ``mbarrier`` phases,
  parity ``(g / M) mod 2``). A barrier is reused by group ``g + M`` only
  after group ``g`` has been waited for -- which the ``M > max keep`` of
  :func:`barrier_count` guarantees: group ``g`` is waited for by barrier
  ``g + max keep`` at the latest, and group ``g + M`` is first touched after
  barrier ``g + M - 1``. That inequality is the ``tma.phases`` obligation
  (``proofs/gpu.py``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..semantics import dtypes as D
from ..semantics import expr as E
from . import loopir as L

#: the name of the completion barriers' shared buffer
BARRIERS = "%tma.bars"


def standing(s: Any) -> bool:
    """Whether ``s`` is a thread loop whose bulk-copy permission stands (module doc)."""
    if not (isinstance(s, L.For) and s.kind == "thread" and s.bulk is not None):
        return False
    stores = [x for x in L.walk(s.body) if isinstance(x, L.Store)]
    return (len(stores) == 1 and stores[0].mode == "async"
            and stores[0].buf.name == s.bulk.dst.name
            and isinstance(stores[0].value, L.Load) and stores[0].value.buf.name == s.bulk.src.name
            and not any(isinstance(x, (L.Barrier, L.WarpMma, L.Shuffle, L.LaneReduce))
                        for x in L.walk(s.body)))


def max_keep(k: L.Kernel) -> int:
    """The largest ``keep`` of a block barrier of ``k``."""
    return max((s.keep for ph in k.phases for s in L.walk(ph.body) if L.is_block_barrier(s)),
               default=0)


def barrier_count(k: L.Kernel) -> int:
    """Completion barriers a kernel with bulk copies needs: ``max keep + 1``."""
    return max_keep(k) + 1


def bulk_copies(k: L.Kernel) -> L.Kernel:
    """``k`` with only standing permissions, and its completion barriers
    (module docstring) when any stands."""
    kept = False

    def fs(s: Any) -> Any:
        nonlocal kept
        if isinstance(s, L.For) and s.bulk is not None:
            if standing(s):
                kept = True
                return None
            return (replace(s, bulk=None),)
        return None

    phases = tuple(replace(ph, body=L.map_stmts(ph.body, lambda x: None, fs)) for ph in k.phases)
    k = replace(k, phases=phases)
    if not kept:
        return k
    bars = L.Buffer(BARRIERS, D.i64, "shared", E.Const(barrier_count(k)))
    return replace(k, locals=k.locals + (bars,))
