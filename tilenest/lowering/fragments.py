"""Accumulator tiles kept in the lanes' registers (SIMT form).

A tensor-core ``mma`` (``loopir.WarpMma``) distributed one warp tile per warp
leaves lane ``l`` of the warp owning fixed accumulator elements (the
``mma.m16n8k16`` layout, :meth:`~tilenest.lowering.loopir.WarpMma.lane_cells`).
When every other access to the accumulator tile ``X`` is an *elementwise*
nest over the whole tile -- the fill that starts it, the epilogue that reads
it out -- those nests can be distributed by the same layout: the thread that
owns element ``(i, j)`` in the ``mma`` also fills and reads it. Then no
thread ever touches an element another thread owns, so ``X`` needs no shared
memory and no barriers: it becomes a ``local`` buffer of each thread, holding
its ``R x 4 (wm/16) (wn/8)`` elements (``R`` warp tiles per warp; a
warpgroup's ``wgmma`` tile ``R x 4 (wn/8)``, ``wm = 64`` rows over its four
warps), the
``WarpMma`` accumulates into it as a lane fragment (``Frag.lane_cols``) and
the nests read and write it at the cell of their element.

:func:`plan` finds such tiles in a phase body before distribution (the
program's own buffers, sequential form); ``simt.py`` distributes the nests
(``_Phase.distribute_cells``). The conditions, checked here:

* ``X`` is the accumulator of exactly one ``WarpMma``, in a nest ``for wi in
  [0, TM): for wj in [0, TN)`` of warp tiles ``wm x wn`` at offset ``wi wm C
  + wj wn`` of a row-major ``TM wm x TN wn`` tile ``X`` (row length ``C``),
  and is not one of its operands;
* every other access to ``X`` is in a nest ``for i in [0, TM wm): for j in
  [0, TN wn)`` (``vector`` loops: independent iterations) at ``X[C i + j]``,
  whose body assigns no local used outside it, runs no thread loop,
  collective or ``while``;
* the tile fits the registers: at most :data:`MAX_CELLS` elements per
  thread.

Iterations of an elementwise nest are independent, so running them in the
layout's order instead of row-major order is a reordering the ``vector`` kind
permits; the ownership argument makes the privatization exact (each element
has one owner, which performs every access to it, in program order).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from ..semantics import expr as E
from ..targets import SIMT_LANES
from . import loopir as L

WARP = SIMT_LANES
#: the most accumulator elements a thread keeps in registers
MAX_CELLS = 128
_ids = itertools.count()


@dataclass(frozen=True)
class FragTile:
    """Accumulator tile ``buf`` (``rows x cols`` row-major) kept as lane
    fragments in ``local`` (per thread: ``reps`` warp tiles of ``cells``
    elements): warp tiles ``wm x wn``, ``tm x tn`` of them."""

    buf: L.Buffer
    local: L.Buffer
    wm: int
    wn: int
    tm: int
    tn: int
    reps: int
    #: warps computing one tile together (1: ``mma.sync``; 4: a warpgroup's ``wgmma``)
    group: int = 1

    @property
    def cols(self) -> int:
        return self.tn * self.wn

    @property
    def cells(self) -> int:
        return self.wm * self.wn // (WARP * self.group)


def _const(e: E.Expr) -> int | None:
    return e.value if isinstance(e, E.Const) else None


def _affine_is(e: E.Expr, vs: list[str], coeffs: list[int]) -> bool:
    """Is index ``e`` exactly ``sum coeffs[k] * vs[k]``? (``e`` reads only
    ``vs``; an affine form is fixed by its values at 0 and the unit points.)"""
    leaves = {lf for lf in E.leaves(e) if not isinstance(lf, E.Const)}
    if not leaves <= {E.Var(v) for v in vs}:
        return False
    pts = [[0] * len(vs)] + [[int(k == j) for k in range(len(vs))] for j in range(len(vs))]
    pts.append([2] * len(vs))
    for pt in pts:
        env = {E.Var(v): x for v, x in zip(vs, pt)}
        if E.evaluate(e, env) != sum(c * x for c, x in zip(coeffs, pt)):
            return False
    return True


def _x_accesses(st: Any, name: str) -> list[Any]:
    """The loads of ``name`` statement ``st`` evaluates itself and its store."""
    out = [y for y in L.evaluated((st,), nested=False)
           if isinstance(y, L.Load) and y.buf.name == name]
    if isinstance(st, L.Store) and st.buf.name == name:
        out.append(st)
    return out


def plan(body: tuple, threads: int, nest: Any) -> dict[str, FragTile]:
    """The accumulator tiles of phase ``body`` (sequential form, ``threads``
    per program) that can live in registers, by buffer name (module
    docstring). ``nest`` is ``simt._nest``."""
    out: dict[str, FragTile] = {}
    stmts = list(L.walk(body))
    mmas = [s for s in stmts if isinstance(s, L.WarpMma)]
    for w in mmas:
        if w.opaque:  # its lanes' shares are unspecified: the tile stays in memory
            continue
        X = w.c.buf
        if sum(m.c.buf.name == X.name for m in mmas) != 1 or X.name in (w.a.buf.name,
                                                                        w.b.buf.name):
            continue
        # the outermost loop of the nest holding exactly this statement
        owner = [s for s in stmts if isinstance(s, L.For) and s.kind == "vector"
                 and nest(s)[1] == (w,)][:1]
        if not owner:
            continue
        loops, _ = nest(owner[0])
        if len(loops) != 2 or any(_const(lp.lo) != 0 or _const(lp.hi) is None for lp in loops):
            continue
        tm, tn = (_const(lp.hi) for lp in loops)
        rows, cols = tm * w.m, tn * w.n
        if (w.c.lane_cols or w.c.sj != 1 or w.c.si != cols or _const(X.size) != rows * cols
                or not _affine_is(w.c.offset, [lp.var.name for lp in loops],
                                  [w.m * cols, w.n])):
            continue
        nw = threads // w.threads
        reps = -(-tm * tn // nw)
        cells = w.m * w.n // w.threads
        if reps * cells > MAX_CELLS:
            continue
        if any(X.name in (m.a.buf.name, m.b.buf.name) for m in mmas):
            continue
        inside = {id(s) for s in L.walk((owner[0],))}
        nests = [s for s in stmts if isinstance(s, L.For) and s.kind == "vector"
                 and id(s) not in inside and _elementwise(s, X.name, rows, cols, nest, body)]
        covered = {id(t) for s in nests for t in L.walk((s,))} | inside
        if any(_x_accesses(s, X.name) and id(s) not in covered for s in stmts):
            continue
        local = L.Buffer(f"{X.name}.frag{next(_ids)}", X.dtype, "local", E.Const(reps * cells))
        out[X.name] = FragTile(X, local, w.m, w.n, tm, tn, reps, w.group)
    # a nest touching several tiles runs in one layout: they must share it
    for s in stmts:
        touched = [out[n] for n in sorted(out) if any(_x_accesses(t, n) for t in L.walk((s,)))]
        if isinstance(s, L.For) and len({(f.wm, f.wn, f.tm, f.tn, f.group)
                                         for f in touched}) > 1:
            for f in touched:
                out.pop(f.buf.name, None)
    return out


def tiles_in(body: tuple, tiles: dict[str, FragTile]) -> list[FragTile]:
    """The tiles of ``tiles`` that statements of ``body`` access."""
    return [tiles[n] for n in sorted(tiles) if any(_x_accesses(t, n) for t in L.walk(body))]


def _elementwise(s: L.For, name: str, rows: int, cols: int, nest: Any, body: tuple) -> bool:
    """Is ``s`` a nest over the ``rows x cols`` tile accessing ``name`` only
    at its own element, with independent iterations (module docstring)?"""
    loops, inner = nest(s)
    if len(loops) != 2 or [(_const(lp.lo), _const(lp.hi)) for lp in loops] != [(0, rows),
                                                                              (0, cols)]:
        return False
    vs = [lp.var.name for lp in loops]
    for st in L.walk(inner):
        if isinstance(st, (L.WarpMma, L.While, L.Shuffle, L.LaneReduce, L.Barrier)) or (
                isinstance(st, L.For) and st.kind == "thread"):
            return False
        for acc in _x_accesses(st, name):
            if not (isinstance(acc.index, L.IExpr) and _affine_is(acc.index.e, vs, [cols, 1])):
                return False
    own = set(L.assigned(inner))
    outside = [t for t in L.walk(body) if t is not s and id(t) not in
               {id(u) for u in L.walk((s,))}]
    return not (own & L.referenced(tuple(outside)))


def lane_frag(ft: FragTile, rep: E.Expr) -> L.Frag:
    """The ``WarpMma`` accumulator of warp tile ``rep`` of a thread: its cells
    in the thread's fragment buffer."""
    return L.Frag(ft.local, E.mul(rep, ft.cells), 0, 0, ft.wn, 16 * ft.group)
