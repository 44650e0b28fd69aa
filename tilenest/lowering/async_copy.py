"""Staging copies made asynchronous (SIMT form).

A thread loop that *stages* a global tensor into a shared buffer stores each
element as loaded, nothing computed in between::

    for.thread t in [0, W):
        for r, v ...:
            X[i] = tensor[j]                -- same dtype, X shared

When, between that loop and the next block barrier (``keep = 0``) at the same
level, nothing else reads or writes ``X``, the barrier is the first point at
which any thread may observe the stores, so they may complete at any time
before it: they become asynchronous (``Store.mode = "async"``; ``cp.async``
on ``cuda``, where a widened group goes from global to shared memory without
passing through registers and all of a thread's copies are in flight
together, instead of each load's latency being waited out before its store).
The barrier's ``keep = 0`` completes every group (``Barrier.keep``), so the
meaning is unchanged; a target that stores at once (the CPU's serialized SIMT
form, a scalar tail) realizes the same order.

The rule is checked, not trusted: the barrier-sufficiency proof discharges the
rewritten kernel with the stores in flight until that barrier, so a copy whose
buffer were touched before it would be refuted.

The staging store must be its buffer's only store in the segment and write
each element once (a distributed statement: ``simt.once_per_element``), and
the segment must store to no global memory: until the barrier a copy may
still be reading its source, and two copies of one element in flight would
land in either order.

Only segments that end in such a barrier at their own level are rewritten (a
segment running to the end of a loop body or of the phase is left alone, also
where the next iteration begins with a barrier: the staging loop of a program
that takes several rows, each row's copy behind its own barrier, keeps plain
stores), and only stores inside thread loops (a store outside one is thread
0's).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from . import loopir as L
from .simt import once_per_element


def async_staging(k: L.Kernel) -> L.Kernel:
    """``k`` with every qualifying staging store asynchronous (module doc)."""
    phases = tuple(replace(ph, body=_block(ph.body)) for ph in k.phases)
    return replace(k, phases=phases)


def _block(body: tuple) -> tuple:
    """``body`` with its segments rewritten, and the blocks nested in
    statements that synchronize (their own segments) likewise."""
    out = [_nested(s) for s in body]
    start = 0
    for i, s in enumerate(out):
        if L.is_block_barrier(s):
            if s.keep == 0:
                out[start:i] = _segment(tuple(out[start:i]))
            start = i + 1
    return tuple(out)


def _nested(s: Any) -> Any:
    """A program-level statement whose body holds barriers: its blocks are
    rewritten on their own (thread loops are segments' contents, not blocks)."""
    if isinstance(s, L.For) and s.kind != "thread" and _has_barrier(s.body):
        return replace(s, body=_block(s.body))
    if isinstance(s, L.If) and (_has_barrier(s.then) or _has_barrier(s.orelse)):
        return replace(s, then=_block(s.then), orelse=_block(s.orelse))
    return s


def _has_barrier(body: tuple) -> bool:
    """Whether ``body`` holds a block barrier (the only point at which a
    thread observes another's shared stores; warp collectives move registers)."""
    return any(L.is_block_barrier(s) for s in L.walk(body))


def _segment(seg: tuple) -> list:
    """The statements of one barrier-free segment (a block barrier with
    ``keep = 0`` follows it), with the staging store of every shared buffer
    that nothing else in the segment touches made asynchronous: the buffer's
    only store, writing each element once (``simt.once_per_element``), and a
    segment that stores to no global memory (a copy reads its source until
    the barrier)."""
    if _has_barrier(seg):  # a nested barrier: not one segment after all
        return list(seg)
    staged: dict[str, bool] = {}  # shared buffer -> its one access a staging store
    stores: dict[str, int] = {}
    for s, path in L.walk_paths(seg):
        in_thread = any(isinstance(x, L.For) and x.kind == "thread" for x in path)
        if isinstance(s, L.Store):
            if s.buf.space == "global":
                return list(seg)
            stores[s.buf.name] = stores.get(s.buf.name, 0) + 1
        for name, ok in _accesses(s, in_thread):
            ok = ok and once_per_element(path, s)
            staged[name] = staged.get(name, True) and ok
    names = {n for n, ok in staged.items() if ok and stores.get(n) == 1}
    if not names:
        return list(seg)

    def fs(st: Any) -> Any:
        if isinstance(st, L.Store) and st.buf.name in names:
            return (replace(st, mode="async"),)
        return None

    return list(L.map_stmts(seg, lambda x: None, fs))


def _accesses(s: Any, in_thread: bool) -> list[tuple[str, bool]]:
    """``(shared buffer, whether the access is a staging store)`` for each
    shared-memory access ``s`` makes itself (not its nested statements')."""
    out = [(x.buf.name, False) for e in L.stmt_exprs(s) for x in L.subexprs(e)
           if isinstance(x, L.Load) and x.buf.space == "shared"]
    if isinstance(s, L.Store) and s.buf.space == "shared":
        v = s.value
        copy = (in_thread and s.mode == "" and isinstance(v, L.Load) and v.guard is None
                and v.buf.space == "global" and v.buf.dtype == s.buf.dtype)
        out.append((s.buf.name, copy))
    if isinstance(s, L.WarpMma):
        out += [(g.buf.name, False) for g in (s.a, s.b, s.c) if g.buf.space == "shared"]
    return out
