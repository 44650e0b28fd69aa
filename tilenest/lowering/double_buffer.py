"""Multi-stage buffering of a contraction loop's operand tiles (SIMT form).

A program-level loop of the SIMT form whose iterations each *produce* tiles
into ``shared`` buffers and then *consume* them, a block barrier between::

    for k in [lo, hi):
        barrier; P(k)            -- thread loops storing only into buffers X
        barrier; C(k)            -- reads X, never writes it

is rewritten, for ``S >= 2`` stages, so that the tiles of iterations ``k +
1 .. k + S - 1`` are on their way while iteration ``k`` consumes its own:
each buffer ``X`` gets ``S`` versions (a buffer ``S`` times the size,
version ``v`` at offset ``v * |X|``), iteration ``k`` using version
``(k - lo) % S``::

    barrier
    P(lo) into version 0;  barrier keep=1;  ..;  P(lo + S - 2) into version S - 2
    for k in [lo, hi):
        barrier keep=S-2
        if k + S - 1 < hi: P(k + S - 1) into version (k + S - 1 - lo) % S
        C(k) reading version (k - lo) % S
    barrier

(each ``P(j)`` guarded by ``j < hi``). When ``C`` is a warpgroup mma into
registers (``WarpMma.group > 1`` with a lane-fragment accumulator) and ``S
>= 3``, the tensor cores are kept busy across the barrier instead: the mma
is *overlapped* (``WarpMma.overlap``: issued, then completed at a later
barrier) and runs on while the version the previous step's mma read is
released and refilled (:data:`RELEASE_AFTER`)::

    P(lo) .. P(lo + S - 2)  (as above)
    for k in [lo, hi):
        barrier keep=S-2 mma_keep=1
        C(k) reading version (k - lo) % S   -- still running at the next barriers
        barrier keep=S-2 mma_keep=1
        if k + S - 1 < hi: P(k + S - 1) into version (k + S - 1 - lo) % S

At the second barrier of iteration ``k`` the mma of ``k - 1`` is complete in
every thread (``mma_keep = 1``: only ``C(k)``'s may run on), so its version,
``(k + S - 1 - lo) % S``, may be refilled: ``S - 1`` tiles are in flight
while the tensor cores work through ``C(k)``. Without the second barrier
(``RELEASE_AFTER`` false) the version of ``k - 2`` is the one refilled, at
the top of the iteration, and ``S - 2`` tiles are in flight::

    P(lo) .. P(lo + S - 3)
    for k in [lo, hi):
        barrier keep=S-3 mma_keep=1
        C(k) reading version (k - lo) % S
        if k + S - 2 < hi: P(k + S - 2) into version (k + S - 2 - lo) % S

The producers' stores are
asynchronous (``Store.mode = "async"``: ``cp.async`` on ``cuda``), and a
barrier with ``keep = S - 2`` orders all but the ``S - 2`` newest groups of
them (``Barrier.keep``): at the top of iteration ``k`` the group of
``P(k)`` is complete and visible to every thread, while those of ``P(k +
1) .. P(k + S - 2)`` may still be in flight, and every thread has finished
``C(k - 1)``, whose version ``P(k + S - 1)`` then overwrites. One barrier
per iteration instead of two, and ``S - 1`` tiles of memory traffic overlap
the consumer's work (``S = 2``: double buffering, ``keep = 0``).

A thread loop before the barrier that stores only into thread-private
(``local``) buffers -- a tile cleared in the lanes' registers
(``fragments.py``) -- belongs to the consumer: it is moved to the
consumer's start, where each thread still runs it before the statements
after the barrier that read it.

It is a reordering of independent work: it applies only when the producer
reads no buffer the loop writes and no local the loop assigns outside the
producer, the buffers ``X`` are touched nowhere else in the phase, and the
consumer never writes them; then ``P(k + j)`` commutes with ``C(k)``. The
barrier-sufficiency obligation is discharged on the rewritten kernel (with
the asynchronous stores in flight across ``keep`` barriers), so the
placement of the versions and the barriers is proved, not trusted.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..semantics import expr as E
from . import loopir as L


def _stores(body: tuple) -> set[str]:
    return {s.buf.name for s in L.walk(body) if isinstance(s, L.Store)} | {
        s.c.buf.name for s in L.walk(body) if isinstance(s, L.WarpMma)}


def _reads(body: tuple) -> set[str]:
    out = {y.buf.name for y in L.evaluated(body) if isinstance(y, L.Load)}
    for s in L.walk(body):
        if isinstance(s, L.WarpMma):
            out |= {s.a.buf.name, s.b.buf.name, s.c.buf.name}
    return out


def _own_accesses(s: Any) -> set[str]:
    """The buffers statement ``s`` itself reads or writes, not those of the
    statements nested in it (an ``If`` around the loop is not an access)."""
    out = {y.buf.name for y in L.evaluated((s,), nested=False) if isinstance(y, L.Load)}
    if isinstance(s, L.Store):
        out.add(s.buf.name)
    if isinstance(s, L.WarpMma):
        out |= {s.a.buf.name, s.b.buf.name, s.c.buf.name}
    return out


def _private(s: L.For) -> bool:
    """Does thread loop ``s`` store only into thread-private (``local``)
    buffers? (Attention's score tile cleared in the lanes' registers.)"""
    stores = [t for t in L.walk((s,)) if isinstance(t, L.Store)]
    return bool(stores) and all(t.buf.space == "local" for t in stores) and not any(
        isinstance(t, (L.WarpMma, L.Barrier, L.Shuffle, L.LaneReduce)) for t in L.walk((s,)))


def _copy_in(s: Any) -> bool:
    """Is ``s`` a thread loop that stores only into ``shared`` buffers and
    reads none (a tile's copy in from global memory)?"""
    if not (isinstance(s, L.For) and s.kind == "thread"):
        return False
    stores = [t for t in L.walk((s,)) if isinstance(t, L.Store)]
    reads = [y for y in L.evaluated((s,)) if isinstance(y, L.Load)]
    return (bool(stores) and all(t.buf.space == "shared" for t in stores)
            and all(y.buf.space == "global" for y in reads)
            and not any(isinstance(t, L.WarpMma) for t in L.walk((s,))))


def _split(loop: L.For) -> tuple[tuple, tuple] | None:
    """``(producer, consumer)`` of a loop body ``[barrier] P.. barrier C..``
    (comments before the consumer's barrier move into the consumer), else None.
    A thread loop among ``P`` that stores only into thread-private buffers
    moves to the start of ``C``: each thread's own state, which no other
    thread and no producer reads, it is not a tile to buffer. When the loop
    begins with more copies in from global memory (``_copy_in``) than that
    finds, with block barriers among them (attention: the key tile, a
    barrier ordering the previous step's reads of the value tile, the value
    tile), each into its own buffers, those copies are ``P`` and the
    barriers among them are dropped: they order the previous iteration's
    reads of a tile before its overwriting, which the ring's versions and
    its own barrier do."""
    body = list(loop.body)
    if body and L.is_block_barrier(body[0]):
        body = body[1:]
    got = _split_at_barrier(list(body))
    lead = 0
    while lead < len(body) and (L.is_block_barrier(body[lead]) or _copy_in(body[lead])
                                or isinstance(body[lead], L.Comment)
                                or (isinstance(body[lead], L.For) and _private(body[lead]))):
        lead += 1
    copies = [x for x in body[:lead] if _copy_in(x)]
    written = [_stores((x,)) for x in copies]
    if len(copies) <= (len(got[0]) if got else 0) or lead == len(body) \
            or L.is_block_barrier(body[-1]) or len(set().union(*written)) < sum(map(len, written)):
        return got  # (copies into one buffer stay ordered by their barriers)
    rest = [x for x in body[:lead] if not _copy_in(x) and not L.is_block_barrier(x)]
    notes = [x for x in rest if isinstance(x, L.Comment)]
    own = [x for x in rest if not isinstance(x, L.Comment)]
    return tuple(copies), tuple(notes) + tuple(own) + tuple(body[lead:])


def _split_at_barrier(body: list) -> tuple[tuple, tuple] | None:
    """``_split`` for a body ``P.. barrier C..`` (its leading barrier removed)."""
    prod, own = [], []
    while body and isinstance(body[0], L.For) and body[0].kind == "thread":
        (own if _private(body[0]) else prod).append(body.pop(0))
    notes = []
    while body and isinstance(body[0], L.Comment):
        notes.append(body.pop(0))
    if not prod or not body or not L.is_block_barrier(body[0]):
        return None
    cons = tuple(notes) + tuple(own) + tuple(body[1:])
    if not cons or any(L.is_block_barrier(s) for s in cons[-1:]):
        return None
    return tuple(prod), cons


def plan(loop: L.For, phase_bodies: list[tuple], bufs: dict[str, L.Buffer]
         ) -> tuple[tuple, tuple, list[L.Buffer]] | None:
    """The producer, consumer and versioned buffers of ``loop`` when the
    rewrite applies (module docstring; ``phase_bodies``: every phase of the
    kernel, where the buffers must not be touched outside the loop), else
    None."""
    if loop.kind != "serial" or loop.reverse:
        return None
    parts = _split(loop)
    if parts is None:
        return None
    prod, cons = parts
    if any(L.has_sync(p.body) for p in prod):
        return None
    xs = _stores(prod)
    if not xs or any(bufs.get(x) is None or bufs[x].space != "shared" for x in xs):
        return None
    if xs & _stores(cons) or _reads(prod) & (_stores(prod) | _stores(cons)):
        return None
    inside = {id(s) for s in L.walk(loop.body)}
    if any(xs & _own_accesses(s) for body in phase_bodies for s in L.walk(body)
           if id(s) not in inside and s is not loop):
        return None
    # the producer depends on the iteration only through the loop variable,
    # and the consumer reads none of the producer's locals (P(k + 1) runs first)
    own = set(L.assigned(prod))
    needs = L.referenced(prod) - own
    if needs & (set(L.assigned(cons)) | set(L.assigned(loop.body)) - own):
        return None
    if L.referenced(cons) & own:
        return None
    if (L.names(L.IExpr(loop.lo)) | L.names(L.IExpr(loop.hi))) & set(L.assigned(loop.body)):
        return None
    return prod, cons, [bufs[x] for x in sorted(xs)]


def _shift(index: L.Expr, off: E.Expr) -> L.Expr:
    """``index + off`` (an index expression, or a computed i64 index)."""
    if isinstance(index, L.IExpr):
        return L.IExpr(E.add(index.e, off))
    return L.Bin("add", index, L.IExpr(off), L.INDEX)


def _versioned(body: tuple, xs: dict[str, tuple[L.Buffer, E.Expr]], store_mode: str) -> tuple:
    """``body`` with every access to a buffer of ``xs`` moved to the new
    buffer at the version offset, its stores marked ``store_mode``."""

    def fe(x: Any) -> Any:
        if isinstance(x, L.Load) and x.buf.name in xs:
            nb, off = xs[x.buf.name]
            return replace(x, buf=nb, index=_shift(x.index, off))
        return None

    def fs(s: Any) -> Any:
        if isinstance(s, L.For) and s.bulk is not None and s.bulk.dst.name in xs:
            nb, off = xs[s.bulk.dst.name]
            return (replace(s, bulk=replace(s.bulk, dst=nb, at=E.add(s.bulk.at, off))),)
        if isinstance(s, L.Store) and s.buf.name in xs:
            nb, off = xs[s.buf.name]
            return (replace(s, buf=nb, index=_shift(s.index, off), mode=store_mode),)
        if isinstance(s, L.WarpMma):
            fr = {}
            for f in ("a", "b", "c"):
                g = getattr(s, f)
                if g.buf.name in xs:
                    nb, off = xs[g.buf.name]
                    fr[f] = replace(g, buf=nb, offset=E.add(g.offset, off))
            return (replace(s, **fr),) if fr else None
        return None

    return L.map_stmts(body, fe, fs)


def at_step(body: tuple, var: L.LVar, value: E.Expr) -> tuple:
    """``body`` with loop variable ``var`` replaced by ``value``."""
    v = E.Var(var.name)

    def fe(x: Any) -> Any:
        if isinstance(x, L.IExpr) and v in E.leaves(x.e):
            return L.IExpr(E.subst(x.e, {v: value}))
        if isinstance(x, L.IPred) and v in E.leaves(x.p):
            return L.IPred(E.subst(x.p, {v: value}))
        return None

    return L.map_stmts(body, fe)


#: the overlapped ring releases the previous step's version at a second
#: barrier after the consumer's mma is issued (``S - 1`` tiles ahead) instead
#: of the version of two steps back at the top of the step (``S - 2``)
RELEASE_AFTER = True


def lookahead(stages: int, overlap: bool) -> int:
    """Steps whose tiles are produced ahead of the one consumed: ``S - 1``,
    or ``S - 2`` when the consumer's mma overlaps the next step and the
    version it leaves is released at the next step's barrier (module
    docstring: one version is still being read)."""
    return stages - 2 if overlap and not RELEASE_AFTER else stages - 1


def consumer_barriers(cons: tuple) -> int:
    """How many block barriers the consumer ``cons`` runs in each iteration,
    when they all lie directly in it with no ``keep`` of their own (so every
    iteration runs the same number of them, in every thread), else 0: the
    ring's tiles are then kept in flight across them (:func:`rewrite`)."""
    top = [x for x in cons if L.is_block_barrier(x)]
    every = [x for x in L.walk(cons) if isinstance(x, L.Barrier)]
    if len(every) != len(top) or any(x.keep or x.mma_keep for x in top):
        return 0
    return len(top)


def overlappable(cons: tuple) -> bool:
    """Whether the consumer's warpgroup mmas (on lane-fragment accumulators)
    may run on across the next barrier (``WarpMma.overlap``): there is one,
    and no other statement of the consumer reads or writes their
    accumulators or writes the registers they read ``a`` from. A GEMM's step
    is such a consumer; attention's is not: it reads its scores at once and
    writes ``P``, the register operand of ``P V``, every step."""
    mmas = [x for x in L.walk(cons) if isinstance(x, L.WarpMma) and x.group > 1
            and x.c.lane_cols]
    if not mmas:
        return False
    held = {x.c.buf.name for x in mmas}
    regs = {x.a.buf.name for x in mmas if x.a.lane_cols}
    for st in L.walk(cons):
        if isinstance(st, L.WarpMma) and st in mmas:
            continue
        reads = {y.buf.name for x in L.stmt_exprs(st) for y in L.subexprs(x)
                 if isinstance(y, L.Load)}
        writes = {st.buf.name} if isinstance(st, L.Store) else set()
        if isinstance(st, L.WarpMma):
            reads |= {st.a.buf.name, st.b.buf.name, st.c.buf.name}
            writes |= {st.c.buf.name}
        if (reads | writes) & held or writes & regs:
            return False
    return True


def rewrite(loop: L.For, prod: tuple, cons: tuple, olds: list[L.Buffer], stages: int
            ) -> tuple[tuple, dict[str, L.Buffer]]:
    """The statements replacing ``loop`` (``stages`` versions of each buffer
    of ``olds``) and the new buffers by old name."""
    kv = E.Var(loop.var.name)
    news = {b.name: replace(b, size=E.mul(b.size, stages)) for b in olds}

    def version(k: E.Expr) -> dict[str, tuple[L.Buffer, E.Expr]]:
        ver = E.mod(E.add(k, E.mul(-1, loop.lo)), stages)
        return {b.name: (news[b.name], E.mul(ver, b.size)) for b in olds}

    def produce(k: E.Expr) -> L.If:
        return L.If(L.IPred(E.cmp("<", k, loop.hi)),
                    _versioned(at_step(prod, loop.var, k), version(k), "async"))

    overlap = stages >= 3 and overlappable(cons)
    ahead = lookahead(stages, overlap)
    what = (f"the consumer's warpgroup mmas run on across one barrier; tiles of the next "
            f"{ahead} steps are in flight" if overlap else
            f"tiles of the next {ahead} steps are in flight while one is consumed")
    consume = _versioned(cons, version(kv), "")
    inner = 0 if overlap else consumer_barriers(consume)
    if inner:  # the tiles stay in flight across the consumer's own barriers
        lag = ahead * (inner + 1) - 1
        consume = tuple(replace(x, keep=lag) if L.is_block_barrier(x) else x for x in consume)
        what += f" (across the consumer's {inner} barrier{'s' if inner > 1 else ''} too)"
    else:
        lag = ahead - 1
    pre: list = [L.Barrier("block"),
                 L.Comment(f"{stages}-stage ring: {', '.join(b.name for b in olds)} in "
                           f"{stages} versions; {what}")]
    crossed = 0  # barriers of the prologue after its first: the i-th keeps min(i, lag)

    def barriers(n: int) -> list:
        nonlocal crossed
        crossed += n
        return [L.Barrier("block", keep=min(i, lag)) for i in range(crossed - n + 1, crossed + 1)]

    for j in range(ahead):
        if j:
            pre.extend(barriers(inner + 1))
        pre.append(produce(E.add(loop.lo, j)))
    # as in the loop, each tile's group is committed ``inner`` barriers before a top one
    pre.extend(barriers(inner))
    if overlap:
        def fs(x: Any) -> Any:
            if isinstance(x, L.WarpMma) and x.group > 1 and x.c.lane_cols:
                return (replace(x, overlap=True),)
            return None

        consume = L.map_stmts(consume, lambda x: None, fs)
        release = (L.Barrier("block", keep=ahead - 1, mma_keep=1),) if RELEASE_AFTER else ()
        body = (L.Barrier("block", keep=ahead - 1, mma_keep=1),) + consume + release + \
            (produce(E.add(kv, ahead)),)
    else:
        body = (L.Barrier("block", keep=lag), produce(E.add(kv, ahead))) + consume
    return tuple(pre) + (replace(loop, body=body), L.Barrier("block")), news


def double_buffer(k: L.Kernel, stages: int = 2) -> L.Kernel:
    """``k`` with every qualifying loop of every phase buffered in ``stages``
    versions (outermost first; a rewritten loop is not visited again)."""
    if stages < 2:
        return k
    bufs = {b.name: b for b in k.locals}
    replaced: dict[str, L.Buffer] = {}
    phases = []
    for ph in k.phases:
        def walk(body: tuple) -> tuple:
            out: list = []
            for s in body:
                if isinstance(s, L.For) and s.kind != "thread":
                    got = plan(s, [p.body for p in k.phases], bufs)
                    if got is not None:
                        stmts, news = rewrite(s, *got, stages)
                        replaced.update(news)
                        out.extend(stmts)
                        continue
                    s = replace(s, body=walk(s.body))
                elif isinstance(s, L.If):
                    s = replace(s, then=walk(s.then), orelse=walk(s.orelse))
                out.append(s)
            return tuple(out)

        phases.append(replace(ph, body=walk(ph.body)))
    if not replaced:
        return k
    locals_ = tuple(replaced.get(b.name, b) for b in k.locals)
    return replace(k, locals=locals_, phases=tuple(phases))
