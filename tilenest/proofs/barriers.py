"""Barrier sufficiency: no two threads of one block make conflicting accesses
between two block barriers (kind ``barrier.sufficiency``).

The execution model is the SIMT form of the loop IR (``lowering/loopir.py``,
"Threads"). These obligations are the only ones stated over the loop IR
rather than over TileIR, so this module (and ``gpu.py``) reads the loop IR's
data classes -- imported inside functions, so that importing ``proofs`` still
loads ``semantics`` alone; nothing else of ``lowering`` is used. Per program
(one block of ``W`` threads):

* **program-level** code (outside thread loops) runs redundantly on every
  thread: each of its loads is made by every thread ``t in [0, W)``, each of
  its stores by thread ``0``;
* iteration ``t`` of a thread loop ``for.thread t in [0, W)`` runs as thread
  ``t``;
* a ``Barrier(scope="block")`` at program level, or inside a thread loop
  under control flow that does not depend on the thread (an ``if`` on the
  thread id, or on a local derived from it, makes it no barrier here), ends
  a *barrier interval*; ``Shuffle``/``LaneReduce`` order the lanes of one
  warp only and end nothing;
* a ``WarpMma`` collective is the accesses of its ``footprint``: each lane
  of the warp may read every element of its ``a`` and ``b`` blocks and reads
  and writes the accumulator elements it owns; the reads of an overlapped
  warpgroup mma (``WarpMma.overlap``) stay in flight, like an asynchronous
  store, across up to the largest ``Barrier.mma_keep`` of the phase.

* an asynchronous store (``Store.mode = "async"``) stays in flight across
  up to ``lag`` barriers after its issue, and until then it is unordered
  with every access, its own thread's included. A barrier orders only the
  groups of async stores older than its ``keep`` newest (``Barrier.keep``),
  each barrier committing one group: a store that has crossed ``j``
  barriers is the ``j + 1``-th newest group at the next one, which
  completes it when ``j >= keep``. Its ``lag`` is the largest such ``j`` on
  any path from the store on (:func:`async_lag`: every branch taken, every
  loop run any number of times, the phase's end completing everything), at
  most the phase's largest ``keep``.

Two dynamic accesses lie in one interval when some path from the earlier to
the later executes no barrier (at most ``lag`` barriers when the earlier is
an asynchronous store); the analysis counts the fewest barriers each
statement executes. The count is structural: a barrier is one, an ``if`` the
fewer of its branches', a loop with a constant trip count that many times
its body's, a ``while`` its ``pre``'s, any other loop none. For two
accesses ``a``, ``b`` it considers every *scenario* -- they
occur in the same iteration of all their common loops; or they agree on the
iterations of the common loops outside loop ``L`` and occur in iterations
``k_a < k_b`` (or ``k_b < k_a``) of ``L`` -- and keeps those with a
barrier-free path: ``a`` to ``b`` (or ``b`` to ``a``) inside one iteration;
``a`` to the end of ``L``'s body and the start of the body to ``b``, with
``k_a < k_b <= k_a + s``, ``s`` the most iterations the path may span within
its barrier allowance (unbounded when a whole iteration may pass without a
barrier). A pair with no scenario cannot share an interval and gets no
obligation. For each remaining pair of accesses to one ``shared`` or
``global`` buffer, at least one a store, the obligation is::

    forall syms >= 0, pid, loop variables of both accesses (in their ranges),
           t1, t2 in [0, W):
        guards_a and guards_b and (scenario_1 or .. or scenario_k) and
        thread_a = t1 and thread_b = t2 and t1 != t2  =>  elem_a != elem_b

(``t1 != t2`` is dropped when one of them is an asynchronous store, except
between one store and itself in one iteration; the enclosing ``if`` conditions, load/store guards and loop ranges are the
guards). Index locals are replaced by their definitions (index expressions
over loop variables, the program id and symbols; a local assigned one of
the program's grid coordinates stands for a variable ranging over that
axis, so the program is a point of the grid's box rather than a quotient of
``pid`` by symbolic extents); a local with another
definition (a load result, a value carried around a loop) is *data*. An
access whose index reads data gives ``unknown`` with that reason, never
``proved``; a guard that reads data is dropped from the hypothesis, which can
only prove (a refutation is then ``unknown``).

A refutation names the buffer, both statements, the two threads, the element
and the symbol values: a real race of the SIMT program for those sizes.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from ..semantics import expr as E
from . import formula as Fm
from .model import VarInfo
from .obligation import UNKNOWN, Obligation, discharge

KIND = "barrier.sufficiency"


def _L() -> Any:
    # the loop IR is read, not built: deferred so that importing the proofs
    # package does not import the lowering package
    from ..lowering import loopir

    return loopir


# ---------------------------------------------------------------------------
# the structure an access sits in


@dataclass
class _Frame:
    """One statement list enclosing an access: ``items`` (a ``while``'s ``pre``
    and ``body`` concatenated, the exit after ``exit_at`` items), the
    position ``pos`` of the statement holding the access, and the loop whose
    iteration this list is (``loop``: the For/While, else None)."""

    key: int
    items: tuple
    pos: int
    ctx: _Ctx
    loop: Any = None
    exit_at: int | None = None


@dataclass(frozen=True)
class _Ctx:
    """Barrier effectiveness: inside a thread loop (``taint``: names that
    depend on the thread), under thread-dependent control flow (``div``)."""

    thread: bool = False
    taint: frozenset[str] = frozenset()
    div: bool = False


@dataclass
class _Loop:
    """An enclosing non-thread loop of an access: its variable and range."""

    key: int
    var: str
    lo: E.Expr | None
    hi: E.Expr | None
    kind: str  # "for" or "while"
    reverse: bool = False  # iterations run from hi - 1 down to lo


@dataclass
class _Access:
    buf: Any
    store: bool
    index: E.Expr | None
    guards: list[E.Pred]
    dropped: list[str]
    data: list[str]
    frames: list[_Frame]
    loops: list[_Loop]
    thread: str | None
    width: E.Expr
    text: str
    seq: int = 0
    lag: int = 0  # barriers an asynchronous store may stay in flight across
    #: an asynchronous store (Store.mode): unordered with its own thread's
    #: accesses too until a barrier completes it, whatever its lag
    asynchronous: bool = False


_MEMO: dict[tuple[int, _Ctx], tuple[Any, int]] = {}

#: a count of barriers standing for "arbitrarily many"
_MANY = 1 << 20


def _least(s: Any, ctx: _Ctx) -> int:
    """The fewest block barriers statement ``s`` executes on any execution."""
    key = (id(s), ctx)
    hit = _MEMO.get(key)
    if hit is not None and hit[0] is s:
        return hit[1]
    got = _least_of(s, ctx)
    _MEMO[key] = (s, got)
    return got


def _least_of(s: Any, ctx: _Ctx) -> int:
    L = _L()
    if isinstance(s, L.Barrier):
        return int(s.scope == "block" and not ctx.div)
    if isinstance(s, L.If):
        inner = _branch_ctx(ctx, s.cond)
        return min(_least_list(s.then, inner), _least_list(s.orelse, inner))
    if isinstance(s, L.For):
        if s.kind == "thread":
            # the threads execute a barrier of the body together: once
            inner = _thread_ctx(ctx, s)
            ok = isinstance(s.hi, E.Const) and s.hi.value > 0
            return _least_list(s.body, inner) if ok else 0
        if not (isinstance(s.lo, E.Const) and isinstance(s.hi, E.Const)):
            return 0
        trips = max(0, s.hi.value - s.lo.value)
        return min(_MANY, trips * _least_list(s.body, _loop_ctx(ctx, s)))
    if isinstance(s, L.While):
        return _least_list(s.pre, _branch_ctx(ctx, None, s))
    return 0


def _least_list(items: tuple, ctx: _Ctx) -> int:
    return min(_MANY, sum(_least(s, ctx) for s in items))


def _thread_ctx(ctx: _Ctx, s: Any) -> _Ctx:
    """The context inside thread loop ``s``: which locals depend on the thread."""
    L = _L()
    taint = set(ctx.taint) | {s.var.name}
    changed = True
    while changed:
        changed = False
        for st in L.walk(s.body):
            dst, reads = None, set()
            if isinstance(st, L.Assign):
                dst, reads = st.var.name, L.names(st.value)
                if any(isinstance(y, L.Load) for y in L.subexprs(st.value)):
                    reads.add(s.var.name)  # a loaded value may differ per thread
            elif isinstance(st, L.For):
                dst, reads = st.var.name, L.names(L.IExpr(st.lo)) | L.names(L.IExpr(st.hi))
            elif isinstance(st, (L.Shuffle, L.LaneReduce)):
                dst, reads = st.dst.name, {s.var.name}
            if dst is not None and dst not in taint and reads & taint:
                taint.add(dst)
                changed = True
    return _Ctx(True, frozenset(taint), ctx.div)


def _branch_ctx(ctx: _Ctx, cond: Any, w: Any = None) -> _Ctx:
    """Inside an ``if`` on ``cond`` (or a ``while``): divergent when the
    condition depends on the thread."""
    if not ctx.thread or ctx.div:
        return ctx
    L = _L()
    reads = L.names(cond) if cond is not None else L.names(w.cond) | L.referenced(w.pre)
    return _Ctx(ctx.thread, ctx.taint, bool(reads & ctx.taint))


def _loop_ctx(ctx: _Ctx, s: Any) -> _Ctx:
    if not ctx.thread or ctx.div:
        return ctx
    L = _L()
    reads = L.names(L.IExpr(s.lo)) | L.names(L.IExpr(s.hi))
    return _Ctx(ctx.thread, ctx.taint, bool(reads & ctx.taint))


# ---------------------------------------------------------------------------
# how long an asynchronous store stays in flight


def async_lag(frames: list[_Frame]) -> int:
    """The most block barriers an asynchronous store stays in flight across
    on any path from its position (``frames``: the statement lists enclosing
    it, outermost first) to the phase's end. A state is the number ``j`` of
    barriers crossed since the store; a block barrier with ``keep <= j``
    completes it there (its group is then older than the ``keep`` newest),
    else the state becomes ``j + 1``. Branches give the union of their
    states, loops any number of further iterations (a fixpoint: states stay
    below the largest ``keep``), and the enclosing lists are walked outward
    from the store, a loop's list iterating again before its exit."""
    done: set[int] = set()
    states = {0}
    for f in reversed(frames):
        lp = f.loop
        if lp is not None and lp.kind == "while":
            # items are pre + body; the loop exits after a run of pre
            cut = f.exit_at or 0
            pre, body = f.items[:cut], f.items[cut:]
            if f.pos < cut:
                exits = _walk(f.items[f.pos + 1:cut], states, f.ctx, done)
                head = _walk(body, exits, f.ctx, done)
            else:
                exits, head = set(), _walk(f.items[f.pos + 1:], states, f.ctx, done)
            head = _repeat(pre + body, head, f.ctx, done)
            states = exits | _walk(pre, head, f.ctx, done)
            continue
        states = _walk(f.items[f.pos + 1:], states, f.ctx, done)
        if lp is not None:  # further iterations of a for loop, then its exit
            states = _repeat(f.items, states, f.ctx, done)
    return max(done | states, default=0)


def _repeat(items: tuple, states: set[int], ctx: _Ctx, done: set[int]) -> set[int]:
    """The states after zero or more runs of ``items`` from ``states``."""
    seen = set(states)
    frontier = set(states)
    while frontier:
        frontier = _walk(items, frontier, ctx, done) - seen
        seen |= frontier
    return seen


def _walk(items: tuple, states: set[int], ctx: _Ctx, done: set[int]) -> set[int]:
    """The states after running ``items`` (:func:`async_lag`); the ``j`` of
    every completion on the way is added to ``done``."""
    L = _L()
    for s in items:
        if not states:
            break
        if isinstance(s, L.Barrier):
            if s.scope == "block" and not ctx.div:
                done |= {j for j in states if j >= s.keep}
                states = {j + 1 for j in states if j < s.keep}
        elif isinstance(s, L.If):
            inner = _branch_ctx(ctx, s.cond)
            states = _walk(s.then, states, inner, done) | _walk(s.orelse, states, inner, done)
        elif isinstance(s, L.For) and s.kind == "thread":
            ran = _walk(s.body, states, _thread_ctx(ctx, s), done)
            states = ran if isinstance(s.hi, E.Const) and s.hi.value > 0 else ran | states
        elif isinstance(s, L.For):
            states = _repeat(s.body, states, _loop_ctx(ctx, s), done)
        elif isinstance(s, L.While):
            inner = _branch_ctx(ctx, None, s)
            head = _repeat(s.pre + s.body, states, inner, done)
            states = _walk(s.pre, head, inner, done)
    return states


# ---------------------------------------------------------------------------
# collecting the accesses of a phase


class _Collector:
    """Walks one phase body, keeping the definitions of index locals (``env``:
    name -> expression, or None for data) and the enclosing frames."""

    def __init__(self, k: Any, ph: Any, width: int):
        self.k, self.ph, self.width = k, ph, width
        self.out: list[_Access] = []
        self.keys = itertools.count()
        self.env: dict[str, E.Expr | None] = {ph.pid.name: E.Var(ph.pid.name)}
        #: the delinearized program id (Phase.coordinates) -> its coordinate
        #: variable: a local assigned one stands for the variable, so the
        #: obligation ranges over the grid's box instead of dividing ``pid``
        #: by symbolic extents (which no linear engine decides)
        self.coords = {c: _coordinate(ph, i) for i, c in enumerate(ph.coordinates())}
        self.twidth: E.Expr = E.Const(width)
        # an asynchronous store's lag is its own (async_lag); the shared
        # reads of an overlapped warpgroup mma (WarpMma.overlap) stay in
        # flight across the phase's largest ``mma_keep``
        L = _L()
        self.mma_lag = max([st.mma_keep for st in L.walk(ph.body)
                            if isinstance(st, L.Barrier) and st.scope == "block"], default=0)
        #: the lag of the loads being recorded (an overlapped mma's reads)
        self.read_lag = 0

    # -- expressions ----------------------------------------------------------

    def resolve(self, e: E.Expr | E.Pred) -> tuple[Any, list[str]]:
        """``e`` with index locals replaced by their definitions; the names of
        locals that are data (they become ``Val`` leaves)."""
        m: dict[E.Expr, E.Expr] = {}
        data = []
        for lf in E.leaves(e):
            if isinstance(lf, (E.Var, E.Val)):
                d = self.env.get(lf.name)
                if d is None:
                    m[lf] = E.Val(lf.name)
                    data.append(lf.name)
                elif d != lf:
                    m[lf] = d
        return E.subst(e, m), data

    def index_of(self, x: Any) -> tuple[E.Expr | None, list[str]]:
        L = _L()
        if isinstance(x, L.IExpr):
            return self.resolve(x.e)
        if isinstance(x, L.Ref) and x.var.dtype.is_int:
            return self.resolve(E.Var(x.var.name))
        if isinstance(x, L.Cast) and x.dtype.is_int:
            return self.index_of(x.a)
        return None, sorted(L.names(x)) or ["a computed value"]

    def pred_of(self, x: Any) -> tuple[E.Pred | None, list[str]]:
        L = _L()
        if isinstance(x, L.IPred):
            p, data = self.resolve(x.p)
            return (None, data) if data else (p, [])
        if isinstance(x, L.Un) and x.op == "not":
            p, data = self.pred_of(x.a)
            return (E.pnot(p) if p is not None else None), data
        if isinstance(x, L.Const) and isinstance(x.value, bool):
            return (E.TRUE if x.value else E.FALSE), []
        return None, sorted(L.names(x)) or ["a computed value"]

    # -- statements -----------------------------------------------------------

    def run(self) -> list[_Access]:
        self.stmts(self.ph.body, [], [], [], None, _Ctx(), None)
        return self.out

    def stmts(self, items: tuple, frames: list, loops: list, guards: list,
              thread: str | None, ctx: _Ctx, loop: Any, exit_at: int | None = None,
              key: int | None = None, dropped: list | None = None) -> None:
        key = next(self.keys) if key is None else key
        dropped = list(dropped or [])
        for pos, s in enumerate(items):
            fr = frames + [_Frame(key, items, pos, ctx, loop, exit_at)]
            self.stmt(s, fr, loops, guards, thread, ctx, dropped)

    def access(self, buf: Any, store: bool, index: Any, guard: Any, frames: list, loops: list,
               guards: list, thread: str | None, dropped: list, text: str, lag: int = 0,
               asynchronous: bool = False) -> None:
        if buf.space not in ("shared", "global"):
            return
        ix, data = self.index_of(index)
        gs, dr = list(guards), list(dropped)
        if guard is not None:
            g, gd = self.pred_of(guard)
            if g is None:
                dr.append("the guard of " + text + " reads " + ", ".join(gd))
            else:
                gs.append(g)
        width = self.twidth if thread is not None else E.Const(self.width)
        self.out.append(_Access(buf, store, ix, gs, dr, data, list(frames), list(loops), thread,
                                width, text, len(self.out), lag, asynchronous))

    def loads(self, x: Any, frames: list, loops: list, guards: list, thread: str | None,
              dropped: list) -> None:
        L = _L()
        for y in L.subexprs(x):
            if isinstance(y, L.Load):
                self.access(y.buf, False, y.index, y.guard, frames, loops, guards, thread, dropped,
                            "load " + L.expr_str(y), self.read_lag)

    def stmt(self, s: Any, frames: list, loops: list, guards: list, thread: str | None,
             ctx: _Ctx, dropped: list) -> None:
        L = _L()
        if isinstance(s, L.Assign):
            self.loads(s.value, frames, loops, guards, thread, dropped)
            self.assign(s.var, s.value)
        elif isinstance(s, L.Store):
            for x in L.stmt_exprs(s):
                self.loads(x, frames, loops, guards, thread, dropped)
            g = f" if {L.expr_str(s.guard)}" if s.guard is not None else ""
            self.access(s.buf, True, s.index, s.guard, frames, loops, guards, thread, dropped,
                        f"store {s.buf.name}[{L.expr_str(s.index)}] = "
                        f"{_short(L.expr_str(s.value))}{g}",
                        async_lag(frames) if s.mode == "async" else 0, s.mode == "async")
        elif isinstance(s, (L.Check, L.Shuffle, L.LaneReduce)):
            for x in L.stmt_exprs(s):
                self.loads(x, frames, loops, guards, thread, dropped)
            if isinstance(s, (L.Shuffle, L.LaneReduce)):
                self.env[s.dst.name] = None
        elif isinstance(s, L.WarpMma):
            # every access a lane of the collective may make (WarpMma.footprint);
            # an overlapped one's reads stay in flight across mma_lag barriers
            self.read_lag = self.mma_lag if s.overlap else 0
            try:
                self.stmts(s.footprint(), frames, loops, guards, thread, ctx, None,
                           dropped=dropped)
            finally:
                self.read_lag = 0
        elif isinstance(s, L.If):
            self.loads(s.cond, frames, loops, guards, thread, dropped)
            p, data = self.pred_of(s.cond)
            inner = _branch_ctx(ctx, s.cond)
            before = dict(self.env)
            outs = []
            for branch, pol in ((s.then, True), (s.orelse, False)):
                self.env = dict(before)
                gs, dr = list(guards), list(dropped)
                if p is None:
                    dr.append(f"the condition {L.expr_str(s.cond)} reads {', '.join(data)}")
                else:
                    gs.append(p if pol else E.pnot(p))
                self.stmts(branch, frames, loops, gs, thread, inner, None, dropped=dr)
                outs.append(self.env)
            self.env = {n: (v if all(o.get(n, None) == v for o in outs) else None)
                        for n, v in outs[0].items()}
            for o in outs[1:]:
                for n in o:
                    self.env.setdefault(n, None)
        elif isinstance(s, L.For):
            lo, dlo = self.resolve(s.lo)
            hi, dhi = self.resolve(s.hi)
            self.forget(s.body)
            v = s.var.name
            self.env[v] = E.Var(v)
            gs, dr = list(guards), list(dropped)
            if s.kind == "thread":
                outer, self.twidth = self.twidth, hi if not dhi else E.Const(self.width)
                self.stmts(s.body, frames, loops, gs, v, _thread_ctx(ctx, s), None, dropped=dr)
                self.twidth = outer
            else:
                if dlo or dhi:
                    dr.append(f"the bounds of loop {v} read {', '.join(dlo + dhi)}")
                lp = _Loop(next(self.keys), v, None if dlo else lo, None if dhi else hi, "for",
                           bool(s.reverse))
                self.stmts(s.body, frames, loops + [lp], gs, thread, _loop_ctx(ctx, s), lp,
                           dropped=dr)
            self.forget(s.body)
            self.env[v] = None
        elif isinstance(s, L.While):
            self.forget(s.pre + s.body)
            lp = _Loop(next(self.keys), "", None, None, "while")
            inner = _branch_ctx(ctx, None, s)
            key = next(self.keys)
            items = s.pre + s.body
            # the condition is read after pre: walk pre, the condition, then body
            for pos, st in enumerate(items):
                fr = frames + [_Frame(key, items, pos, inner, lp, len(s.pre))]
                if pos == len(s.pre):
                    self.loads(s.cond, fr, loops + [lp], guards, thread, dropped)
                self.stmt(st, fr, loops + [lp], guards, thread, inner, dropped)
            if not s.body:
                fr = frames + [_Frame(key, items, max(0, len(items) - 1), inner, lp, len(s.pre))]
                self.loads(s.cond, fr, loops + [lp], guards, thread, dropped)
            self.forget(s.pre + s.body)

    def assign(self, var: Any, value: Any) -> None:
        L = _L()
        if isinstance(value, L.IExpr) and value.e in self.coords:
            self.env[var.name] = E.Var(self.coords[value.e])
        elif var.dtype.is_int or var.dtype.is_bool:
            ix, data = self.index_of(value) if not isinstance(value, L.IPred) else (None, ["p"])
            self.env[var.name] = ix if ix is not None and not data else None
        else:
            self.env[var.name] = None

    def forget(self, body: tuple) -> None:
        """Locals assigned in a loop body are data on its entry and exit (their
        value there is carried from an unknown iteration)."""
        for n in _L().assigned(body):
            self.env[n] = None


def _short(s: str, n: int = 60) -> str:
    return s if len(s) <= n else s[:n - 3] + "..."


# ---------------------------------------------------------------------------
# scenarios: when two accesses can share a barrier interval


@dataclass
class _Path:
    """The fewest barriers on a path: ``const`` plus, for each term ``(n,
    side, loop, what)``, ``n`` times a count of iterations of ``loop`` the
    path runs whole -- ``left``: those after the access's iteration,
    ``entered``: those before it (of access ``side``, "a" or "b"), ``span``:
    those strictly between the two accesses' iterations."""

    const: int = 0
    terms: list[tuple[int, str, _Loop, str]] = field(default_factory=list)

    def __add__(self, o: "_Path") -> "_Path":
        return _Path(self.const + o.const, self.terms + o.terms)


def _loop_term(f: _Frame, side: str, what: str) -> list[tuple[int, str, _Loop, str]]:
    """The iterations term of frame ``f`` when it is a loop body that runs
    barriers in every iteration."""
    if f.loop is None or f.loop.kind != "for" or not f.loop.var:
        return []
    n = _least_list(f.items, f.ctx)
    return [(n, side, f.loop, what)] if n else []


def _leave(frames: list[_Frame], side: str) -> _Path:
    """A path from the access out of every list of ``frames`` (the rest of
    each list and the later iterations of each loop; leaving a ``while``
    from its body runs ``pre`` once more before the exit test)."""
    p = _Path()
    for f in frames:
        if f.exit_at is not None and f.pos >= f.exit_at:
            p.const += _least_list(f.items[f.pos + 1:], f.ctx) + \
                _least_list(f.items[:f.exit_at], f.ctx)
        elif f.exit_at is not None:
            p.const += _least_list(f.items[f.pos + 1:f.exit_at], f.ctx)
        else:
            p.const += _least_list(f.items[f.pos + 1:], f.ctx)
        p.terms += _loop_term(f, side, "left")
    return p


def _exit(frames: list[_Frame], depth: int, side: str) -> _Path:
    """A path from the access to the end of one execution of the list of
    ``frames[depth]`` (for a loop body: the end of the iteration)."""
    f = frames[depth]
    return _leave(frames[depth + 1:], side) + _Path(_least_list(f.items[f.pos + 1:], f.ctx))


def _enter(frames: list[_Frame], depth: int, side: str, fresh: int | None = None) -> _Path:
    """A path from the start of the list of ``frames[depth]`` to the access
    (through the start of each deeper list; the loops of ``frames[fresh:]``,
    default ``frames[depth:]``, entered from their first iteration)."""
    p = _Path(sum(_least_list(f.items[:f.pos], f.ctx) for f in frames[depth:]))
    for f in frames[depth if fresh is None else fresh:]:
        p.terms += _loop_term(f, side, "entered")
    return p


def _between(a: list[_Frame], b: list[_Frame], depth: int, sa: str, sb: str) -> _Path:
    """A path from ``a`` to ``b`` inside one execution of the list of
    ``frames[depth]`` (``a`` strictly before ``b`` there)."""
    fa, fb = a[depth], b[depth]
    return _leave(a[depth + 1:], sa) + \
        _Path(_least_list(fa.items[fa.pos + 1:fb.pos], fa.ctx)) + _enter(b, depth + 1, sb)


def _common(a: _Access, b: _Access) -> int:
    n = 0
    for x, y in zip(a.frames, b.frames, strict=False):
        if x.key != y.key:
            break
        n += 1
    return n


@dataclass
class _Scenario:
    """Common loops (by key) in the same iteration, and at most one loop
    ``split`` in different iterations: ``rel`` is ``after`` (b in a later
    iteration than a) or ``before`` (b earlier); ``path`` the barriers from
    the earlier access to the later, at most ``lag`` (the earlier's)."""

    same: list[int] = field(default_factory=list)
    split: int | None = None
    rel: str = ""
    path: _Path = field(default_factory=_Path)
    lag: int = 0


def scenarios(a: _Access, b: _Access) -> list[_Scenario]:
    """The ways ``a`` and ``b`` can meet in one barrier interval: a path from
    the earlier to the later crossing at most the earlier's ``lag`` barriers
    (0, except for an asynchronous store that stays in flight). A scenario
    whose path's constant part exceeds the lag is impossible and left out;
    the rest of the bound is a condition of the obligation."""
    c = _common(a, b)
    cands: list[_Scenario] = []
    # loops common to both, outer to inner, with the depth of their body frame
    common_loops = [(d, a.frames[d].loop) for d in range(c) if a.frames[d].loop is not None]
    same_all = [lp.key for _, lp in common_loops]
    if a.seq == b.seq or (len(a.frames) == len(b.frames) == c
                          and a.frames[-1].pos == b.frames[-1].pos):
        cands.append(_Scenario(same_all, lag=max(a.lag, b.lag)))
    elif c > 0:
        d = c - 1
        pa, pb = a.frames[d].pos, b.frames[d].pos
        if pa < pb:
            cands.append(_Scenario(same_all, path=_between(a.frames, b.frames, d, "a", "b"),
                                   lag=a.lag))
        elif pb < pa:
            cands.append(_Scenario(same_all, path=_between(b.frames, a.frames, d, "b", "a"),
                                   lag=b.lag))
        elif len(a.frames) == c:  # a in the head of the statement holding b
            cands.append(_Scenario(same_all, path=_enter(b.frames, c, "b"), lag=a.lag))
        elif len(b.frames) == c:
            cands.append(_Scenario(same_all, path=_enter(a.frames, c, "a"), lag=b.lag))
    for j, (d, lp) in enumerate(common_loops):
        same = [x.key for _, x in common_loops[:j]]
        span = _loop_term(a.frames[d], "", "span")
        fwd = _exit(a.frames, d, "a") + _Path(0, span) + _enter(b.frames, d, "b", d + 1)
        bwd = _exit(b.frames, d, "b") + _Path(0, span) + _enter(a.frames, d, "a", d + 1)
        cands.append(_Scenario(same, lp.key, "after", fwd, a.lag))
        cands.append(_Scenario(same, lp.key, "before", bwd, b.lag))
    return [sc for sc in cands if sc.path.const <= sc.lag]


# ---------------------------------------------------------------------------
# the obligations


def _coordinate(ph: Any, i: int) -> str:
    """The variable of coordinate ``i`` of ``ph``'s program in its grid."""
    return f"{ph.pid.name}[{i}]"


def _program(ph: Any, used: set[str]) -> Fm.F:
    """The hypothesis that the program lies in ``ph``'s grid, over the
    variables the obligation uses: each coordinate in ``[0, extent)`` (the
    whole box, so an empty grid leaves no program), and when ``pid`` itself
    occurs, ``0 <= pid < prod(extents)`` with each coordinate tied to its
    delinearization. Without ``pid`` the statement is affine wherever the
    extents are; the box is exactly the grid either way, since
    delinearization is a bijection (:func:`~tilenest.lowering.loopir.delinearize`)."""
    pid = ph.pid.name
    parts: list[Fm.F] = []
    total: E.Expr = E.Const(1)
    for i, (c, n) in enumerate(zip(ph.coordinates(), ph.extents, strict=True)):
        v = E.Var(_coordinate(ph, i))
        parts += [Fm.atom(v.ge(0)), Fm.atom(v.lt(n))]
        if pid in used:
            parts.append(Fm.atom(v.eq(c)))
        total = E.mul(total, n)
    if pid in used:
        parts += [Fm.atom(E.Var(pid).ge(0)), Fm.atom(E.Var(pid).lt(total))]
    return Fm.conj(*parts)


def _ranges(acc: _Access) -> list[E.Pred]:
    """``lo <= v`` and ``v < hi`` for each loop variable ``v`` of ``acc``."""
    out: list[E.Pred] = []
    for lp in acc.loops:
        if lp.var and lp.lo is not None:
            out.append(E.Var(lp.var).ge(lp.lo))
        if lp.var and lp.hi is not None:
            out.append(E.Var(lp.var).lt(lp.hi))
    return out


def _nonneg_vars(ph: Any, acc: _Access) -> frozenset[str]:
    """The variables of ``acc``'s index that are never negative: its loops'
    variables that count up from a non-negative constant, its thread id and
    the program's grid coordinates."""
    out = {lp.var for lp in acc.loops if lp.var and isinstance(lp.lo, E.Const)
           and lp.lo.value >= 0}
    if acc.thread:
        out.add(acc.thread)
    return frozenset(out | {_coordinate(ph, i) for i in range(len(ph.extents))})


def _side(acc: _Access, tag: str, pid: str) -> tuple[dict[str, str], str | None]:
    """Renaming of ``acc``'s loop and thread variables for side ``tag``."""
    ren = {lp.var: f"{lp.var}#{tag}" for lp in acc.loops if lp.var}
    if acc.thread is not None:
        ren[acc.thread] = f"{acc.thread}#{tag}"
    return ren, ren.get(acc.thread) if acc.thread else None


def _facts(acc: _Access, ren: dict[str, str], tvar: E.Expr) -> Fm.F:
    parts: list[Fm.F] = [Fm.atom(tvar.ge(0)), Fm.atom(tvar.lt(acc.width))]
    for lp in acc.loops:
        if not lp.var:
            continue
        v = E.Var(ren[lp.var])
        if lp.lo is not None:
            parts.append(Fm.atom(v.ge(E.rename(lp.lo, ren))))
        if lp.hi is not None:
            parts.append(Fm.atom(v.lt(E.rename(lp.hi, ren))))
    parts += [Fm.atom(E.rename(g, ren)) for g in acc.guards]
    return Fm.conj(*parts)


def _path_bound(sc: _Scenario, rens: dict[str, dict[str, str]],
                loops_a: dict[int, _Loop]) -> E.Pred | None:
    """``const + sum n * iterations <= lag`` for the scenario's path (None
    when it has no terms: the constant was checked already). A loop whose
    bound is data contributes no term (a weaker condition)."""
    total: E.Expr = E.Const(sc.path.const)
    terms = 0
    for n, side, lp, what in sc.path.terms:
        if what == "span":
            v = loops_a[sc.split].var if sc.split is not None else ""
            if not v:
                continue
            x, y = E.Var(rens["a"][v]), E.Var(rens["b"][v])
            first, later = (x, y) if sc.rel == "after" else (y, x)
            run = (first - later if lp.reverse else later - first) - 1
        else:
            k = E.Var(rens[side][lp.var])
            lo = None if lp.lo is None else E.rename(lp.lo, rens[side])
            hi = None if lp.hi is None else E.rename(lp.hi, rens[side])
            # iterations before k (entered) or after it (left), in run order
            start, stop = (hi, lo) if lp.reverse else (lo, hi)
            if what == "entered":
                if start is None:
                    continue
                run = start - 1 - k if lp.reverse else k - start
            else:
                if stop is None:
                    continue
                run = k - stop if lp.reverse else stop - 1 - k
        total = E.add(total, E.mul(n, run))
        terms += 1
    return total.le(sc.lag) if terms else None


def _split(e: E.Expr, s: E.Expr) -> tuple[E.Expr, E.Expr] | None:
    """``(x, y)`` with ``e = x * s + y`` and ``s`` not in ``y`` (None when
    ``s`` occurs in ``e`` otherwise than as a factor of a product term)."""
    terms, k = E._linear(e)
    x: E.Expr = E.Const(0)
    y: E.Expr = E.Const(k)
    for atom, c in terms.items():
        fs = atom.factors if isinstance(atom, E.Mul) else (atom,)
        if fs.count(s) == 1:
            rest: E.Expr = E.Const(c)
            for f in fs:
                if f != s:
                    rest = E.mul(rest, f)
            x = E.add(x, rest)
        elif s in E.leaves(atom):
            return None
        else:
            y = E.add(y, E.mul(c, atom))
    return (x, y) if x != E.Const(0) else None


def _atoms(guards: list[E.Pred]) -> list[E.Pred]:
    out: list[E.Pred] = []
    for g in guards:
        out.extend(_atoms(list(g.items)) if isinstance(g, E.PAnd) else [g])
    return out


def _nonneg(e: E.Expr, names: frozenset[str]) -> bool:
    """Is ``e`` never negative, by its form alone: a sum of non-negative
    multiples of symbols (``syms >= 0`` is assumed), of variables in ``names``
    (loop variables counting up from ``0`` or more, thread ids, grid
    coordinates), of their products and of their floor quotients and
    remainders by positive constants, plus a non-negative constant?"""
    terms, k = E._linear(e)
    if k < 0:
        return False

    def atom(x: E.Expr) -> bool:
        if isinstance(x, E.Sym):
            return True
        if isinstance(x, E.Var):
            return x.name in names
        if isinstance(x, E.Mul):
            return all(atom(f) for f in x.factors)
        if isinstance(x, (E.FloorDiv, E.Mod)):
            return isinstance(x.b, E.Const) and x.b.value > 0 and _nonneg(x.a, names)
        return False

    return all(c > 0 and atom(x) for x, c in terms.items())


def _within(y: E.Expr, s: E.Expr, guards: list[E.Pred],
            nonneg: frozenset[str] = frozenset()) -> bool:
    """Do the guards (with the loop ranges) state ``0 <= y`` (or is ``y``
    non-negative by its form, :func:`_nonneg`) and ``y < s`` (as atoms, up
    to moving terms across)?"""
    diffs = {(g.op, E.add(g.a, E.mul(-1, g.b))) for g in _atoms(guards) if isinstance(g, E.Cmp)}
    lo = (">=", y) in diffs or ("<=", E.mul(-1, y)) in diffs or _nonneg(y, nonneg)
    top = E.add(y, E.mul(-1, s))
    hi = ("<", top) in diffs or (">", E.mul(-1, top)) in diffs or \
        ("<=", E.add(top, 1)) in diffs
    return lo and hi


def _recompose(e: E.Expr) -> E.Expr:
    """``e`` with each ``c * (a // b) * b + c * (a % b)`` replaced by ``c * a``
    (``b`` not constant: constant divisors are the linear engines' own). The
    identity holds wherever ``a // b`` is defined, so the element a program
    accesses is unchanged; a tile's flat offset taken apart into row and
    column by a symbolic row length and put back together becomes linear."""
    terms, _ = E._linear(e)
    total = e
    for m, c in terms.items():
        if not isinstance(m, E.Mul):
            continue
        for i, f in enumerate(m.factors):
            if not isinstance(f, E.FloorDiv) or isinstance(f.b, E.Const):
                continue
            rest: E.Expr = E.Const(1)
            for g in m.factors[:i] + m.factors[i + 1:]:
                rest = E.mul(rest, g)
            r = E.mod(f.a, f.b)
            if rest == f.b and terms.get(r) == c:
                # c*(a//b)*b + c*(a%b) -> c*a
                total = E.add(total, E.mul(c, E.add(f.a, E.mul(-1, E.add(E.mul(f, f.b), r)))))
                break
    return total


def coordinates(ea: E.Expr, eb: E.Expr, ga: list[E.Pred], gb: list[E.Pred],
                na: frozenset[str] = frozenset(), nb: frozenset[str] = frozenset()
                ) -> list[tuple[E.Expr, E.Expr]]:
    """Pairs ``(x_i, y_i)`` whose equality together is that of the elements
    ``ea`` and ``eb``: a row-major offset ``x * S + y`` of a symbolic row
    length ``S`` whose guards bound ``y`` to ``[0, S)`` on both sides splits
    into its row and its column (``x_a S + y_a = x_b S + y_b`` iff ``x_a =
    x_b`` and ``y_a = y_b`` then), recursively; the products of a symbol
    and a variable would leave the linear fragments otherwise. Both offsets
    are first put through :func:`_recompose`."""
    ea, eb = _recompose(ea), _recompose(eb)
    for s in sorted({lf for lf in E.leaves(ea) | E.leaves(eb) if isinstance(lf, E.Sym)},
                    key=E.to_str):
        pa, pb = _split(ea, s), _split(eb, s)
        if pa is None or pb is None:
            continue
        if _within(pa[1], s, ga, na) and _within(pb[1], s, gb, nb):
            return coordinates(pa[0], pb[0], ga, gb, na, nb) + [(pa[1], pb[1])]
    return [(ea, eb)]


@dataclass(frozen=True)
class _Sided:
    """One access as side ``tag`` of a pair: its variables renamed
    (``ren``), its thread (``th``: the renamed thread variable, a fresh one
    for a program-level load, ``0`` for a program-level store) and the facts
    that bound them (:func:`_facts`)."""

    ren: dict[str, str]
    th: E.Expr
    facts: Fm.F


#: the sides of the current phase's accesses, by ``(id(access), tag)``: an
#: access meets many others, its side is the same each time
_SIDES: dict[tuple[int, str], tuple[Any, _Sided]] = {}


def _sided(acc: _Access, tag: str, pid: str) -> _Sided:
    key = (id(acc), tag)
    hit = _SIDES.get(key)
    if hit is not None and hit[0] is acc:
        return hit[1]
    ren, _ = _side(acc, tag, pid)
    t = E.Var(ren[acc.thread]) if acc.thread else (
        E.Var(f"thread#{tag}") if not acc.store else None)
    th: E.Expr = t if t is not None else E.Const(0)
    got = _Sided(ren, th, _facts(acc, ren, th))
    _SIDES[key] = (acc, got)
    return got


def _pair(k: Any, ph: Any, a: _Access, b: _Access, scen: list[_Scenario]) -> Obligation:
    pid = ph.pid.name
    sa, sb = _sided(a, "1", pid), _sided(b, "2", pid)
    ren_a, ren_b, th1, th2 = sa.ren, sb.ren, sa.th, sb.th
    loops_a = {lp.key: lp for lp in a.loops}
    # an asynchronous store is unordered with its own thread's accesses too
    own_thread = bool(a.lag or b.lag or a.asynchronous or b.asynchronous)
    alts = []
    for sc in scen:
        eqs = []
        for key in sc.same:
            lp = loops_a[key]
            if lp.var:
                eqs.append(Fm.atom(E.Var(ren_a[lp.var]).eq(E.Var(ren_b[lp.var]))))
        if sc.split is not None and loops_a[sc.split].var:
            lp = loops_a[sc.split]
            x, y = E.Var(ren_a[lp.var]), E.Var(ren_b[lp.var])
            first, later = (x, y) if sc.rel == "after" else (y, x)
            eqs.append(Fm.atom((first if lp.reverse else later).gt(
                later if lp.reverse else first)))
        elif own_thread and sc.split is None and a.seq == b.seq:
            eqs.append(Fm.atom(th1.ne(th2)))  # one thread's one access: itself
        bound = _path_bound(sc, {"a": ren_a, "b": ren_b}, loops_a)
        if bound is not None:
            eqs.append(Fm.atom(bound))
        alts.append(Fm.conj(*eqs))
    opaque = a.index is None or b.index is None  # an element computed from data
    ea = None if a.index is None else E.rename(a.index, ren_a)
    same = Fm.TRUE if opaque else Fm.conj(*(
        Fm.atom(E.rename(x, ren_a).eq(E.rename(y, ren_b)))
        for x, y in coordinates(a.index, b.index, a.guards + _ranges(a), b.guards + _ranges(b),
                                _nonneg_vars(ph, a), _nonneg_vars(ph, b))))
    body = Fm.conj(sa.facts, sb.facts, Fm.disj(*alts),
                   Fm.TRUE if own_thread else Fm.atom(th1.ne(th2)), same)
    hyp = Fm.conj(_program(ph, Fm.free_vars(body)), body)
    syms = sorted(Fm.syms(hyp))
    assume = Fm.conj(*(Fm.atom(E.Sym(s).ge(0)) for s in syms))
    claim = Fm.Claim(Fm.ordered_vars(hyp), hyp, Fm.FALSE, assume)
    info = {v: VarInfo(v.replace("#1", " (first)").replace("#2", " (second)"))
            for v in claim.vars}
    dropped = a.dropped + b.dropped
    title = (f"{ph.name}: threads never conflict on {a.buf.name} between barriers: "
             f"`{a.text}` and `{b.text}`")

    def explain(pt: dict) -> list[str]:
        env = Fm.env_of(pt, syms)
        x1, x2 = E.evaluate(th1, env), E.evaluate(th2, env)
        el = "?" if ea is None else E.evaluate(ea, env)
        loops1 = ", ".join(f"{lp.var}={pt.get(ren_a[lp.var])}" for lp in a.loops if lp.var)
        loops2 = ", ".join(f"{lp.var}={pt.get(ren_b[lp.var])}" for lp in b.loops if lp.var)
        prog = pt.get(pid)
        if prog is None:  # from the coordinates (row-major)
            prog = 0
            for i, n in enumerate(ph.extents):
                prog = prog * E.evaluate(n, env) + pt.get(_coordinate(ph, i), 0)
        return [(f"program {pid}={prog}: threads {x1} and {x2} both access "
                f"{a.buf.name}[{el}] in one barrier interval"),
                f"thread {x1}: {a.text}" + (f" at {loops1}" if loops1 else ""),
                f"thread {x2}: {b.text}" + (f" at {loops2}" if loops2 else ""),
                ("the asynchronous store is still in flight: lower the keep of the barriers "
                 "between them" if a.lag or b.lag else
                 "no block barrier separates them: add one between the two statements")]

    ob = Obligation(KIND, title, (), claim, info=info, explain=explain,
                    refutable=not dropped, inexact_note="; ".join(dropped),
                    witness={"kernel": k.name, "phase": ph.name, "buffer": a.buf.name,
                             "accesses": (a.text, b.text), "scenarios": scen})
    data = a.data + b.data
    if data or a.index is None or b.index is None:
        why = ", ".join(sorted(set(data))) or "a computed value"

        def unknown(o: Obligation, t: float, why: str = why) -> None:
            o.set(UNKNOWN, "structural", f"the index reads data ({why}): the threads' "
                  "elements are not index expressions")

        ob.decider = unknown
    return ob


def barrier_obligations(kernel: Any, threads: int | None = None) -> list[Obligation]:
    """One ``barrier.sufficiency`` obligation per pair of accesses to one
    ``shared`` or ``global`` buffer, at least one a store, that can occur in
    one barrier interval of one program of ``kernel`` (a loop-IR kernel in SIMT
    form); ``threads`` is the block size (default: each phase's widest thread
    loop). See the module docstring for the formula."""
    L = _L()
    _MEMO.clear()
    _SIDES.clear()
    out: list[Obligation] = []
    for ph in kernel.phases:
        ws = [int(s.hi.value) for s in L.walk(ph.body)
              if isinstance(s, L.For) and s.kind == "thread" and isinstance(s.hi, E.Const)]
        width = threads if threads is not None else (max(ws) if ws else 1)
        if width <= 1 and not ws:
            continue  # one thread per program: nothing is concurrent
        accs = _Collector(kernel, ph, width).run()
        for i, a in enumerate(accs):
            for b in accs[i:]:
                if a.buf.name != b.buf.name or not (a.store or b.store):
                    continue
                if a.thread is None and b.thread is None and a.store and b.store:
                    continue  # both by thread 0
                if a.seq == b.seq and a.thread is None:
                    continue  # one program-level access: by thread 0, or a load
                scen = scenarios(a, b)
                if scen:
                    out.append(_pair(kernel, ph, a, b, scen))
    return out


def check_barriers(kernel: Any, threads: int | None = None,
                   timeout: float = 5.0) -> list[Obligation]:
    """:func:`barrier_obligations`, discharged (for the compiler: a refuted
    one is a race of the SIMT program)."""
    return discharge(barrier_obligations(kernel, threads), timeout=timeout)
