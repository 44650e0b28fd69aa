"""Thread loops run by one thread: the loop IR without concurrency.

A backend without hardware threads (the LLVM CPU backend) runs a program of
the SIMT form (``loopir.py``: ``For(kind="thread")``, barriers, warp
collectives) by executing the iterations of each thread loop one after
another. That is only faithful *between* synchronization points, so
:func:`serialize_kernel` first splits every thread loop at them (loop
fission):

``for.thread t in [0, W): A; barrier; B``  becomes  ``for t: A`` then ``for t: B``

A synchronization point nested in a loop or an ``if`` whose bounds or
condition do not depend on the thread is reached by all threads alike, so the
loop or ``if`` is moved outside the thread loop (``for.thread t: for k: A;
barrier; B`` becomes ``for k: (for t: A); (for t: B)``). A synchronization
point under control flow that depends on the thread is refused: the threads
would not reach it together.

Thread-private state that lives across a split -- a local assigned in one
piece and used in another, a ``local`` buffer -- gets one copy per thread: a
``local`` buffer of ``W`` times its size indexed by ``t``. Each piece loads
the copies it uses on entry and stores them on exit.

Warp collectives become exchanges through such a buffer: every lane writes
its value (``xch[t] = v``), the loop splits, and every lane reads its source
lane's (``dst = xch[src(t)]``, with ``src`` as in :class:`loopir.Shuffle`).
``LaneReduce`` is first expanded to its butterfly of shuffles
(:func:`expand_lane_reduce`), so its grouping is the one the SIMT target runs;
``WarpMma`` to each lane's in-order contraction of the accumulator elements
it owns (:func:`expand_warp_mma`).

Invariant: the result has no thread loop, barrier of scope ``block``/``warp``
or collective, and every thread loop of the input was executed for every
``t`` in order, piece by piece: an execution the concurrent semantics admits
(each piece's iterations do not conflict, by barrier sufficiency).
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

from ..errors import NotAvailableError
from ..semantics import dtypes as D
from ..semantics import expr as E
from . import loopir as L

_ids = itertools.count()


def _fresh(stem: str) -> str:
    return f"{stem}.s{next(_ids)}"


def expand_lane_reduce(body: tuple) -> tuple:
    """Replace every ``LaneReduce`` by its butterfly (the meaning it is
    defined by): ``v = value; for o = width/2 .. 1: u = shuffle_xor(v, o);
    v = op(v, u); dst = v``."""

    def fs(s: Any) -> tuple | None:
        if not isinstance(s, L.LaneReduce):
            return None
        dt = s.dst.dtype
        v = L.LVar(_fresh("lr"), dt)
        out: list = [L.Assign(v, s.value)]
        o = s.width // 2
        while o >= 1:
            u = L.LVar(_fresh("lx"), dt)
            out.append(L.Shuffle(u, L.Ref(v), E.Const(o), "xor", s.width, s.mask))
            out.append(L.Assign(v, L.Bin(s.op, L.Ref(v), L.Ref(u), dt, s.flags)))
            o //= 2
        out.append(L.Assign(s.dst, L.Ref(v)))
        return tuple(out)

    return L.map_stmts(body, lambda x: None, fs)


def expand_warp_mma(body: tuple) -> tuple:
    """Replace every ``WarpMma`` by its reference (``WarpMma.reference``: each
    lane contracts its own accumulator elements in order, an evaluation the
    reassociating sum admits). No split is needed at it: the accumulator
    elements a lane touches are its own, and no thread writes the operands
    in the collective's barrier interval (barrier sufficiency is proved over
    ``WarpMma.footprint``, every element a lane of the warp may read)."""

    def fs(s: Any) -> tuple | None:
        return s.reference() if isinstance(s, L.WarpMma) else None

    return L.map_stmts(body, lambda x: None, fs)


def shuffle_source(t: E.Expr, mode: str, lane: E.Expr, width: int) -> tuple[E.Expr, E.Pred]:
    """``(src, ok)``: the lane that lane ``t`` reads in a shuffle, and when that
    lane is inside ``t``'s group (otherwise ``t`` keeps its own value)."""
    q = E.mod(t, width)
    base = E.add(t, E.mul(-1, q))
    if mode == "idx":
        return E.add(base, E.mod(lane, width)), E.BoolConst(True)
    if mode == "xor":
        return E.add(base, E.mod(E.bitop("^", q, lane), width)), E.BoolConst(True)
    if mode == "up":
        return E.add(t, E.mul(-1, lane)), E.cmp(">=", q, lane)
    if mode == "down":
        return E.add(t, lane), E.cmp("<", E.add(q, lane), width)
    raise ValueError(f"shuffle mode {mode}")


class _ThreadLoop:
    """Serialization of one thread loop ``for.thread t in [0, W)``."""

    def __init__(self, loop: L.For, outside: set[str], new_bufs: list[L.Buffer]):
        self.t = loop.var
        self.W = loop.hi
        self.outside = outside  # locals defined before the thread loop (uniform)
        self.new_bufs = new_bufs
        self.private: dict[str, L.LVar] = {}
        self.copies: dict[str, L.Buffer] = {}

    # -- splitting ---------------------------------------------------------

    def split(self, body: tuple) -> list:
        """``body`` as a list of items: ``("run", stmts)`` (no sync inside),
        ``("xch", Shuffle)``, ``("sync",)``, ``("for", For, items)``,
        ``("if", If, then_items, else_items)``."""
        items: list = []
        run: list = []

        def flush() -> None:
            if run:
                items.append(("run", tuple(run)))
                run.clear()

        for s in body:
            if isinstance(s, L.Barrier) and s.scope != "program":
                flush()
                items.append(("sync",))
            elif isinstance(s, L.Shuffle):
                flush()
                items.append(("xch", s))
            elif isinstance(s, L.Barrier):
                continue
            elif not L.has_sync((s,)):
                run.append(s)
            elif isinstance(s, L.For):
                self.uniform(s, [L.IExpr(s.lo), L.IExpr(s.hi)])
                flush()
                items.append(("for", s, self.split(s.body)))
            elif isinstance(s, L.If):
                self.uniform(s, [s.cond])
                flush()
                items.append(("if", s, self.split(s.then), self.split(s.orelse)))
            else:
                raise NotAvailableError(
                    "a synchronization point inside a `while` loop of a thread loop "
                    "cannot be run by one thread",
                    hint="lower this program without threads (the default CPU schedule)")
        flush()
        return items

    def uniform(self, s: Any, exprs: list) -> None:
        """Refuse moving ``s`` out of the thread loop when ``exprs`` read the
        thread id or thread-private locals."""
        names = set().union(*(L.names(x) for x in exprs))
        bad = names & (set(self.private) | {self.t.name})
        if bad:
            raise NotAvailableError(
                f"a synchronization point under control flow that depends on the thread "
                f"(reads {', '.join(sorted(bad))}) cannot be run by one thread",
                hint="every thread must reach a barrier or a collective together")

    # -- emission -----------------------------------------------------------

    def pieces(self, items: list) -> list:
        """The items as a tree of *pieces* (statements run by every thread
        before the next synchronization point): ``("piece", stmts)``,
        ``("for", For, nodes)``, ``("if", If, then_nodes, else_nodes)``. A
        shuffle ends the current piece with the lane's write of its value and
        starts the next with the read of its source lane's."""
        out: list = []
        cur: list = []
        t = E.Var(self.t.name)

        def flush() -> None:
            if cur:
                out.append(("piece", tuple(cur)))
                cur.clear()

        for it in items:
            if it[0] == "run":
                cur.extend(it[1])
            elif it[0] == "sync":
                flush()
            elif it[0] == "xch":
                sh = it[1]
                xch = L.Buffer(_fresh("xch"), sh.value.dtype, "local", self.W)
                self.new_bufs.append(xch)
                cur.append(L.Store(xch, L.IExpr(t), sh.value))
                flush()
                src, ok = shuffle_source(t, sh.mode, sh.lane, sh.width)
                if ok == E.BoolConst(True):
                    got = L.Load(xch, L.IExpr(src))
                else:
                    got = L.Load(xch, L.IExpr(src), L.IPred(ok), L.Load(xch, L.IExpr(t)))
                cur.append(L.Assign(sh.dst, got))
            elif it[0] == "for":
                flush()
                out.append(("for", it[1], self.pieces(it[2])))
            elif it[0] == "if":
                flush()
                out.append(("if", it[1], self.pieces(it[2]), self.pieces(it[3])))
        flush()
        return out

    def crossing(self, nodes: list) -> set[str]:
        """Thread-private locals used by more than one piece."""
        first: dict[str, int] = {}
        many: set[str] = set()
        count = [0]

        def visit(ns: list) -> None:
            for nd in ns:
                if nd[0] == "piece":
                    count[0] += 1
                    for name in (L.referenced(nd[1]) | set(L.assigned(nd[1]))) & set(self.private):
                        if first.setdefault(name, count[0]) != count[0]:
                            many.add(name)
                elif nd[0] == "for":
                    visit(nd[2])
                    visit(nd[2])  # a loop's pieces run again: state crosses iterations
                else:
                    visit(nd[2])
                    visit(nd[3])

        visit(nodes)
        return many

    def wrap(self, body: tuple) -> tuple:
        """One piece as a loop over the threads, with the thread copies of the
        crossing locals loaded on entry and stored on exit."""
        t = E.Var(self.t.name)
        pre, post = [], []
        used = L.referenced(body) | set(L.assigned(body))
        for name in sorted(used & set(self.copies)):
            var, buf = self.private[name], self.copies[name]
            pre.append(L.Assign(var, L.Load(buf, L.IExpr(t))))
            post.append(L.Store(buf, L.IExpr(t), L.Ref(var)))
        return (L.For(self.t, E.Const(0), self.W, tuple(pre) + body + tuple(post), "serial"),)

    def emit(self, nodes: list) -> tuple:
        out: list = []
        for nd in nodes:
            if nd[0] == "piece":
                out.extend(self.wrap(nd[1]))
            elif nd[0] == "for":
                f = nd[1]
                out.append(L.For(f.var, f.lo, f.hi, self.emit(nd[2]), "serial", f.reverse))
            else:
                out.append(L.If(nd[1].cond, self.emit(nd[2]), self.emit(nd[3])))
        return tuple(out)

    def serialize(self, loop: L.For) -> tuple:
        body = expand_warp_mma(expand_lane_reduce(loop.body))
        self.private = L.assigned(body)
        self.private.pop(self.t.name, None)
        if not L.has_sync(body):
            return (L.For(self.t, E.Const(0), self.W, body, "serial"),)
        nodes = self.pieces(self.split(body))
        for name in sorted(self.crossing(nodes)):
            var = self.private[name]
            buf = L.Buffer(_fresh(f"thr_{name.split('.')[0]}"), var.dtype, "local", self.W)
            self.copies[name] = buf
            self.new_bufs.append(buf)
        return self.emit(nodes)


def _private_buffers(k: L.Kernel) -> list[L.Buffer]:
    """``local`` buffers used inside thread loops (they are per thread)."""
    out: dict[str, L.Buffer] = {}
    for ph in k.phases:
        for s in L.walk(ph.body):
            if isinstance(s, L.For) and s.kind == "thread":
                for inner in L.walk(s.body):
                    for x in L.stmt_exprs(inner):
                        for y in L.subexprs(x):
                            if isinstance(y, L.Load) and y.buf.space == "local":
                                out[y.buf.name] = y.buf
                    if isinstance(inner, L.Store) and inner.buf.space == "local":
                        out[inner.buf.name] = inner.buf
                    if isinstance(inner, L.WarpMma):
                        out.update((f.buf.name, f.buf) for f in (inner.a, inner.b, inner.c)
                                   if f.buf.space == "local")
    return list(out.values())


def _expand_private(k: L.Kernel) -> L.Kernel:
    """Give every ``local`` buffer used inside a thread loop one copy per
    thread (size ``W * n``, thread ``t`` at offset ``t * n``), so that pieces
    of a split thread loop keep each thread's contents apart."""
    bufs = _private_buffers(k)
    if not bufs:
        return k
    names = {b.name for b in bufs}
    widths = {}
    for ph in k.phases:
        for s in L.walk(ph.body):
            if isinstance(s, L.For) and s.kind == "thread":
                for b in bufs:
                    widths.setdefault(b.name, s.hi)
    big = {b.name: replace(b, size=E.mul(b.size, widths[b.name])) for b in bufs}

    def in_loop(body: tuple, t: E.Var | None) -> tuple:
        out = []
        for s in body:
            if isinstance(s, L.For) and s.kind == "thread":
                tv = E.Var(s.var.name)
                s = replace(s, body=in_loop(s.body, tv))
                out.append(s)
                continue
            if t is None:  # program level: thread loops may be nested in its statements
                if isinstance(s, L.For):
                    s = replace(s, body=in_loop(s.body, None))
                elif isinstance(s, L.If):
                    s = replace(s, then=in_loop(s.then, None), orelse=in_loop(s.orelse, None))
                elif isinstance(s, L.While):
                    s = replace(s, pre=in_loop(s.pre, None), body=in_loop(s.body, None))
                out.append(s)
                continue

            def fe(x: Any, t=t) -> Any:
                if isinstance(x, L.Load) and x.buf.name in names:
                    b = big[x.buf.name]
                    return L.Load(b, _offset(x.index, x.buf, t), x.guard, x.fill)
                return None

            def fs(st: Any, t=t) -> Any:
                if isinstance(st, L.Store) and st.buf.name in names:
                    b = big[st.buf.name]
                    return (L.Store(b, _offset(st.index, st.buf, t), st.value, st.guard,
                                    st.mode),)
                if isinstance(st, L.WarpMma):  # a lane fragment: this thread's copy
                    fr = {f: replace(g, buf=big[g.buf.name],
                                     offset=E.add(g.offset, E.mul(t, g.buf.size)))
                          for f in ("a", "b", "c") for g in (getattr(st, f),)
                          if g.buf.name in names}
                    return (replace(st, **fr),) if fr else None
                return None

            out.extend(L.map_stmts((s,), fe, fs))
        return tuple(out)

    phases = tuple(replace(ph, body=in_loop(ph.body, None)) for ph in k.phases)
    locals_ = tuple(big.get(b.name, b) for b in k.locals)
    return replace(k, phases=phases, locals=locals_)


def _offset(index: L.Expr, buf: L.Buffer, t: E.Var) -> L.Expr:
    base = E.mul(t, buf.size)
    if isinstance(index, L.IExpr):
        return L.IExpr(E.add(index.e, base))
    return L.Bin("add", index, L.IExpr(base), D.i64)


def serialize_kernel(k: L.Kernel) -> L.Kernel:
    """``k`` with every thread loop run by one thread (see the module docstring)."""
    if not any(isinstance(s, L.For) and s.kind == "thread"
               for ph in k.phases for s in L.walk(ph.body)):
        return k
    k = _expand_private(k)
    new_bufs: list[L.Buffer] = []

    def body_of(body: tuple, outside: set[str]) -> tuple:
        out = []
        for s in body:
            if isinstance(s, L.For) and s.kind == "thread":
                out.extend(_ThreadLoop(s, outside, new_bufs).serialize(s))
            elif isinstance(s, L.For):
                out.append(replace(s, body=body_of(s.body, outside | {s.var.name})))
            elif isinstance(s, L.If):
                out.append(replace(s, then=body_of(s.then, outside), orelse=body_of(s.orelse,
                                                                                  outside)))
            elif isinstance(s, L.While):
                out.append(replace(s, pre=body_of(s.pre, outside), body=body_of(s.body, outside)))
            elif isinstance(s, L.Barrier):
                continue
            else:
                if isinstance(s, L.Assign):
                    outside = outside | {s.var.name}
                out.append(s)
        return tuple(out)

    phases = tuple(replace(ph, body=body_of(ph.body, {ph.pid.name})) for ph in k.phases)
    return replace(k, phases=phases, locals=k.locals + tuple(new_bufs))
