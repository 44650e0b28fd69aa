"""Warp-specialized rings (SIMT form, ``Schedule.warp_roles``).

The overlapped ring of ``double_buffer.py`` runs every thread through two
block barriers per step: one so that the step's tiles have landed before
the consumers' warpgroup mmas read them, one so that every mma of the
previous step is complete before its version is refilled. When the
producers are all bulk tensor copies (``bulk_copy.py``: one thread issues
them) and the consumer touches shared memory only through those mmas, the
two roles can instead run on different warps and hand each version over
through completion barriers, as Hopper GEMMs do: the block gets one more
warp, which issues the copies of step ``i`` as soon as the consumers have
released the version it overwrites, while the consumers wait only for the
copies of the step they are about to read.

:func:`warp_roles` rewrites such a ring -- the prologue of its first
``S - 1`` producer steps and the loop

    for i in [lo, hi):
        barrier keep=S-2 mma_keep=1;  C(i);  barrier keep=S-2 mma_keep=1
        if i + S - 1 < hi: P(i + S - 1)

-- into one loop in the *meaning* form of a :class:`~.loopir.Roles` permission

    for i in [lo, hi) roles(...):
        if i < hi: P(i)
        barrier block
        C(i)
        barrier block

whose body, run as written, is a plain sequential ring (every copy complete
before the mmas read it, every mma complete before the next copy): the
barrier proof discharges it as it stands. The permission's handshake is what
lets the target overlap the roles (``loopir.Roles``); its obligations are
``roles.*`` in ``proofs/gpu.py``. The kernel's completion barriers for the
ring (:data:`ROLE_BARRIERS`: ``S`` *full* then ``S`` *empty* ones) replace
those of the block-barrier groups, which the kernel keeps only for bulk
copies outside a specialized ring.

Asked for explicitly (``plain``: ``Schedule.warp_roles=True``), the ring on
one barrier a step (``barrier keep=S-2; if k + S - 1 < hi: P(k + S - 1);
C(k)``, any ``S >= 2``) is rewritten into the same meaning form when its
consumer, besides warpgroup mmas into registers on the ring's tiles (the
first operand may also be in registers or a shared tile the loop never
writes), only computes in the lanes' registers -- attention's softmax
between its two products. Its mmas complete within the step
(``mma_waits.py`` places the waits on the meaning form), so the permission
releases each step itself (``release_lag = release_keep = 0``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..errors import NotAvailableError
from ..semantics import dtypes as D
from ..semantics import expr as E
from . import loopir as L
from .bulk_copy import BARRIERS, barrier_count, standing
from .double_buffer import at_step

#: the name of the specialized rings' completion barriers (``full`` slots,
#: then ``empty`` slots)
ROLE_BARRIERS = "%roles.bars"
#: threads of the producer role: one warp (only its first lane issues)
PRODUCERS = 32


def in_roles(k: L.Kernel) -> set[int]:
    """``id`` of every statement nested in a specialized ring's body."""
    return {id(x) for ph in k.phases for s in L.walk(ph.body)
            if isinstance(s, L.For) and s.roles is not None for x in L.walk(s.body)}


def _why_not(loop: L.For, stages: int, plain: bool) -> tuple[str | None, str]:
    """Why ``loop`` is not a ring whose producers are bulk copies and whose
    consumer touches its tiles only through warpgroup mmas (None: it is
    one), and its form: ``"overlapped"`` (the consumer only runs overlapped
    mmas, completed one step late) or, with ``plain``, ``"plain"`` (the
    ring of ``double_buffer.py`` on one barrier a step, whose consumer also
    computes in the lanes' registers and completes its mmas in the step:
    attention's key loop)."""
    b = loop.body
    if loop.kind != "serial" or len(b) < 3:
        return "not a ring loop", ""
    ahead = stages - 1
    if not any(isinstance(x, L.Store) and x.mode == "async" for x in L.walk(b)):
        return ("its tiles are not kept in versions (no ring of double_buffer.py: "
                "Schedule.stages, and a loop whose producers and consumer are its own)"), ""
    top = b[0]
    if (len(b) >= 4 and L.is_block_barrier(top) and L.is_block_barrier(b[-2])
            and top.mma_keep == 1 and b[-2].mma_keep == 1 and top.keep == b[-2].keep == ahead - 1):
        form, produce, consume = "overlapped", b[-1], b[1:-2]
    elif (plain and L.is_block_barrier(top) and top.keep == ahead - 1 and not top.mma_keep
          and isinstance(b[1], L.If)):
        form, produce, consume = "plain", b[1], b[2:]
    else:
        return ("not an overlapped ring (stages >= 3, a warpgroup mma into registers)"
                + ("" if plain else "; a ring on one barrier a step needs warp_roles=True"
                   " and stages given")), ""
    if not (isinstance(produce, L.If) and not produce.orelse and produce.then
            and all(standing(s) for s in produce.then)):
        return "its producers are not all bulk tensor copies (Schedule.tma, L-11)", form
    ring = {s.bulk.dst.name for s in produce.then}
    written = {t.buf.name for t in L.walk(b) if isinstance(t, L.Store)}
    for s in L.walk(consume):
        if isinstance(s, L.Barrier) and (form == "overlapped" or L.is_block_barrier(s)):
            return f"its consumer meets a {s.scope} barrier", form
        if isinstance(s, L.While) or (form == "overlapped" and isinstance(
                s, (L.Store, L.Shuffle, L.LaneReduce))):
            return f"its consumer does more than warpgroup mmas ({type(s).__name__})", form
        if isinstance(s, L.Store) and s.buf.space != "local":
            return f"its consumer stores into {s.buf.name} ({s.buf.space})", form
        if isinstance(s, L.WarpMma):
            ok = s.group > 1 and s.c.lane_cols and s.b.buf.name in ring
            if form == "overlapped":
                ok = ok and s.overlap and s.a.buf.name in ring
            else:  # the first operand in registers, a ring tile, or one the loop never writes
                ok = ok and not s.overlap and (
                    s.a.lane_cols or s.a.buf.name in ring or (
                        s.a.buf.space == "shared" and s.a.buf.name not in written))
            if not ok:
                return ("its consumer's mma is not a warpgroup mma into registers on the "
                        "ring's tiles"), form
    if not any(isinstance(s, L.WarpMma) for s in L.walk(consume)):
        return "its consumer runs no mma", form
    for x in L.evaluated(consume):
        if isinstance(x, L.Load) and (x.buf.space == "shared" or (
                form == "overlapped" and x.buf.space == "global")):
            return f"its consumer reads {x.buf.name} outside its mmas", form
    return None, form


def _prologue(body: list, at: int, loop: L.For, produce: L.If, ahead: int) -> int | None:
    """The index in ``body`` where the ring's prologue before ``body[at]``
    (``loop``) starts: ``ahead`` groups ``if lo + j < hi: P(lo + j)`` separated
    by block barriers, each equal to ``produce`` at step ``lo + j`` (None
    when the statements before the loop are not that)."""
    i, found = at, 0
    while i > 0 and found < ahead:
        s = body[i - 1]
        if isinstance(s, L.If):
            want = at_step((produce,), loop.var, E.add(loop.lo, ahead - 1 - found))[0]
            if s != want:
                return None
            found += 1
        elif not L.is_block_barrier(s):
            return None
        i -= 1
    return i if found == ahead else None


def _specialize(body: tuple, stages: int, threads: int, plain: bool,
                why: list[tuple[str, str]]) -> tuple:
    """``body`` with every ring at program level specialized."""
    out: list = list(body)
    i = 0
    while i < len(out):
        s = out[i]
        if isinstance(s, L.For) and s.kind != "thread" and s.roles is None:
            reason, form = _why_not(s, stages, plain)
            if reason is None and not (i + 1 < len(out) and L.is_block_barrier(out[i + 1])
                                       and not out[i + 1].keep and not out[i + 1].mma_keep):
                # the roles meet again there: a later ring starts with nothing in flight
                reason = "no block barrier completes it"
            if reason is None:
                ahead = stages - 1
                produce, consume = ((s.body[-1], s.body[1:-2]) if form == "overlapped"
                                    else (s.body[1], s.body[2:]))
                step = at_step((produce,), s.var, E.add(E.Var(s.var.name), -ahead))[0]
                start = _prologue(out, i, s, step, ahead)
                if start is None:
                    why.append((s.var.name, f"its prologue is not the ring's first {ahead} "
                                            "producer steps"))
                else:
                    # an overlapped consumer's mmas complete a step late (its
                    # release is of the step before, once one group is left in
                    # flight); a plain one's within the step (its own, none left)
                    lag = 1 if form == "overlapped" else 0
                    roles = L.Roles(stages, PRODUCERS, threads, split=1, release_lag=lag,
                                    release_keep=lag)
                    loop = replace(s, body=(step, L.Barrier("block")) + consume
                                   + (L.Barrier("block"),), roles=roles)
                    out[start:i + 1] = [loop]
                    i = start + 1
                    continue
            else:
                why.append((s.var.name, reason))
                out[i] = replace(s, body=_specialize(s.body, stages, threads, plain, why))
        elif isinstance(s, L.If):
            out[i] = replace(s, then=_specialize(s.then, stages, threads, plain, why),
                             orelse=_specialize(s.orelse, stages, threads, plain, why))
        i += 1
    return tuple(out)


def warp_roles(k: L.Kernel, stages: int, threads: int,
               site_of: Callable[[str], Any] | None = None, plain: bool = False) -> L.Kernel:
    """``k`` (SIMT form, bulk copies settled, ``threads`` per block) with every
    qualifying ring specialized (module docstring; ``plain``: rings on one
    barrier a step too); an error naming why when none qualifies, at the
    source sites ``site_of`` gives the loops (by loop-IR variable name)."""
    why: list[tuple[str, str]] = []
    phases = tuple(replace(ph, body=_specialize(ph.body, stages, threads, plain, why))
                   for ph in k.phases)
    k = replace(k, phases=phases)
    if not any(isinstance(s, L.For) and s.roles is not None
               for ph in k.phases for s in L.walk(ph.body)):
        detail = "; ".join(f"loop {v}: {r}" for v, r in why) if why else \
            "it has no loop producing tiles for an mma"
        sites = tuple(x for x in (site_of(v) if site_of else None for v, _ in why)
                      if x is not None)
        raise NotAvailableError(
            f"warp_roles: no ring of {k.name} can be warp-specialized ({detail})", sites,
            hint="warp_roles needs mma_unit='wgmma', tma=True, stages >= 3 and a consumer "
                 "that only runs the warpgroup mma; leave warp_roles off otherwise")
    inside = in_roles(k)
    outside = any(standing(s) for ph in k.phases for s in L.walk(ph.body)
                  if id(s) not in inside)
    locals_ = [b for b in k.locals if b.name != BARRIERS]
    if outside:  # block-barrier groups of the other bulk copies (bulk_copy.py)
        locals_.append(L.Buffer(BARRIERS, D.i64, "shared", E.Const(barrier_count(k))))
    locals_.append(L.Buffer(ROLE_BARRIERS, D.i64, "shared", E.Const(2 * stages)))
    return replace(k, locals=tuple(locals_))
