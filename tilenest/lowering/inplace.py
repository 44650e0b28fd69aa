"""Elementwise results stored in place of their operand (SIMT form).

A shared buffer ``E`` whose elements are computed from the elements of
another shared buffer ``X`` at the same place::

    ... X read ...
    for ...:                                  -- one top-level statement P
        for.thread t ...:
            E[i] = f(X[i], ...)                -- every read of X in P is this one
    ... E read ..., X never again

can take ``X``'s storage: each element of ``X`` is read by the thread that
then overwrites it, in the same statement, and nothing reads ``X`` later, so
``E`` and ``X`` are one buffer (``E``'s accesses are renamed to ``X`` and
``E`` is dropped). The block keeps one row instead of two in shared memory:
the staged softmax (``stage_loads``) keeps ``x - max`` exponentiated where the
row was staged, half the shared bytes of a block, so twice the blocks fit.

Conditions (checked on the phase body, program order being the order of its
top-level statements, each executed once per program): ``X`` and ``E`` are
shared, of one dtype and one size, without a layout and no ``mma``
operand, and no other phase touches them; ``E`` is stored by exactly one
statement ``S``, a distributed statement writing each element once
(``simt.once_per_element``: an update of an element twice would read its
own result), whose value reads ``X`` only at ``S``'s index; every other
access of ``X`` is in a top-level statement before ``P`` (the one holding
``S``), every other access of ``E`` in one after it, with a block barrier
between the last earlier access of ``X`` and ``P`` (other threads' reads
of ``X`` are complete before ``P`` overwrites it), and within ``P`` neither
is touched elsewhere. The barrier
proof discharges the rewritten kernel, so a placement that let one thread
overwrite an element another still reads would be refuted, not trusted.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..semantics import expr as E
from . import loopir as L
from .fragments import squeeze
from .simt import once_per_element


def reuse_in_place(k: L.Kernel) -> L.Kernel:
    """``k`` with every buffer that qualifies merged into its operand's
    storage (module doc), one pair at a time until none is left."""
    return merge_while(k, _candidate)


def merge_while(k: L.Kernel, candidate: Any) -> L.Kernel:
    """``k`` with the pairs ``(gone, keep)`` that ``candidate(k)`` finds
    merged (:func:`merged`), one at a time, until it finds none."""
    while True:
        pair = candidate(k)
        if pair is None:
            return k
        k = merged(k, *pair)


def _candidate(k: L.Kernel) -> tuple[L.Buffer, L.Buffer] | None:
    """A pair ``(E, X)`` that may share ``X``'s storage, or None."""
    mma = {g.buf.name for ph in k.phases for t in L.walk(ph.body) if isinstance(t, L.WarpMma)
           for g in (t.a, t.b, t.c)}
    shared = {b.name: b for b in k.locals
              if b.space == "shared" and b.layout is None and b.name not in mma}
    where_all = [[touched(s) for s in ph.body] for ph in k.phases]
    for i, ph in enumerate(k.phases):
        top, where = list(ph.body), where_all[i]
        elsewhere = {n for j, w in enumerate(where_all) if j != i for d in w for n in d}
        for p, s in enumerate(top):
            for st, path in L.walk_paths((s,)):
                e = shared.get(st.buf.name) if isinstance(st, L.Store) else None
                if e is None or not once_per_element(path, st):
                    continue
                for x in _operands(st, shared):
                    if (x.name == e.name or x.dtype != e.dtype or x.size != e.size
                            or {x.name, e.name} & elsewhere):  # another phase's too
                        continue
                    if _ordered(top, where, p, st, e.name, x.name):
                        return e, x
    return None


def _operands(st: L.Store, shared: dict) -> list[L.Buffer]:
    """The shared buffers ``st``'s value reads, each only at ``st``'s index."""
    loads = [y for y in L.subexprs(st.value) if isinstance(y, L.Load)]
    out = []
    for name in dict.fromkeys(y.buf.name for y in loads if y.buf.name in shared):
        if all(y.index == st.index and y.guard is None for y in loads if y.buf.name == name):
            out.append(shared[name])
    return out


def touched(s: Any) -> dict[str, int]:
    """How many accesses (loads, stores, mma operands) of each buffer ``s``
    makes, nested statements included."""
    n: dict[str, int] = {}
    body = (s,)
    for y in L.evaluated(body):
        if isinstance(y, L.Load):
            n[y.buf.name] = n.get(y.buf.name, 0) + 1
    for t in L.walk(body):
        if isinstance(t, L.Store):
            n[t.buf.name] = n.get(t.buf.name, 0) + 1
        elif isinstance(t, L.WarpMma):
            for g in (t.a, t.b, t.c):
                n[g.buf.name] = n.get(g.buf.name, 0) + 1
    return n


def _ordered(top: list, where: list, p: int, st: L.Store, e: str, x: str) -> bool:
    """Every access of ``x`` before statement ``p`` or in ``st``'s value,
    every access of ``e`` after ``p`` or ``st`` itself."""
    reads_x = sum(1 for y in L.subexprs(st.value) if isinstance(y, L.Load) and y.buf.name == x)
    if where[p].get(e, 0) != 1 or where[p].get(x, 0) != reads_x:
        return False
    if any(where[q].get(e, 0) for q in range(p)):
        return False
    if any(where[q].get(x, 0) for q in range(p + 1, len(top))):
        return False
    # the earlier accesses of x (other threads' reads among them) are complete
    # before p overwrites it: a block barrier between the last one and p
    last = max((q for q in range(p) if where[q].get(x, 0)), default=None)
    return last is None or any(L.is_block_barrier(top[q]) for q in range(last + 1, p))


def merged(k: L.Kernel, gone: L.Buffer, keep: L.Buffer) -> L.Kernel:
    """``k`` with buffer ``gone`` renamed to ``keep`` everywhere and dropped;
    ``keep`` also replaces ``k``'s buffer of its name (it may be that buffer
    resized)."""
    phases = tuple(replace(ph, body=renamed(renamed(ph.body, gone, keep), keep, keep))
                   for ph in k.phases)
    return replace(k, phases=phases, locals=tuple(keep if b.name == keep.name else b
                                                  for b in k.locals if b.name != gone.name))


# ---------------------------------------------------------------------------
# copies back (the SIMT form's sequential input)


def absorb_copies_back(bodies: list[tuple], nest: Any) -> tuple[list[tuple], set[str]]:
    """Phase ``bodies`` (sequential, before distribution; ``nest`` is
    ``simt._nest``) with each temporary tile that is computed from a tile
    ``X`` element by element, updated, and then copied back into ``X``
    computed in ``X`` itself::

        E[i] = f(X[i], ..)          -- a nest writing every element of E once
        ... (no access to X) ...    -- E updated: an mma accumulating into it
        X[i] = E[i]                 -- a nest copying every element back

    becomes ``X[i] = f(X[i], ..); ... (on X)`` and the copy is gone. This is
    the loop-carried update ``acc = mma(p, v, acc * alpha)`` of an online
    softmax: the rescaled accumulator and the product's result are one tile
    (one set of registers once the tile is a lane fragment, not two). It is
    exact: ``f`` reads ``X`` only at the element it writes; nothing reads
    ``X``'s old value after the first nest; both nests cover the whole tile
    (their stores are row-major over their extents, whose product is the
    tile's size); and ``E`` is touched nowhere else, so its value after the
    copy is never needed. One pair at a time until none is left; returns the
    bodies and the names of the temporaries gone."""
    bodies = list(bodies)
    gone: set[str] = set()
    while True:
        counts = [_touched_all(b) for b in bodies]
        for n, body in enumerate(bodies):
            others = {name for m, c in enumerate(counts) if m != n for name in c}
            new = _absorb(body, nest, counts[n], others)
            if new is not None:
                bodies[n] = new
                gone |= set(counts[n]) - set(_touched_all(new))
                break
        else:
            return bodies, gone


def _touched_all(body: tuple) -> dict[str, int]:
    n: dict[str, int] = {}
    for s in body:
        for k, v in touched(s).items():
            n[k] = n.get(k, 0) + v
    return n


def _absorb(body: tuple, nest: Any, phase: dict[str, int], others: set) -> tuple | None:
    """``body`` with one pair absorbed (its statement lists searched
    recursively), or None."""
    top = list(body)
    for p, s in enumerate(top):
        first = _whole_store(s, nest)
        if first is None:
            continue
        e, st, ext = first
        xs = _operands(st, {y.buf.name: y.buf for y in L.subexprs(st.value)
                            if isinstance(y, L.Load)})
        for x in xs:
            if (x.name == e.name or x.dtype != e.dtype or x.size != e.size
                    or x.space != e.space or {x.name, e.name} & others):
                continue
            for q in range(p + 1, len(top)):
                between = _touched_all(tuple(top[p + 1:q]))
                if between.get(x.name):
                    break
                back = _whole_store(top[q], nest)
                if back is None or back[0].name != x.name or back[2] != ext:
                    continue
                value = back[1].value
                if not (isinstance(value, L.Load) and value.buf.name == e.name
                        and value.index == back[1].index and value.guard is None):
                    continue
                span = _touched_all(tuple(top[p:q + 1]))
                if span.get(e.name) != phase.get(e.name):
                    break  # the temporary is read or written elsewhere
                return tuple(top[:p]) + renamed(tuple(top[p:q]), e, x) + tuple(top[q + 1:])
    for p, s in enumerate(top):  # nested statement lists
        if isinstance(s, L.For) and s.kind != "vector":
            inner = _absorb(s.body, nest, phase, others)
            if inner is not None:
                return tuple(top[:p]) + (replace(s, body=inner),) + tuple(top[p + 1:])
        elif isinstance(s, L.If):
            for part in ("then", "orelse"):
                inner = _absorb(getattr(s, part), nest, phase, others)
                if inner is not None:
                    return tuple(top[:p]) + (replace(s, **{part: inner}),) + tuple(top[p + 1:])
    return None


def _whole_store(s: Any, nest: Any) -> tuple[L.Buffer, L.Store, list[int]] | None:
    """``(buffer, store, extents)`` when ``s`` is a ``vector`` nest whose body
    is one unguarded store writing every element of the buffer once:
    row-major over the nest's constant extents (loops of extent 1 aside),
    whose product is the buffer's size."""
    if not (isinstance(s, L.For) and s.kind == "vector" and not s.reverse):
        return None
    loops, inner = nest(s)
    kept, units = squeeze(loops)
    if len(inner) != 1 or not isinstance(inner[0], L.Store) or inner[0].guard is not None:
        return None
    st = inner[0]
    if not (isinstance(st.index, L.IExpr) and isinstance(st.buf.size, E.Const)
            and all(isinstance(lp.lo, E.Const) and lp.lo.value == 0
                    and isinstance(lp.hi, E.Const) for lp in kept)):
        return None
    ext = [lp.hi.value for lp in kept]
    size = 1
    for x in ext:
        size *= x
    idx = E.subst(st.index.e, units)
    stride, want = 1, E.Const(0)
    for lp, x in reversed(list(zip(kept, ext))):
        want = E.add(want, E.mul(stride, E.Var(lp.var.name)))
        stride *= x
    if size != st.buf.size.value or E.add(idx, E.mul(-1, want)) != E.Const(0):
        return None
    return st.buf, st, ext


def renamed(stmts: tuple, e: L.Buffer, x: L.Buffer) -> tuple:
    """``stmts`` with every access of ``e`` made to ``x`` instead."""
    def fe(y: Any) -> Any:
        if isinstance(y, L.Load) and y.buf.name == e.name:
            return L.Load(x, y.index, y.guard, y.fill)
        return None

    def fs(st: Any) -> Any:
        if isinstance(st, L.Store) and st.buf.name == e.name:
            return (replace(st, buf=x),)
        if isinstance(st, L.WarpMma):
            fr = {f: replace(getattr(st, f), buf=x) for f in ("a", "b", "c")
                  if getattr(st, f).buf.name == e.name}
            return (replace(st, **fr),) if fr else None
        if isinstance(st, L.For) and st.bulk is not None and st.bulk.dst.name == e.name:
            return (replace(st, bulk=replace(st.bulk, dst=x)),)
        return None

    return L.map_stmts(stmts, fe, fs)
