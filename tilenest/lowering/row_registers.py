"""Thread-private rows kept in registers (SIMT form; ``Schedule.row_registers``).

A shared buffer ``B`` of ``n`` rows of ``c`` elements whose every access is
made under one distribution of a row over the threads::

    for.thread t in [0, W):
      for r in [0, R):                         -- the thread's steps
        for.vector v in [0, V):
          if [V*W*r + V*t + v < c]:            -- the element is in the row
            ... B[i*c + V*W*r + V*t + v] ...   -- i: a row loop over [0, n), or no term when n = 1

is *thread-private*: element ``i*c + V*W*r + V*t + v`` is accessed by thread
``t`` alone (the map is one-to-one in ``t``, ``r``, ``v`` for ``v < V`` and a
step of ``V*W``), in whatever statement, phase order and number of passes.
Such a buffer is split in two: the first ``K = min(8, row_registers // V)``
steps of every thread are a ``local`` buffer (registers: ``n*K*V`` elements per
thread, indexed ``(i*K + r)*V + v``), the rest stays in shared memory,
``max(0, c - K*V*W)`` elements per row (indexed ``i*ov + V*W*(r - K) + V*t
+ v``). Every step loop that accesses ``B`` is split at ``K``: ``[0, K)``, a
constant trip count the CUDA emitter unrolls so that every register index is
a constant, and ``[K, R)`` over the shared part. A row of at most ``K*V*W``
elements then needs no shared memory at all, so more blocks fit a
multiprocessor, and its values are never stored and reloaded.

Only whole buffers qualify: every access of ``B`` has the form above, in one
phase, with the same ``V``, ``W``, row length and row count; ``B`` has no
layout, is no ``mma`` operand and gets no asynchronous store. The guard must
be exactly the distribution's (the row offset below ``c``): without it an
offset past the row would name an element of the next row through another
register. The split changes where values live, not which thread touches
which element, so the barrier proof of the shared part (and the emulator's
checks) apply unchanged.

A read-only global row (an input no statement of the kernel stores, read
under the same distribution, its rows ``base + i*c`` for one ``base`` of
symbols and the program id) is kept the same way, as a cache: the
textually first step loop that reads it (the *fill*: enclosed by loops
only, its one guard exactly the distribution's, the read unguarded at the
top of the guarded body) stores each of its first ``K`` steps' elements to
the ``local`` buffer as it reads them (converted to ``f32`` when every
read of a ``f16``/``bf16`` input is converted so at once: exact, and done
once), and every later read of those steps reads the register instead of
memory; the other steps keep reading global memory. The fill runs before every later read of the same element (it comes
first and nothing conditional encloses it) and the element never changes,
so each read sees the value it saw before; a thread reads the input once
instead of once per pass.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..semantics import expr as E
from . import loopir as L


#: the most steps a thread keeps in registers: the CUDA emitter unrolls a
#: thread's step loop of at most this many iterations, which keeps every
#: register index a constant
MAX_STEPS = 8


@dataclass(frozen=True)
class _Site:
    """One access of a candidate buffer: its step loop ``r`` (by variable
    name), thread ``t``, lane ``v`` (``None``: one lane, no lane loop), row variable (``None``: one row), row
    length ``c`` and the distribution's ``V``, ``W``."""

    r: str
    t: str
    v: str | None
    row: str | None
    rows: int
    c: E.Expr
    V: int
    W: int
    #: the row offset free of loops (``0`` for a shared buffer)
    off: E.Expr = E.Const(0)
    #: the step loop's first step (a loop already split: ``K``)
    lo: int = 0


def keep_rows_in_registers(k: L.Kernel, elems: int) -> L.Kernel:
    """``k`` with every qualifying shared buffer's first ``min(8, elems // V)``
    steps per thread in registers and every qualifying input row cached there
    (module doc); ``elems <= 0`` changes nothing."""
    if elems <= 0:
        return k
    stored = {st.buf.name for ph in k.phases for st in L.walk(ph.body)
              if isinstance(st, L.Store)}
    shared = [(b, _split) for b in k.locals if b.space == "shared" and b.layout is None]
    inputs = [(b, _cache) for b in k.globals
              if b.name not in stored and b.layout is None and not b.dtype.is_bool]
    for b, change in shared + inputs:
        got = _sites(k, b)
        if got is None:
            continue
        phase, sites = got
        K = min(MAX_STEPS, elems // sites[0].V)
        if K >= 1:
            k = change(k, b, phase, sites, K)
    return k


def _sites(k: L.Kernel, b: L.Buffer) -> tuple[int, list[_Site]] | None:
    """The phase holding every access of ``b`` and each access's shape, or
    None when some access is not of the module doc's form."""
    defs, data = L.index_definitions(k)
    where: set[int] = set()
    sites: list[_Site] = []
    for p, ph in enumerate(k.phases):
        for st, path in L.walk_paths(ph.body):
            for node in _accesses(st, b.name):
                if isinstance(node, L.WarpMma) or (isinstance(node, L.Store) and node.mode):
                    return None
                s = _site(node.index, path, defs, data,
                          ph.pid.name if b.space == "global" else None)
                if s is None:
                    return None
                where.add(p)
                sites.append(s)
    if len(where) != 1 or not sites:
        return None
    first = sites[0]
    for s in sites:
        if ((s.V, s.W, s.rows) != (first.V, first.W, first.rows) or not _same(s.c, first.c)
                or not _same(s.off, first.off)):
            return None
    if b.space != "global" and (not _same(b.size, E.mul(first.rows, first.c))
                                or any(s.lo for s in sites)):
        return None
    return where.pop(), sites


def _accesses(st: Any, name: str) -> list[Any]:
    """The accesses of buffer ``name`` statement ``st`` makes itself."""
    out: list[Any] = [y for x in L.stmt_exprs(st) for y in L.subexprs(x)
                      if isinstance(y, L.Load) and y.buf.name == name]
    if isinstance(st, L.Store) and st.buf.name == name:
        out.append(st)
    if isinstance(st, L.WarpMma) and name in (st.a.buf.name, st.b.buf.name, st.c.buf.name):
        out.append(st)
    return out


def _site(index: Any, path: tuple, defs: dict, data: set,
          pid: str | None = None) -> _Site | None:
    """The shape of one access at ``index`` inside the statements ``path``
    (one lane per step: no lane loop, ``V = 1``). With ``pid`` (a global
    buffer) the rows may start at an offset of symbols and that program id."""
    if not isinstance(index, L.IExpr):
        return None
    loops = [j for j, s in enumerate(path) if isinstance(s, (L.For, L.While))]
    lanes = bool(loops) and isinstance(path[loops[-1]], L.For) and path[loops[-1]].kind == "vector"
    if len(loops) < 2 + lanes:
        return None
    jt, jr = loops[-2 - lanes], loops[-1 - lanes]
    jv = loops[-1] if lanes else jr
    T, R, Vl = path[jt], path[jr], path[jv] if lanes else None
    if not (isinstance(T, L.For) and T.kind == "thread" and isinstance(T.hi, E.Const)
            and isinstance(R, L.For) and R.kind == "serial" and not R.reverse
            and isinstance(R.lo, E.Const) and R.lo.value >= 0 and jr == jt + 1
            and all(isinstance(s, L.If) for s in path[jv + 1:])):
        return None
    if Vl is not None and not (jv == jr + 1 and Vl.lo == E.Const(0)
                               and isinstance(Vl.hi, E.Const)):
        return None
    W, V = int(T.hi.value), int(Vl.hi.value) if Vl is not None else 1
    t, r = E.Var(T.var.name), E.Var(R.var.name)
    v = E.Var(Vl.var.name) if Vl is not None else E.Const(0)
    lin = E.add(E.add(E.mul(V * W, r), E.mul(V, t)), v)
    base = E.add(_resolve(index.e, defs, data), E.mul(-1, lin))
    if E.leaves(base) & E.leaves(lin):
        return None
    c = next((x for s in path[jv + 1:] for x in _row_length(s.cond, lin, defs, data)), None)
    if c is None:
        return None
    got = _row(base, c, path[:jt], pid)
    if got is None:
        return None
    return _Site(R.var.name, T.var.name, Vl.var.name if Vl is not None else None,
                 got[0], got[1], c, V, W, got[2], int(R.lo.value))


def _row_length(cond: Any, lin: E.Expr, defs: dict, data: set) -> list[E.Expr]:
    """The ``c`` of each conjunct ``lin < c`` of ``cond`` (``c`` free of the
    thread, step and lane): the distribution's test that the element is in
    the row."""
    if not isinstance(cond, L.IPred):
        return []
    ps = cond.p.items if isinstance(cond.p, E.PAnd) else (cond.p,)
    out = []
    for p in ps:
        if isinstance(p, E.Cmp) and p.op == "<":
            d = _resolve(E.add(p.a, E.mul(-1, p.b)), defs, data)
            rest = E.add(d, E.mul(-1, lin))
            if not E.leaves(rest) & E.leaves(lin):
                out.append(E.mul(-1, rest))
    return out


def _row(base: E.Expr, c: E.Expr, outer: tuple, pid: str | None = None
         ) -> tuple[str | None, int, E.Expr] | None:
    """``base`` as ``off + i*c`` for a loop ``i`` over ``[0, n)`` of ``outer``
    with a constant ``n``: ``(i, n, off)``; ``(None, 1, off)`` for ``base =
    off``; else None. ``off`` is ``0``, or with ``pid`` any expression whose
    only variable is that program id."""
    def offset(e: E.Expr) -> bool:
        if pid is None:
            return e == E.Const(0)
        return all(not isinstance(x, (E.Var, E.Val)) or x.name == pid for x in E.leaves(e))

    if offset(base):
        return None, 1, base
    for s in outer:
        if (isinstance(s, L.For) and s.kind == "serial" and s.lo == E.Const(0)
                and isinstance(s.hi, E.Const)):
            i = E.Var(s.var.name)
            off = E.add(base, E.mul(-1, E.mul(i, c)))
            if offset(off):
                return s.var.name, int(s.hi.value), off
    return None


def _resolve(e: E.Expr, defs: dict, data: set) -> E.Expr:
    """``e`` with every index local of one index definition (or of several
    equal ones: the copies of a split loop) replaced by that definition,
    repeatedly."""
    for _ in range(8):
        m: dict[E.Expr, E.Expr] = {}
        for x in E.leaves(e):
            if isinstance(x, E.Var) and x.name not in data:
                d = defs.get(x.name, [])
                if d and d[0][0] == "value" and all(y == d[0] for y in d):
                    m[x] = d[0][1]
        if not m:
            return e
        e = E.subst(e, m)
    return e


def _same(a: E.Expr, b: E.Expr) -> bool:
    return E.add(a, E.mul(-1, b)) == E.Const(0)


def _split(k: L.Kernel, b: L.Buffer, phase: int, sites: list[_Site], K: int) -> L.Kernel:
    """``k`` with ``b`` split into registers and a shared remainder (module doc)."""
    s0 = sites[0]
    c, V, W, n = s0.c, s0.V, s0.W, s0.rows
    ov = E.maximum(0, E.add(c, -K * V * W))
    reg = L.Buffer(f"{b.name}.reg", b.dtype, "local", E.Const(n * K * V))
    rest = replace(b, size=E.mul(n, ov))
    by_r = {s.r: s for s in sites}

    def index(s: _Site, registers: bool) -> L.IExpr:
        r, t = E.Var(s.r), E.Var(s.t)
        v = E.Var(s.v) if s.v is not None else E.Const(0)
        i = E.Var(s.row) if s.row is not None else E.Const(0)
        if registers:
            return L.IExpr(E.add(E.mul(E.add(E.mul(i, K), r), V), v))
        off = E.add(E.add(E.mul(V * W, E.add(r, -K)), E.mul(V, t)), v)
        return L.IExpr(E.add(E.mul(i, ov), off))

    def retarget(body: tuple, s: _Site, registers: bool) -> tuple:
        to = reg if registers else rest

        def fe(y: Any) -> Any:
            if isinstance(y, L.Load) and y.buf.name == b.name:
                return L.Load(to, index(s, registers), y.guard, y.fill)
            return None

        def fs(st: Any) -> Any:
            if isinstance(st, L.Store) and st.buf.name == b.name:
                return (replace(st, buf=to, index=index(s, registers)),)
            return None

        return L.map_stmts(body, fe, fs)

    def split(st: Any) -> Any:
        if isinstance(st, L.For) and st.var.name in by_r:
            s = by_r[st.var.name]
            return (replace(st, hi=E.Const(K), body=retarget(st.body, s, True)),
                    replace(st, lo=E.Const(K), body=retarget(st.body, s, False)))
        return None

    ph = k.phases[phase]
    body = L.map_stmts(ph.body, lambda y: None, split)
    phases = k.phases[:phase] + (replace(ph, body=body),) + k.phases[phase + 1:]
    locals_ = tuple(x for x in k.locals if x.name != b.name) + (reg, rest)
    return replace(k, phases=phases, locals=locals_)


def _cache(k: L.Kernel, b: L.Buffer, phase: int, sites: list[_Site], K: int) -> L.Kernel:
    """``k`` with the first ``K`` steps of read-only global row ``b`` cached in
    registers (module doc); ``k`` unchanged when the first read of ``b`` is
    not a fill (some enclosing statement other than a loop, a guard other
    than the distribution's, a guarded or nested read)."""
    ph = k.phases[phase]
    first = next(((st, path) for st, path in L.walk_paths(ph.body) if _accesses(st, b.name)),
                 None)
    if first is None:
        return k
    st0, path = first
    if not (len(path) > 1 and all(isinstance(s, L.For) for s in path[:-1])
            and isinstance(path[-1], L.If) and st0 in path[-1].then
            and isinstance(path[-1].cond, L.IPred) and isinstance(path[-1].cond.p, E.Cmp)
            and isinstance(st0, (L.Assign, L.Store))):
        return k
    loads = [y for y in _accesses(st0, b.name) if isinstance(y, L.Load)]
    if not loads or any(y.guard is not None for y in loads) or len(set(loads)) != 1:
        return k
    fill_load, s0 = loads[0], sites[0]
    n, V = s0.rows, s0.V
    if s0.lo or any(0 < s.lo < K for s in sites) or len({s.r for s in sites}) < 2:
        return k  # (read in one pass only: nothing to reuse)
    wide = _only_widened(ph.body, b)
    reg = L.Buffer(f"{b.name}.reg", wide or b.dtype, "local", E.Const(n * K * V))
    by_r = {s.r: s for s in sites}

    def at(s: _Site) -> L.IExpr:
        v = E.Var(s.v) if s.v is not None else E.Const(0)
        i = E.Var(s.row) if s.row is not None else E.Const(0)
        return L.IExpr(E.add(E.mul(E.add(E.mul(i, K), E.Var(s.r)), V), v))

    def cached(body: tuple, s: _Site) -> tuple:
        def fe(y: Any) -> Any:
            if isinstance(y, L.Load) and y.buf.name == b.name:
                return L.Load(reg, at(s), y.guard, y.fill)
            if (wide and isinstance(y, L.Cast) and isinstance(y.a, L.Load)
                    and y.a.buf.name == reg.name):
                return y.a  # the register holds the widened value
            return None

        return L.map_stmts(body, fe)

    value = L.Cast(fill_load, wide) if wide else fill_load

    def fill(body: tuple, s: _Site) -> tuple:
        """``body`` (the fill's registers part, reads already retargeted) with
        the store of each element before its first use in the guarded body."""
        out = []
        for t in body:
            if isinstance(t, L.For):
                t = replace(t, body=fill(t.body, s))
            elif isinstance(t, L.If):
                then = list(t.then)
                j = next((j for j, u in enumerate(then)
                          if any(isinstance(y, L.Load) and y.buf.name == reg.name
                                 for x in L.stmt_exprs(u) for y in L.subexprs(x))), None)
                if j is not None:  # (a guarded body that reads no register stays)
                    then.insert(j, L.Store(reg, at(s), value))
                    t = replace(t, then=tuple(then))
            out.append(t)
        return tuple(out)

    def split(st: Any) -> Any:
        if isinstance(st, L.For) and st.var.name in by_r and st.lo == E.Const(0):
            s = by_r[st.var.name]
            regs = cached(st.body, s)
            if st.var.name == s0.r:  # the fill: the first site's step loop
                regs = fill(regs, s)
            if isinstance(st.hi, E.Const) and st.hi.value <= K:
                return (replace(st, body=regs),)  # every step in registers
            return (replace(st, hi=E.Const(K), body=regs), replace(st, lo=E.Const(K)))
        return None

    body = L.map_stmts(ph.body, lambda y: None, split)
    phases = k.phases[:phase] + (replace(ph, body=body),) + k.phases[phase + 1:]
    return replace(k, phases=phases, locals=k.locals + (reg,))


def _only_widened(body: tuple, b: L.Buffer) -> Any:
    """The wider float type every read of ``b`` in ``body`` is converted to at
    once (an unguarded ``f16``/``bf16`` read cast to ``f32``), or None: then
    the registers may hold the converted values (exact), converted once."""
    if b.dtype.name not in ("f16", "bf16"):
        return None
    reads, widened, to = 0, 0, None
    for y in L.evaluated(body):
        if isinstance(y, L.Load) and y.buf.name == b.name:
            reads += 1
            if y.guard is not None:
                return None
        elif (isinstance(y, L.Cast) and isinstance(y.a, L.Load) and y.a.buf.name == b.name
              and y.dtype.name == "f32"):
            widened, to = widened + 1, y.dtype
    return to if reads and reads == widened else None
