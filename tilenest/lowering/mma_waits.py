"""Warpgroup mmas complete where their results are first needed (SIMT form).

A warpgroup ``mma`` (``wgmma``) is asynchronous: issued, it runs on the
tensor cores while the thread goes on, until a wait completes it. Waiting at
once, as a plain :class:`~.loopir.WarpMma` does, leaves the tensor cores idle
while the thread works and the thread idle while they do. This pass issues
each such mma *overlapped* (``WarpMma.overlap``) and places one
:class:`~.loopir.MmaWait` before the first statement that needs it complete:
the first that touches its accumulator, or writes a tile or register it
reads. A wait ``keep = n`` completes every group with at least ``n`` groups
issued after it, so the mmas issued in between run on::

    S' = Q K[j+1]^T            -- issued, runs during the softmax
    softmax(S) -> P, alpha     -- reads S, not S'
    mma_wait keep=1            -- completes P V of the step before
    O = O * alpha
    O += P V[j]                -- issued
    mma_wait keep=1            -- completes S'; P V runs on
    S = S'

(attention with its next scores issued ahead, ``workloads/attention.py``).
Block barriers complete every overlapped mma but the ``mma_keep`` newest
(the emitter's wait before them), so a mma whose first use lies past one
needs no wait of its own.

The placement is a forward data-flow analysis over the program-level
statements of each phase: its state is the set of pending mmas, each with
the number of groups surely issued after it. A statement that conflicts with
a pending mma gets a wait keeping the fewest such counts of those it
conflicts with; a loop's body is analysed until its entry state (the state
before the loop, joined with the state at the end of its body) is stable, so
that an mma of one iteration is waited for in the next where it is first
needed there, and whatever a loop leaves pending is waited for after it.
:func:`check_waits` runs the same analysis without placing anything and
refuses a kernel in which some statement needs a pending mma (``verify.py``
calls it), so a missing or too lax wait is an error, not a race.

Only an mma that every thread of its thread loop issues exactly once (its
enclosing inner loops run once, its guards are decided true) is overlapped:
the count of groups issued after a pending one is then exact. The pass
leaves alone a phase with overlapped mmas of its own (a ring's,
``double_buffer.py``: completed by its barriers' ``mma_keep``) and one with
a warp-specialized ring whose consumers keep groups in flight from step to
step (``warp_roles.py``); a specialized ring whose consumers complete their
mmas within each step is analysed as its meaning form reads.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..errors import VerifyError
from ..semantics import expr as E
from . import loopir as L

#: a pending mma's count of surely issued later groups stops growing here
_CAP = 64

#: the state: pending mma (by its ``tag``) -> groups surely issued after it
State = dict[str, int]


def defer_mma_waits(k: L.Kernel) -> L.Kernel:
    """``k`` with every warpgroup mma that qualifies (module docstring)
    overlapped and waited for where first needed."""
    phases = []
    for ph in k.phases:
        if not _eligible(ph.body):
            phases.append(ph)
            continue
        body, state = _Placer(place=True).stmts(_mark(ph.body), {})
        if state:  # nothing may stay pending when the threads leave
            body = body + (L.MmaWait(0),)
        phases.append(replace(ph, body=body))
    return replace(k, phases=tuple(phases))


def check_waits(k: L.Kernel) -> None:
    """Raise :class:`VerifyError` when, in a phase whose overlapped mmas are
    completed by waits (no barrier keeps one in flight, no warp-specialized
    loop: a ring's are checked by its barriers' proof), some statement
    touches a pending mma's accumulator or writes what it reads, or the
    phase ends with one pending (the analysis of the module docstring,
    placing nothing)."""
    for ph in k.phases:
        if not _analysed(ph.body):
            continue
        try:
            _, state = _Placer(place=False).stmts(ph.body, {})
        except _Conflict as e:
            raise VerifyError(f"loop IR of {k.name}: phase {ph.name}: {e}") from None
        if state:
            raise VerifyError(f"loop IR of {k.name}: phase {ph.name} ends with the warpgroup "
                              f"mma {', '.join(sorted(state))} not complete")


def _analysed(body: tuple) -> bool:
    """Whether a phase's overlapped mmas are the waits' (:func:`check_waits`)."""
    stmts = list(L.walk(body))
    return (any(isinstance(s, L.MmaWait) or (isinstance(s, L.WarpMma) and s.overlap)
                for s in stmts)
            and not any((isinstance(s, L.Barrier) and s.mma_keep) or _own_protocol(s)
                        for s in stmts))


def _own_protocol(s: Any) -> bool:
    """Is ``s`` a warp-specialized loop whose consumers keep mma groups in
    flight past a step (``Roles.release_keep``)? Its mmas are then the
    handshake's (``roles.*``); one that completes every group within the
    step is analysed as its meaning form reads (the barrier closing the step
    is its release's ``wgmma.wait_group 0``)."""
    return isinstance(s, L.For) and s.roles is not None and s.roles.release_keep > 0


def _eligible(body: tuple) -> bool:
    """Whether the pass may rewrite a phase: it has a warpgroup mma on a
    lane-fragment accumulator, no overlapped mma, no barrier keeping mmas in
    flight and no warp-specialized loop."""
    found = False
    for s in L.walk(body):
        if isinstance(s, L.WarpMma):
            if s.overlap:
                return False
            found = found or _candidate(s)
        elif (isinstance(s, L.Barrier) and s.mma_keep) or _own_protocol(s):
            return False
    return found


def _candidate(s: L.WarpMma) -> bool:
    """A warpgroup mma into the lanes' registers (what may be overlapped)."""
    return s.group == 4 and bool(s.c.lane_cols) and not s.opaque


def _mark(body: tuple) -> tuple:
    """Program-level statements ``body`` with the candidate mma of each
    thread loop that issues exactly one (per thread, :func:`_once`)
    overlapped; thread loops inside program-level loops and branches
    included, not those of a ``While`` (left waiting at once)."""
    out: list = []
    for s in body:
        if isinstance(s, L.For) and s.kind == "thread":
            mmas = [x for x in L.walk(s.body) if isinstance(x, L.WarpMma)]
            if len(mmas) == 1 and _candidate(mmas[0]) and _once(s, mmas[0]):
                target = mmas[0]
                s = L.map_stmts((s,), lambda x: None, lambda x: (
                    (replace(x, overlap=True),) if isinstance(x, L.WarpMma) and x.tag == target.tag
                    else None))[0]
        elif isinstance(s, L.For):
            s = replace(s, body=_mark(s.body))
        elif isinstance(s, L.If):
            s = replace(s, then=_mark(s.then), orelse=_mark(s.orelse))
        out.append(s)
    return tuple(out)


def _once(loop: L.For, target: L.WarpMma) -> bool:
    """Whether each thread of thread loop ``loop`` runs ``target`` exactly
    once: every loop around it inside runs once and every guard around it is
    true for the ranges of the loops' variables (``expr.interval``)."""
    if not (isinstance(loop.hi, E.Const) and loop.hi.value > 0):
        return False
    ranges = {E.Var(loop.var.name): (0, loop.hi.value - 1)}

    def find(body: tuple) -> bool | None:
        """True: reached exactly once; False: reached otherwise; None: not here."""
        for s in body:
            if s is target:
                return True
            if isinstance(s, L.For):
                got = find(s.body)
                if got is None:
                    continue
                lo, hi = s.lo, s.hi
                once = (isinstance(lo, E.Const) and isinstance(hi, E.Const)
                        and hi.value - lo.value == 1)
                if once:
                    ranges[E.Var(s.var.name)] = (lo.value, lo.value)
                    got = find(s.body)
                return bool(got) and once
            if isinstance(s, L.If):
                then, orelse = find(s.then), find(s.orelse)
                if then is None and orelse is None:
                    continue
                return (bool(then) and orelse is None and isinstance(s.cond, L.IPred)
                        and E.decided(s.cond.p, ranges) is True)
            if isinstance(s, L.While) and target in tuple(L.walk((s,))):
                return False
        return None

    return bool(find(loop.body))


class _Conflict(Exception):
    pass


def _access(s: Any) -> tuple[set[str], set[str]]:
    """The buffers statement ``s`` (nested ones included) reads and writes."""
    reads = {y.buf.name for y in L.evaluated((s,)) if isinstance(y, L.Load)}
    writes: set[str] = set()
    for t in L.walk((s,)):
        if isinstance(t, L.Store):
            writes.add(t.buf.name)
        elif isinstance(t, L.WarpMma):
            reads |= {t.a.buf.name, t.b.buf.name, t.c.buf.name}
            writes.add(t.c.buf.name)
    return reads, writes


class _Placer:
    """The analysis of the module docstring over program-level statements;
    with ``place``, a wait is inserted before each statement that needs one,
    without, such a statement raises :class:`_Conflict`."""

    def __init__(self, place: bool):
        self.place = place
        #: the overlapped mmas met so far, by tag
        self.mmas: dict[str, L.WarpMma] = {}

    def stmts(self, body: tuple, state: State) -> tuple[tuple, State]:
        """``body`` with its waits and the state after it."""
        out: list = []
        for s in body:
            pre, s, state = self.stmt(s, state)
            out.extend(pre)
            out.append(s)
        return tuple(out), state

    def stmt(self, s: Any, state: State) -> tuple[list, Any, State]:
        """The waits to insert before ``s``, ``s`` (its nested waits placed)
        and the state after it."""
        if isinstance(s, L.MmaWait):
            return [], s, _waited(state, s.keep)
        if isinstance(s, L.Barrier):
            return [], s, _waited(state, s.mma_keep) if L.is_block_barrier(s) else state
        if isinstance(s, L.Comment):
            return [], s, state
        if isinstance(s, L.For) and s.kind != "thread":  # its bounds read no buffer
            s, state = self.loop(s, state)
            return [], s, state
        if isinstance(s, L.If):
            pre = self.need(s, state, _reads_of(s.cond), set())
            state = _waited(state, pre[0].keep) if pre else state
            then, a = self.stmts(s.then, state)
            orelse, b = self.stmts(s.orelse, state)
            return pre, replace(s, then=then, orelse=orelse), _join(a, b)
        if isinstance(s, L.While):  # everything complete before it, none issued in it
            if any(isinstance(x, L.WarpMma) and x.overlap for x in L.walk((s,))):
                raise _Conflict("an overlapped warpgroup mma inside a while loop")
            pre = [L.MmaWait(0)] if state else []
            if pre and not self.place:
                raise _Conflict(f"a while loop with the warpgroup mma {', '.join(state)} "
                                "pending")
            return pre, s, {}
        pre = self.need(s, state, *_access(s))
        state = _waited(state, pre[0].keep) if pre else state
        for x in L.walk((s,)):
            if isinstance(x, L.WarpMma) and x.group == 4:
                if not x.overlap:  # committed and waited for at once: all complete
                    state = {}
                    continue
                self.mmas[x.tag] = x
                state = {t: min(_CAP, n + 1) for t, n in state.items()}
                state[x.tag] = 0
        return pre, s, state

    def need(self, s: Any, state: State, reads: set[str], writes: set[str]) -> list:
        """``[MmaWait]`` completing the pending mmas a statement reading
        ``reads`` and writing ``writes`` needs complete (it touches their
        accumulator, or writes what they read), or ``[]``."""
        need = [t for t in state
                if self.mmas[t].c.buf.name in reads | writes
                or {self.mmas[t].a.buf.name, self.mmas[t].b.buf.name} & writes]
        if not need:
            return []
        if not self.place:
            raise _Conflict(f"a statement needs the overlapped warpgroup mma "
                            f"{', '.join(sorted(need))} before a wait completes it: "
                            f"{L.format_stmts((s,))[0].strip()[:160]}")
        return [L.MmaWait(min(state[t] for t in need))]

    def loop(self, s: L.For, state: State) -> tuple[L.For, State]:
        """The loop with its waits placed, and the state after it: its body
        analysed from the join of the state before it and the state at the
        end of its body, until that join is stable (the counts only fall and
        the pending set only grows, so it settles)."""
        entry = dict(state)
        while True:
            body, end = self.stmts(s.body, entry)
            joined = _join(state, end)
            if joined == entry:
                break
            entry = joined
        # the body may run no time (the state before it) or end as analysed
        return replace(s, body=body), _join(state, end)


def _reads_of(x: Any) -> set[str]:
    """The buffers expression ``x`` loads."""
    return {y.buf.name for y in L.subexprs(x) if isinstance(y, L.Load)}


def _waited(state: State, keep: int) -> State:
    """The state after a wait (or barrier) completing all but ``keep`` newest."""
    return {t: n for t, n in state.items() if n < keep}


def _join(a: State, b: State) -> State:
    """Pending in either, with the fewer later groups."""
    out = dict(a)
    for t, n in b.items():
        out[t] = min(n, out.get(t, n))
    return out
