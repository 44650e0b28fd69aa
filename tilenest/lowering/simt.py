"""SIMT form: one program executed cooperatively by the threads of a block.

:func:`simt_kernel` rewrites a lowered kernel (every program sequential) so
that each program is run by ``W`` threads (``loopir.py``, "Threads"). The
program's own code stays *uniform* (program-level: a backend may run it
redundantly on every thread, its stores done by one); the work of loops whose
iterations are independent is handed to thread loops:

* an **elementwise** ``vector`` loop nest (perfect nests of ``vector`` loops
  whose bounds do not depend on each other are linearized first) becomes
  ``for.thread t in [0, W): for r in [0, cdiv(n, W V)): for.vector v in [0,
  V): l = (r W + t) V + v; if l < n: body(l)``: the task map
  ``repeat(cdiv(n, W V)) * spatial(W) * repeat(V)`` (``proofs/taskmap.py``),
  each thread taking ``V`` consecutive elements (the schedule's
  ``vector_lanes``, halved for a loop of constant extent below ``W V``) per step and consecutive threads consecutive groups, so
  the accesses of a warp coalesce; its exact coverage of ``[0, n)`` is an
  obligation the backend discharges;
* a **reduction** ``vector`` loop -- every state it carries is updated by one
  merge marked ``reassoc`` (``s = op(s, c)`` or ``op(c, s)``; only tree
  policies get that mark, strict folds never) -- is distributed the same way
  into per-thread partials that start at the merge's identity, combined
  across the 32 lanes of each warp by ``LaneReduce`` (the butterfly), across
  warps through a ``shared`` scratch of ``W/32`` values read back in warp
  order, and merged into the state: ``s = op(s, total)``. This regroups the
  reduction, which is what the ``reassoc`` mark permits.

* a ``serial`` loop marked with a :class:`~tilenest.lowering.loopir.TreeFold`
  (a tree-policy reduction under a custom contract, ``reductions.py``) runs
  as the fixed :class:`~tilenest.semantics.trees.BlockTree` of
  ``simt_trees.py``: per-thread partial states over each thread's
  iterations, merged across lanes by shuffles of every component and across
  warps through ``shared`` scratch, with the contract's own merge.

Everything else -- strict folds, ``serial`` loops, ``while`` loops, scalar
code -- stays uniform, with the thread loops inside it; the program's buffers
become ``shared`` (one copy per program, seen by all its threads).

**Barriers.** Between two program-level steps (a uniform statement or a
thread loop) a block barrier is placed exactly when the later step accesses a
``shared`` or ``global`` buffer that the earlier one wrote, or writes one that
it read, unless both accesses are uniform stores (one thread). The analysis
runs loop bodies twice so that a conflict between the end of one iteration
and the start of the next gets a barrier too. The placement is checked, not
trusted: the barrier-sufficiency obligation (``proofs/barriers.py``) proves
that no two threads make conflicting accesses between barriers.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any

from ..semantics import dtypes as D
from ..semantics import expr as E
from ..errors import NotAvailableError, UsageError
from ..targets import SIMT_LANES, SIMT_MAX_THREADS
from ..proofs import taskmap as TM
from . import fragments
from .fusion import fuse_row_nests
from . import loopir as L
from . import simt_trees as trees

#: lanes of a warp (the SIMT rows of tilenest.targets share this width)
WARP = SIMT_LANES
_ids = itertools.count()

#: the identity of each merge a thread's partial starts from
IDENTITY = {"add": -0.0, "mul": 1.0, "maximum": float("-inf"), "minimum": float("inf")}


def _fresh(stem: str, dt: D.DType) -> L.LVar:
    return L.LVar(f"{stem}.t{next(_ids)}", dt)


# ---------------------------------------------------------------------------
# access summaries (for barrier placement)


@dataclass
class Accesses:
    """Buffers a step reads and writes, and whether its writes are by one
    thread (a uniform store) or by many (a thread loop)."""

    reads: set[str] = field(default_factory=set)
    writes_one: set[str] = field(default_factory=set)
    writes_many: set[str] = field(default_factory=set)

    def merge(self, o: "Accesses") -> "Accesses":
        return Accesses(self.reads | o.reads, self.writes_one | o.writes_one,
                        self.writes_many | o.writes_many)

    def conflicts(self, later: "Accesses") -> bool:
        """Whether ``later`` must wait for ``self`` (a barrier between them)."""
        wr = self.writes_one | self.writes_many
        lw = later.writes_one | later.writes_many
        if later.reads & wr or lw & self.reads:
            return True
        # write-write: only two single-thread writes are ordered without a barrier
        return bool(lw & self.writes_many or later.writes_many & wr)


def _shared_or_global(b: L.Buffer) -> bool:
    return b.space in ("shared", "global")


def accesses(body: tuple, many: bool) -> Accesses:
    """The accesses of ``body``; its writes are by many threads when ``many``."""
    a = Accesses()
    for s in L.walk(body):
        inner = many or (isinstance(s, L.For) and s.kind == "thread")
        for x in L.stmt_exprs(s):
            for y in L.subexprs(x):
                if isinstance(y, L.Load) and _shared_or_global(y.buf):
                    a.reads.add(y.buf.name)
        if isinstance(s, L.Store) and _shared_or_global(s.buf):
            (a.writes_many if inner else a.writes_one).add(s.buf.name)
        if isinstance(s, L.WarpMma):
            a.reads.update(f.buf.name for f in (s.a, s.b, s.c) if _shared_or_global(f.buf))
            if _shared_or_global(s.c.buf):
                a.writes_many.add(s.c.buf.name)
    # a store nested in a thread loop of ``body`` is by many threads
    for s in L.walk(body):
        if isinstance(s, L.For) and s.kind == "thread":
            for st in L.walk(s.body):
                if isinstance(st, L.Store) and _shared_or_global(st.buf):
                    a.writes_one.discard(st.buf.name)
                    a.writes_many.add(st.buf.name)
    return a


# ---------------------------------------------------------------------------
# recognizing distributable loops


def _nest(s: L.For) -> tuple[list[L.For], tuple]:
    """A perfect nest of ``vector`` loops starting at ``s`` whose bounds do not
    read the nest's own variables: the loops and the innermost body."""
    loops = [s]
    body = s.body
    while (len(body) == 1 and isinstance(body[0], L.For) and body[0].kind == "vector"
           and not body[0].reverse
           and not ({lp.var.name for lp in loops} & (L.names(L.IExpr(body[0].lo))
                                                      | L.names(L.IExpr(body[0].hi))))):
        loops.append(body[0])
        body = body[0].body
    return loops, body


def _merge_of(s: L.Stmt, acc: str) -> tuple[str, L.Expr, D.DType, frozenset] | None:
    """``(op, contribution, dtype, flags)`` when ``s`` is ``acc = op{reassoc}(acc, c)``
    or ``op{reassoc}(c, acc)`` with ``c`` not reading ``acc``."""
    if not (isinstance(s, L.Assign) and s.var.name == acc and isinstance(s.value, L.Bin)):
        return None
    b = s.value
    if "reassoc" not in b.flags or b.op not in IDENTITY:
        return None
    for mine, c in ((b.a, b.b), (b.b, b.a)):
        if isinstance(mine, L.Ref) and mine.var.name == acc and acc not in L.names(c):
            return b.op, c, b.dtype, b.flags
    return None


def _carried(body: tuple, before: set[str]) -> list[str]:
    """Locals the loop body assigns that live across iterations: those
    defined before the loop (the others are temporaries of one iteration)."""
    return sorted(n for n in L.assigned(body) if n in before)


# ---------------------------------------------------------------------------
# the rewrite


class _Phase:
    """SIMT rewrite of one phase body with ``W`` threads."""

    def __init__(self, W: int, scratch: list[L.Buffer], lanes: int = 1,
                 maps: list | None = None, frags: dict | None = None,
                 rows: dict | None = None):
        self.W = W
        self.lanes = lanes
        self.scratch = scratch
        #: accumulator tiles kept in the lanes' registers (``fragments.py``)
        self.frags: dict = frags or {}
        #: row vectors kept in the registers of the lanes owning their rows
        #: in those tiles (``fragments.plan_rows``)
        self.rows: dict = rows or {}
        #: the task map of every distributed loop, with the extent it covers
        self.maps: list = [] if maps is None else maps
        self.red: dict[str, L.Buffer] = {}

    # -- barrier tracking ---------------------------------------------------

    def place(self, steps: list[tuple[tuple, Accesses]], pending: Accesses
              ) -> tuple[list, Accesses]:
        """Statements of ``steps`` with barriers where a step conflicts with what
        ran since the last barrier; returns them and the accesses pending at the end."""
        out: list = []
        for stmts, acc in steps:
            if pending.conflicts(acc):
                out.append(L.Barrier("block"))
                pending = Accesses()
            out.extend(stmts)
            pending = pending.merge(acc)
        return out, pending

    # -- statements ---------------------------------------------------------

    def body(self, body: tuple, defined: set[str], pending: Accesses) -> tuple[tuple, Accesses]:
        """Rewrite a uniform statement list; ``defined``: locals defined before it."""
        steps: list = []
        defined = set(defined)
        for s in body:
            for stmts, acc in self.stmt(s, defined):
                steps.append((stmts, acc))
            defined |= set(L.assigned((s,)))
        out, pending = self.place(steps, pending)
        return tuple(out), pending

    def stmt(self, s: L.Stmt, defined: set[str]) -> list[tuple[tuple, Any]]:
        """One uniform statement as program-level steps ``(stmts, accesses)``;
        compound statements are rewritten with their own barrier placement and
        count as one step whose accesses are those at their boundary."""
        if isinstance(s, L.For) and s.tree is not None and not s.reverse:
            got = trees.distribute_tree(self, s, defined)
            if got is not None:
                return got
        if isinstance(s, L.For) and s.kind == "vector" and not s.reverse:
            got = self.distribute(s, defined)
            if got is not None:
                return got
        if isinstance(s, L.For) and s.kind in ("serial", "vector"):
            inner = defined | {s.var.name}
            return [self.loop(s, lambda body, p: self.body(body, inner, p),
                              lambda b: replace(s, body=b, kind="serial"))]
        if isinstance(s, L.While):
            def rebuild_w(parts: tuple) -> L.While:
                n = len(s.pre)
                return L.While(parts[:n], s.cond, parts[n:])

            return [self.loop(s, lambda body, p: self.body(body, defined, p), rebuild_w,
                              parts=s.pre + s.body)]
        if isinstance(s, L.If):
            then, _ = self.body(s.then, defined, Accesses())
            orelse, _ = self.body(s.orelse, defined, Accesses())
            new = L.If(s.cond, then, orelse)
            return [((new,), accesses((new,), False))]
        if isinstance(s, L.Barrier):
            return []
        return [((s,), accesses((s,), False))]

    def loop(self, s: Any, rewrite: Any, rebuild: Any, parts: tuple | None = None
             ) -> tuple[tuple, Accesses]:
        """A uniform loop: its body rewritten so that the conflicts of one
        iteration with the next are separated too (two passes: the second
        starts from the accesses the first left pending)."""
        body = parts if parts is not None else s.body
        once = (isinstance(s, L.For) and isinstance(s.lo, E.Const) and isinstance(s.hi, E.Const)
                and s.hi.value - s.lo.value <= 1)
        _, end = rewrite(body, Accesses())
        new_body, _ = rewrite(body, Accesses() if once else end)
        new = rebuild(new_body)
        # its boundary accesses: everything it does (conservative)
        return (new,), accesses((new,), False)

    # -- distribution -------------------------------------------------------

    def distribute(self, s: L.For, defined: set[str]) -> list | None:
        loops, inner = _nest(s)
        carried = _carried(inner, defined)
        merges = []
        for name in carried:
            ups = [t for t in inner if isinstance(t, L.Assign) and t.var.name == name]
            nested = [t for t in L.walk(inner) if isinstance(t, L.Assign)
                      and t.var.name == name and t not in ups]
            m = _merge_of(ups[0], name) if len(ups) == 1 and not nested else None
            if m is None:
                return None
            merges.append((name, ups[0].var, m))
        if any(isinstance(t, L.For) and t.kind == "thread" for t in L.walk(inner)):
            return None
        if any(isinstance(t, L.WarpMma) for t in L.walk(inner)):
            return None if merges else self.distribute_warps(loops, inner)
        tiles = fragments.tiles_in(inner, self.frags)
        if not tiles and fragments.tiles_in(inner, self.rows):
            return self.distribute_rows(loops, inner)
        if tiles:  # an elementwise nest or a row fold over register tiles: their layout
            ft = tiles[0]
            fold = fragments.row_fold(loops, inner, {x.buf.name for x in tiles},
                                      ft.tm * ft.wm, ft.cols)
            if fold is not None:
                return self.distribute_row_fold(tiles, fold, defined)
            return self.distribute_cells(tiles, loops, inner)
        t = _fresh("t", D.i64)
        r = _fresh("r", D.i64)
        tv, rv = E.Var(t.name), E.Var(r.name)
        sizes = [E.add(lp.hi, E.mul(-1, lp.lo)) for lp in loops]
        n = _product(sizes)
        V = self.lanes
        if isinstance(n, E.Const):  # a short loop keeps every thread busy instead
            while V > 1 and n.value < self.W * V:
                V //= 2
        self.maps.append((self.W, V, n))
        lane = _fresh("v", D.i64) if V > 1 else None
        lin = E.add(E.mul(E.add(E.mul(rv, self.W), tv), V), E.Var(lane.name) if lane else 0)
        # the nest's variables from the linear index: row-major over the nest
        assigns = []
        rest = lin
        # a thread's V consecutive elements stay in one innermost row when V
        # divides its extent: split the group's first element, add the lane
        # (the innermost index is then linear in the lane: wide accesses)
        whole = (lane is not None and len(loops) > 1 and isinstance(sizes[-1], E.Const)
                 and sizes[-1].value % V == 0)
        first = E.mul(E.add(E.mul(rv, self.W), tv), V)
        for k in range(len(loops) - 1, -1, -1):
            lp = loops[k]
            if k == 0:
                val = rest
            elif whole and k == len(loops) - 1:
                val = E.add(E.mod(first, sizes[k]), E.Var(lane.name))
                rest = E.floordiv(first, sizes[k])
            else:
                val = E.mod(rest, sizes[k])
                rest = E.floordiv(rest, sizes[k])
            assigns.append(L.Assign(lp.var, L.IExpr(E.add(lp.lo, val))))
        assigns.reverse()
        # partial accumulators
        part: dict[str, L.LVar] = {}
        init = []
        for name, _var, (op, _c, dt, _fl) in merges:
            p = _fresh(f"part_{name.split('.')[0]}", dt)
            part[name] = p
            init.append(L.Assign(p, L.Const(_identity(op, dt), dt)))
        ren = {name: p for name, p in part.items()}

        def fe(x: Any) -> Any:
            if isinstance(x, L.Ref) and x.var.name in ren:
                return L.Ref(ren[x.var.name])
            return None

        def fs(st: Any) -> Any:
            if isinstance(st, L.Assign) and st.var.name in ren:
                return (L.Assign(ren[st.var.name], st.value),)
            return None

        work = L.map_stmts(inner, fe, fs)
        step: tuple = (L.If(L.IPred(E.cmp("<", lin, n)), tuple(assigns) + work),)
        if lane is not None:  # the V elements of one step, independent: a vector loop
            step = (L.For(lane, E.Const(0), E.Const(V), step, "vector"),)
        tl_body = tuple(init) + (L.For(r, E.Const(0), E.cdiv(n, self.W * V), step, "serial"),)
        steps: list = []
        if not merges:  # a bulk copy's permission stays with its loop
            loop = L.For(t, E.Const(0), E.Const(self.W), tl_body, "thread", scope="block",
                         bulk=s.bulk)
            return [((loop,), accesses((loop,), True))]
        # combine: lanes, then warps through shared scratch, then the state
        tail = []
        warp_vals = []
        for name, var, (op, _c, dt, fl) in merges:
            w = _fresh(f"warp_{name.split('.')[0]}", dt)
            tail.append(L.LaneReduce(w, op, L.Ref(part[name]), WARP, L.FULL_MASK, fl))
            buf = self.scratch_for(dt, len(warp_vals))
            warp_vals.append((name, var, op, dt, fl, buf))
            tail.append(L.If(L.IPred(E.cmp("==", E.mod(tv, WARP), 0)),
                             (L.Store(buf, L.IExpr(E.floordiv(tv, WARP)), L.Ref(w)),)))
        loop = L.For(t, E.Const(0), E.Const(self.W), tl_body + tuple(tail), "thread",
                     scope="block")
        steps.append(((loop,), accesses((loop,), True)))
        nw = self.W // WARP
        for name, var, op, dt, fl, buf in warp_vals:
            tot = _fresh(f"tot_{name.split('.')[0]}", dt)
            fold: list = [L.Assign(tot, L.Load(buf, L.IExpr(E.Const(0))))]
            for j in range(1, nw):
                fold.append(L.Assign(tot, L.Bin(op, L.Ref(tot), L.Load(buf, L.IExpr(E.Const(j))),
                                                dt, fl)))
            fold.append(L.Assign(var, L.Bin(op, L.Ref(var), L.Ref(tot), dt, fl)))
            steps.append((tuple(fold), accesses(tuple(fold), False)))
        return steps

    def warp_step(self, n: E.Expr, group: int = 1) -> tuple[L.LVar, L.LVar, E.Expr]:
        """Thread ``t``, step ``r`` and the task ``r * NG + t // (32 group)``
        of a loop of ``n`` tasks over the ``NG = W / (32 group)`` groups of
        ``group`` warps (warps, or warpgroups for ``group = 4``; task map
        ``repeat(cdiv(n, NG)) * spatial(NG)``, recorded)."""
        t, r = _fresh("t", D.i64), _fresh("r", D.i64)
        size = WARP * group
        ng = self.W // size
        self.maps.append((ng, 1, n))
        return t, r, E.add(E.mul(E.Var(r.name), ng), E.floordiv(E.Var(t.name), size))

    def warp_loop(self, t: L.LVar, r: L.LVar, n: E.Expr, lin: E.Expr, work: tuple,
                  group: int = 1) -> list:
        """The thread loop running ``work`` for task ``lin < n`` at each step
        ``r`` (tasks of ``group`` warps each)."""
        step = (L.If(L.IPred(E.cmp("<", lin, n)), work),)
        body = (L.For(r, E.Const(0), E.cdiv(n, self.W // (WARP * group)), step, "serial"),)
        loop = L.For(t, E.Const(0), E.Const(self.W), body, "thread", scope="block")
        return [((loop,), accesses((loop,), True))]

    def distribute_warps(self, loops: list[L.For], inner: tuple) -> list:
        """A ``vector`` nest whose iterations are tensor-core collectives
        (``WarpMma`` tiles of ``group`` warps): iteration ``r * NG + g`` runs
        on group ``g`` (``NG = W / (32 group)`` groups, step ``r``), all its
        threads together, each passing its lane id within the group; the
        task map ``repeat(cdiv(n, NG)) * spatial(NG)`` over the groups. An
        accumulator kept in registers (``fragments.py``) becomes the lane
        fragment of the thread's step ``r``."""
        groups = {st.group for st in L.walk(inner) if isinstance(st, L.WarpMma)}
        if len(groups) != 1:
            raise NotAvailableError("one nest of tensor-core tiles mixes warp and warpgroup "
                                    "instructions", hint="use one mma_unit per kernel")
        group = groups.pop()
        sizes = [E.add(lp.hi, E.mul(-1, lp.lo)) for lp in loops]
        n = _product(sizes)
        t, r, lin = self.warp_step(n, group)
        assigns = [L.Assign(lp.var, L.IExpr(E.add(lp.lo, v)))
                   for lp, v in zip(loops, _unflatten(lin, sizes))]
        lane = E.mod(E.Var(t.name), WARP * group)

        def fs(st: Any) -> Any:
            if not isinstance(st, L.WarpMma):
                return None
            ft = self.frags.get(st.c.buf.name)
            c = st.c if ft is None else fragments.lane_frag(ft, E.Var(r.name))
            fa = self.frags.get(st.a.buf.name)  # a first operand in registers
            a = st.a if fa is None else fragments.lane_frag(fa, E.Var(r.name))
            return (replace(st, lane=lane, a=a, c=c),)

        work = L.map_stmts(inner, lambda x: None, fs)
        return self.warp_loop(t, r, n, lin, tuple(assigns) + work, group)

    def distribute_cells(self, tiles: list, loops: list[L.For], inner: tuple) -> list:
        """An elementwise nest over register tile ``ft`` (``fragments.py``) in
        the tile's fragment layout: task ``(wi, wj)`` of step ``r`` as in
        :meth:`distribute_warps`, and in it each element its lane owns --
        ``(wi wm, wj wn) + loopir.lane_cell(lane, p, q, h, e)`` -- with the
        accesses of each of ``tiles`` (one layout) moved to that element's
        cell of the thread's fragment buffer. Loops of extent 1 in the nest
        keep their one value."""
        c = _CellTask.of(self, tiles)
        ft, cv = c.ft, c.cv
        i = E.add(E.mul(c.wi, ft.wm), c.i0)
        j = E.add(E.mul(c.wj, ft.wn), c.j0)

        def fs(st: Any) -> Any:
            if isinstance(st, L.Store) and st.buf.name in c.local:
                return (L.Store(c.local[st.buf.name], c.cell, st.value, st.guard, st.mode),)
            return None

        (li, lj), units = fragments.squeeze(loops)
        work = tuple(L.Assign(lp.var, L.IExpr(lp.lo)) for lp in loops
                     if E.Var(lp.var.name) in units)
        work += (L.Assign(li.var, L.IExpr(i)), L.Assign(lj.var, L.IExpr(j))) + \
            L.map_stmts(inner, c.fe, fs)
        exts = (ft.wm // (16 * ft.group), ft.wn // 8, 2, 2)
        for v, ext in reversed(list(zip(cv, exts))):
            work = (L.For(v, E.Const(0), E.Const(ext), work, "vector"),)
        return self.warp_loop(c.t, c.r, c.n, c.lin, work, ft.group)

    def distribute_row_fold(self, tiles: list, rf: Any, defined: set[str]) -> list:
        """A row reduction over register tiles (``fragments.RowFold``), in
        their layout: the warp (or warpgroup, whose tiles then span whole
        rows, each row within one warp) of task ``(wi, wj)`` folds its ``wm x
        wn`` tile; each lane, for each row it owns, merges its cells of that row
        (columns in ascending order) into a partial starting at the merge's
        identity, and the four lanes sharing the row (a quad of the
        ``mma.m16n8k16`` layout) combine theirs by ``LaneReduce``. With one
        warp tile per row of tiles (``tn = 1``) lane ``4 g`` of each quad then
        runs the row's own statements with ``acc = op(acc, total)``; else it
        writes the total to a ``shared`` scratch of ``tn`` partials per row,
        and a second nest over the rows (distributed as any other) folds
        them in warp-column order into the accumulator. The regrouping is
        what the merges' ``reassoc`` mark permits."""
        c = _CellTask.of(self, tiles)
        ft, cv, wj, lane, fe = c.ft, c.cv, c.wj, c.lane, c.fe
        rows = ft.tm * ft.wm
        row = E.add(E.mul(c.wi, ft.wm), c.i0)

        units = tuple(L.Assign(lp.var, L.IExpr(lp.lo)) for lp in rf.units)
        at_row = units + (L.Assign(rf.row.var, L.IExpr(row)),)
        parts = [_fresh(f"part_{v.name.split('.')[0]}", dt) for v, _o, _c, dt, _f in rf.merges]
        totals = [_fresh(f"quad_{v.name.split('.')[0]}", dt) for v, _o, _c, dt, _f in rf.merges]
        col = (L.Assign(rf.fold.var, L.IExpr(E.add(E.mul(wj, ft.wn), c.j0))),)
        updates = tuple(L.Assign(pv, L.Bin(op, L.Ref(pv), L.map_expr(c, fe), dt, fl))
                        for pv, (_v, op, c, dt, fl) in zip(parts, rf.merges))
        cells: tuple = (L.For(cv[3], E.Const(0), E.Const(2), col + updates, "serial"),)
        cells = (L.For(cv[1], E.Const(0), E.Const(ft.wn // 8), cells, "serial"),)
        per_row = at_row + tuple(L.Assign(pv, L.Const(_identity(op, dt), dt))
                                 for pv, (_v, op, _c, dt, _f) in zip(parts, rf.merges))
        per_row += L.map_stmts(rf.pre, fe) + cells
        per_row += tuple(L.LaneReduce(tv, op, L.Ref(pv), 4, L.FULL_MASK, fl)
                         for tv, pv, (_v, op, _c, _dt, fl) in zip(totals, parts, rf.merges))
        second: list = []
        if ft.tn == 1:
            last = rf.pre + tuple(L.Assign(v, L.Bin(op, L.Ref(v), L.Ref(tv), dt, fl))
                                  for tv, (v, op, _c, dt, fl) in zip(totals, rf.merges)) + \
                L.map_stmts(rf.post, fe, c.fs)
        else:
            bufs = [self.row_partials(v, dt, ft.tn * rows) for v, _o, _c, dt, _f in rf.merges]
            slot = L.IExpr(E.add(E.mul(wj, rows), row))
            last = tuple(L.Store(b, slot, L.Ref(tv)) for b, tv in zip(bufs, totals))
            j = _fresh("wj", D.i64)
            folds = tuple(L.Assign(v, L.Bin(op, L.Ref(v), L.Load(b, L.IExpr(E.add(
                E.mul(E.Var(j.name), rows), E.Var(rf.row.var.name)))), dt, fl))
                for b, (v, op, _c, dt, fl) in zip(bufs, rf.merges))
            body = units + rf.pre + (L.For(j, E.Const(0), E.Const(ft.tn), folds, "serial"),) \
                + rf.post
            nest = L.For(rf.row.var, E.Const(0), E.Const(rows), body, "vector")
            second = self.distribute(nest, defined) or []
            if not second:
                raise NotAvailableError("a row fold's partials could not be combined")
        if all(st.buf.space == "local" for st in L.walk(last) if isinstance(st, L.Store)):
            # only registers of the thread (row vectors kept by the quad):
            # every lane of the quad runs it on the quad's combined value
            per_row += last
        else:
            per_row += (L.If(L.IPred(E.cmp("==", E.mod(lane, 4), 0)), last),)
        work: tuple = (L.For(cv[2], E.Const(0), E.Const(2), per_row, "serial"),)
        work = (L.For(cv[0], E.Const(0), E.Const(ft.wm // (16 * ft.group)), work, "serial"),)
        return self.warp_loop(c.t, c.r, c.n, c.lin, work, ft.group) + second

    def distribute_rows(self, loops: list[L.For], inner: tuple) -> list:
        """A nest over the rows alone whose row vectors are kept in registers
        (``fragments.plan_rows``): every lane runs it for each row it holds
        -- row ``wi wm + i`` of tile ``wi`` at step ``r``, ``i`` the row of
        its cells ``(p, h)`` (``loopir.lane_cell``; ``16 p + 8 h + lane //
        4`` in a warp's tile) -- with the vectors' accesses at that row's
        slot. The four lanes of a quad compute the same values into their
        own copies."""
        rr = fragments.tiles_in(inner, self.rows)[0]
        n = E.Const(rr.tm)
        t, r, lin = self.warp_step(n, rr.group)
        lane = E.mod(E.Var(t.name), WARP * rr.group)
        p, h = _fresh("p", D.i64), _fresh("h", D.i64)
        pv, hv = E.Var(p.name), E.Var(h.name)
        i, _ = L.lane_cell(lane, pv, E.Const(0), hv, E.Const(0), rr.group)
        row = E.add(E.mul(lin, rr.wm), i)
        (kept,), units = fragments.squeeze(loops)
        fe, fs = _row_mappers(self.rows, E.Var(r.name), pv, hv)
        work = tuple(L.Assign(lp.var, L.IExpr(lp.lo)) for lp in loops
                     if E.Var(lp.var.name) in units)
        work += (L.Assign(kept.var, L.IExpr(row)),) + L.map_stmts(inner, fe, fs)
        work = (L.For(h, E.Const(0), E.Const(2), work, "vector"),)
        work = (L.For(p, E.Const(0), E.Const(rr.wm // (16 * rr.group)), work, "vector"),)
        return self.warp_loop(t, r, n, lin, work, rr.group)

    def row_partials(self, acc: L.LVar, dt: D.DType, size: int) -> L.Buffer:
        """The shared scratch of a row fold's partials of accumulator ``acc``
        (one buffer per accumulator however often its nest is distributed)."""
        key = f"rowpart.{acc.name}"
        if key not in self.red:
            b = L.Buffer(f"rowpart_{acc.name.split('.')[0]}.t{next(_ids)}", dt, "shared",
                         E.Const(size))
            self.red[key] = b
            self.scratch.append(b)
        return self.red[key]

    def scratch_for(self, dt: D.DType, k: int) -> L.Buffer:
        """The shared scratch of ``W/32`` values of ``dt`` (slot ``k`` of the
        states one loop combines at once)."""
        key = f"{dt.name}.{k}"
        if key not in self.red:
            b = L.Buffer(f"red_{dt.name}_{k}.t{next(_ids)}", dt, "shared",
                         E.Const(self.W // WARP))
            self.red[key] = b
            self.scratch.append(b)
        return self.red[key]


@dataclass
class _CellTask:
    """The warp task and a lane's cell in register tiles of one layout
    (``fragments.FragTile``): thread ``t`` at step ``r`` runs task ``lin <
    n``, the warp tile ``(wi, wj)``; ``cv`` are the loop variables ``(p, q,
    h, e)`` of its cells, element ``(wi wm + i0, wj wn + j0)`` at ``cell`` of
    the thread's fragment buffer (``local``, by tile name); ``fe`` moves a
    load of a tile to that cell."""

    ft: Any
    n: E.Expr
    t: L.LVar
    r: L.LVar
    lin: E.Expr
    wi: E.Expr
    wj: E.Expr
    lane: E.Expr
    cv: list
    i0: E.Expr
    j0: E.Expr
    cell: L.IExpr
    local: dict
    #: moves accesses of the row vectors kept in registers to the cell's row
    #: slot (:func:`_row_mappers`): ``(expression mapper, statement mapper)``
    rows: tuple = (None, None)

    @staticmethod
    def of(phase: "_Phase", tiles: list) -> "_CellTask":
        ft = tiles[0]
        n = E.Const(ft.tm * ft.tn)
        t, r, lin = phase.warp_step(n, ft.group)
        wi, wj = _unflatten(lin, [E.Const(ft.tm), E.Const(ft.tn)])
        lane = E.mod(E.Var(t.name), WARP * ft.group)
        cv = [_fresh(x, D.i64) for x in ("p", "q", "h", "e")]
        p, q, h, e = (E.Var(v.name) for v in cv)
        i0, j0 = L.lane_cell(lane, p, q, h, e, ft.group)
        cell = L.IExpr(E.add(E.mul(E.Var(r.name), ft.cells), L.frag_cell(p, q, h, e, ft.wn)))
        return _CellTask(ft, n, t, r, lin, wi, wj, lane, cv, i0, j0, cell,
                         {x.buf.name: x.local for x in tiles},
                         _row_mappers(phase.rows, E.Var(r.name), p, h))

    def fe(self, x: Any) -> Any:
        if isinstance(x, L.Load) and x.buf.name in self.local:
            return L.Load(self.local[x.buf.name], self.cell, x.guard, x.fill)
        return self.rows[0](x)

    def fs(self, st: Any) -> Any:
        """A store to a row vector kept in registers, at the cell's row slot."""
        return self.rows[1](st)


def _row_mappers(rows: dict, rep: E.Expr, p: E.Expr, h: E.Expr) -> tuple[Any, Any]:
    """Expression and statement mappers moving every access to a row vector
    of ``rows`` (``fragments.RowRegs`` by name) to its slot ``(rep, p, h)``
    (:meth:`fragments.RowRegs.slot`) in the thread's registers."""
    def fe(x: Any) -> Any:
        if isinstance(x, L.Load) and x.buf.name in rows:
            rr = rows[x.buf.name]
            return L.Load(rr.local, rr.slot(rep, p, h), x.guard, x.fill)
        return None

    def fs(st: Any) -> Any:
        if isinstance(st, L.Store) and st.buf.name in rows:
            rr = rows[st.buf.name]
            return (L.Store(rr.local, rr.slot(rep, p, h), st.value, st.guard, st.mode),)
        return None

    return fe, fs


def _product(sizes: list[E.Expr]) -> E.Expr:
    n: E.Expr = sizes[0]
    for sz in sizes[1:]:
        n = E.mul(n, sz)
    return n


def _unflatten(lin: E.Expr, sizes: list[E.Expr]) -> list[E.Expr]:
    """The row-major coordinates of linear index ``lin`` over ``sizes`` (the
    first unbounded)."""
    out, rest = [], lin
    for k in range(len(sizes) - 1, -1, -1):
        out.append(rest if k == 0 else E.mod(rest, sizes[k]))
        rest = E.floordiv(rest, sizes[k])
    return out[::-1]


def distribution(W: int, V: int, n: E.Expr, blocked: bool = False) -> TM.TaskMap:
    """The task map of a loop of ``n`` iterations distributed over ``W``
    threads, ``V`` consecutive iterations per thread and step: step ``r`` of
    thread ``t`` covers iterations ``(r W + t) V + v`` for ``v < V`` (those
    ``< n``; the guard masks the rest). ``blocked`` (``V = 1``): thread ``t``
    covers the run ``t c + r``, ``c = cdiv(n, W)``, instead."""
    if blocked:
        return TM.spatial(W) * TM.repeat(E.cdiv(n, W))
    return TM.repeat(E.cdiv(n, W * V)) * TM.spatial(W) * TM.repeat(V)


def once_per_element(path: tuple, st: L.Store) -> bool:
    """Whether store ``st`` writes each element at most once per program,
    judged by its enclosing statements ``path`` (outermost first, from the
    phase body or a block of it): every loop on the path outside its thread
    loop runs at most once (``[0, 1)``), and inside that thread loop ``st``
    is a distributed statement (:func:`distribution`; or ``for.thread t:
    ... st`` with ``l = t``)::

        for.thread t in [0, W):
          for r in [0, ..):              -- optional
            for.vector v in [0, V):      -- optional
              if l < n:  ... st          -- l = W V r + V t + v

    at the top level of the ``if``, its index (index locals resolved) ``base
    + l`` with ``base`` reading only symbols and the variables of those
    run-once loops: distinct ``(t, r, v)`` give distinct ``l`` (mixed radix),
    hence distinct elements."""
    th = [i for i, x in enumerate(path) if isinstance(x, L.For) and x.kind == "thread"]
    if len(th) != 1 or not isinstance(path[th[0]].hi, E.Const):
        return False
    if any(not isinstance(x, (L.For, L.If)) or (isinstance(x, L.For) and (
            x.lo != E.Const(0) or x.hi != E.Const(1))) for x in path[:th[0]]):
        return False
    W = int(path[th[0]].hi.value)
    inner = path[th[0] + 1:]
    if not inner:  # one element per thread: for.thread t: ... st (l = t)
        return _distinct(path[:th[0]], path[th[0]].body, st, E.Var(path[th[0]].var.name))
    if not isinstance(inner[-1], L.If) or not isinstance(inner[-1].cond, L.IPred):
        return False
    guard, loops = inner[-1], inner[:-1]
    kinds = [x.kind for x in loops if isinstance(x, L.For)]
    if (len(kinds) != len(loops) or kinds not in ([], ["serial"], ["vector"], ["serial", "vector"])
            or any(x.lo != E.Const(0) for x in loops)):
        return False
    vec = loops[-1] if kinds and kinds[-1] == "vector" else None
    step = loops[0] if kinds and kinds[0] == "serial" else None
    if vec is not None and not isinstance(vec.hi, E.Const):
        return False
    V = int(vec.hi.value) if vec is not None else 1
    cond = guard.cond.p
    if not (isinstance(cond, E.Cmp) and cond.op == "<"):
        return False
    t, r, v = (E.Var(x.var.name) if x is not None else E.Const(0)
               for x in (path[th[0]], step, vec))
    lin = E.add(E.add(E.mul(W * V, r), E.mul(V, t)), v)
    if E.add(cond.a, E.mul(-1, lin)) != E.Const(0):
        return False
    return _distinct(path[:th[0]], guard.then, st, lin)


def _distinct(outside: tuple, block: tuple, st: L.Store, lin: E.Expr) -> bool:
    """Whether ``st``, at the top level of ``block``, has the index ``base +
    lin`` (index locals assigned before it in ``block`` resolved) with
    ``base`` reading only symbols and the variables of the loops
    ``outside`` the thread loop."""
    if st not in block or not isinstance(st.index, L.IExpr):
        return False
    sub: dict = {}
    for x in block[:block.index(st)]:
        if isinstance(x, L.Assign) and isinstance(x.value, L.IExpr):
            sub[E.Var(x.var.name)] = E.subst(x.value.e, sub)
    base = E.add(E.subst(st.index.e, sub), E.mul(-1, lin))
    outer = {x.var.name for x in outside if isinstance(x, L.For)}
    return all(isinstance(lf, (E.Const, E.Sym)) or (isinstance(lf, E.Var) and lf.name in outer)
               for lf in E.leaves(base))


def _identity(op: str, dt: D.DType) -> float:
    return IDENTITY[op]


def simt_kernel(k: L.Kernel, threads: int = 256, lanes: int = 1,
                maps: list | None = None) -> L.Kernel:
    """``k`` in SIMT form with ``threads`` threads per program (a multiple of
    32), each thread taking ``lanes`` consecutive elements per step of a
    distributed loop; see the module docstring. Every distributed loop
    appends ``(W, V, n)`` to ``maps``: its task map is :func:`distribution`,
    which must cover ``[0, n)`` exactly (``TaskMap.coverage``)."""
    if threads % WARP or not 0 < threads <= SIMT_MAX_THREADS:
        raise UsageError(f"block_threads={threads}: threads per program must be a multiple of "
                         f"{WARP} in [{WARP}, {SIMT_MAX_THREADS}]",
                         hint="e.g. Schedule(block_threads=256)")
    if lanes not in (1, 2, 4, 8):
        raise UsageError(f"vector_lanes={lanes}: consecutive elements per thread must be 1, 2, "
                         "4 or 8", hint="e.g. Schedule(vector_lanes=4)")
    shared = {b.name: replace(b, space="shared") for b in k.locals}

    def fe(x: Any) -> Any:
        if isinstance(x, L.Load) and x.buf.name in shared:
            return L.Load(shared[x.buf.name], x.index, x.guard, x.fill)
        return None

    def fs(st: Any) -> Any:
        if isinstance(st, L.Store) and st.buf.name in shared:
            return (L.Store(shared[st.buf.name], st.index, st.value, st.guard),)
        if isinstance(st, L.WarpMma):
            return (replace(st, **{f: replace(getattr(st, f), buf=shared.get(
                getattr(st, f).buf.name, getattr(st, f).buf)) for f in ("a", "b", "c")}),)
        return None

    scratch: list[L.Buffer] = []
    phases = []
    bodies = [L.map_stmts(ph.body, fe, fs) for ph in k.phases]
    kept: set[str] = set()
    from .inplace import absorb_copies_back  # (inplace.py uses this module)

    bodies, gone = absorb_copies_back(bodies, _nest)
    bodies = [fuse_row_nests(b, _nest) for b in bodies]
    for n, (ph, body) in enumerate(zip(k.phases, bodies)):
        others = L.referenced(tuple(s for m, b in enumerate(bodies) if m != n for s in b))

        def own(plan: dict) -> dict:
            """``plan`` without the buffers another phase touches (they keep memory)."""
            return {name: x for name, x in plan.items() if name not in others and not any(
                fragments.tiles_in(b, {name: x}) for m, b in enumerate(bodies) if m != n)}

        frags = own(fragments.plan(body, threads, _nest))
        rows = own(fragments.plan_rows(body, frags, _nest))
        scratch.extend(ft.local for ft in frags.values())
        scratch.extend(rr.local for rr in rows.values())
        kept |= set(frags) | set(rows)
        new, _ = _Phase(threads, scratch, lanes, maps, frags, rows).body(body, {ph.pid.name},
                                                                          Accesses())
        phases.append(replace(ph, body=new))
    bufs = tuple(b for b in shared.values() if b.name not in kept | gone)
    return replace(k, locals=bufs + tuple(scratch), phases=tuple(phases))


def block_threads(k: L.Kernel) -> dict[str, int]:
    """Threads per program of each phase (1 for a phase without thread loops):
    the widest thread loop, plus the producer warp of a warp-specialized ring
    (``loopir.Roles``: its threads come after the consumers')."""
    out = {}
    for ph in k.phases:
        ws = {int(s.hi.value) for s in L.walk(ph.body)
              if isinstance(s, L.For) and s.kind == "thread" and isinstance(s.hi, E.Const)}
        ws |= {s.roles.consumers + s.roles.producers for s in L.walk(ph.body)
               if isinstance(s, L.For) and s.roles is not None}
        out[ph.name] = max(ws) if ws else 1
    return out
