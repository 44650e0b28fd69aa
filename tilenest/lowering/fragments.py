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

* ``X`` is the accumulator of one or more warp mmas (``WarpMma``), each in a nest
  ``for wi in [0, TM): for wj in [0, TN)`` of warp tiles ``wm x wn`` at
  offset ``wi wm C + wj wn`` of a row-major ``TM wm x TN wn`` tile ``X`` (row
  length ``C``), all of one tile shape (attention's accumulator, into which
  a key loop's ``P V`` and the last block's after the loop both add), and
  is no operand of any;
* every other access to ``X`` is in a nest that the layout can run, whose
  body assigns no local used outside it (loops of extent 1 in a nest, such
  as those of a tile's unit batch and head dims, are set to their one
  value and otherwise ignored):

  - an *elementwise* nest ``for i in [0, TM wm): for j in [0, TN wn)``
    (``vector`` loops: independent iterations) at ``X[C i + j]``, running no
    thread loop, collective or ``while``;
  - a *row fold* (:class:`RowFold`, warp tiles only): ``for i in [0, TM
    wm)``, accumulators started, ``for j in [0, C)`` updating each by one
    merge marked ``reassoc`` whose contribution reads ``X`` at ``X[C i +
    j]``, then statements that do not touch ``X`` (attention's row maximum
    and row sum of its score tile);
* the tile fits the registers: at most :data:`MAX_CELLS` elements per
  thread.

Iterations of an elementwise nest are independent, so running them in the
layout's order instead of row-major order is a reordering the ``vector`` kind
permits; the ownership argument makes the privatization exact (each element
has one owner, which performs every access to it, in program order). A row
fold runs as each lane's partial over its cells of the row, combined across
the lane's quad and then across the warps sharing the row
(``simt._Phase.distribute_row_fold``): a regrouping of the fold, which the
``reassoc`` mark (a tree policy) permits and a strict fold never carries.

A shared tile that no ``mma`` touches follows an accumulator tile into
registers when it has the same shape and every access to it is in such a
nest, one of them also touching the accumulator (a *companion*: the score
tile's mask and probabilities, the running accumulator of an online
softmax that the rescaled copy ``P V`` accumulates into is read from and
written back to): every nest touching it then runs in the tile's layout,
so the same ownership argument holds for it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Any, Callable

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

    @property
    def folds(self) -> bool:
        """Can row folds run in this layout? A warp's tiles always (partial
        sums of several warp tiles of a row meet in shared memory); a
        warpgroup's only when its tile spans whole rows (``tn = 1``), each of
        its rows then being one warp's."""
        return self.group == 1 or self.tn == 1


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


def squeeze(loops: list[L.For]) -> tuple[list[L.For], dict[E.Expr, E.Expr]]:
    """The loops of a nest that are not of extent 1, and each unit loop's
    variable with the one value it takes (a tile's dims of extent 1, such as
    attention's batch and head dims, add such loops to its nests)."""
    unit = [_const(E.add(lp.hi, E.mul(-1, lp.lo))) == 1 for lp in loops]
    return ([lp for lp, u in zip(loops, unit) if not u],
            {E.Var(lp.var.name): lp.lo for lp, u in zip(loops, unit) if u})


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
    readers = Readers(body)
    mmas = [s for s in stmts if isinstance(s, L.WarpMma)]
    writers: dict[str, list[L.WarpMma]] = {}
    for w in mmas:
        writers.setdefault(w.c.buf.name, []).append(w)
    for name, ws in writers.items():
        X = ws[0].c.buf
        # (an opaque mma's lanes' shares are unspecified: its tile stays in memory)
        if any(w.opaque for w in ws) or any(name in (m.a.buf.name, m.b.buf.name)
                                            for m in mmas):
            continue

        def acc_shape(w: L.WarpMma, loops: list, tm: int, tn: int) -> tuple | None:
            cols = tn * w.n
            if (w.c.lane_cols or w.c.sj != 1 or w.c.si != cols
                    or _const(X.size) != tm * w.m * cols
                    or not _affine_is(w.c.offset, [lp.var.name for lp in loops],
                                      [w.m * cols, w.n])):
                return None
            return (w.m, w.n, w.group, w.threads, tm, tn)

        # every mma into the tile (a loop's and the one after it) in one layout
        got = _one_shape(ws, stmts, nest, acc_shape)
        if got is None:
            continue
        owners, (wm_, wn_, group, wthreads, tm, tn) = got
        rows, cols = tm * wm_, tn * wn_
        nw = threads // wthreads
        reps = -(-tm * tn // nw)
        cells = wm_ * wn_ // wthreads
        if reps * cells > MAX_CELLS:
            continue
        inside = {id(s) for o in owners for s in L.walk((o,))}
        folds = group == 1 or tn == 1
        nests = [s for s in stmts if isinstance(s, L.For) and s.kind == "vector"
                 and id(s) not in inside and _home(s, X.name, rows, cols, nest, readers, folds)]
        covered = {id(t) for s in nests for t in L.walk((s,))} | inside
        if any(_x_accesses(s, X.name) and id(s) not in covered for s in stmts):
            continue
        local = L.Buffer(f"{X.name}.frag{next(_ids)}", X.dtype, "local", E.Const(reps * cells))
        out[X.name] = FragTile(X, local, wm_, wn_, tm, tn, reps, group)
    _companions(out, stmts, mmas, nest, readers)
    _operand_tiles(out, stmts, mmas, nest, body, readers)
    # a nest touching several tiles runs in one layout: they must share it
    # (a loop holding nests, such as a serial loop over key blocks, is not one)
    changed = True
    while changed:
        changed = False
        for s in stmts:
            if not (isinstance(s, L.For) and s.kind == "vector"):
                continue
            touched = [out[n] for n in sorted(out)
                       if any(_x_accesses(t, n) for t in L.walk((s,)))]
            if len({(f.wm, f.wn, f.tm, f.tn, f.group) for f in touched}) > 1:
                for f in touched:
                    out.pop(f.buf.name, None)
                changed = True
    return out


def _one_shape(ws: list, stmts: list, nest: Any,
               shape_of: Callable[[L.WarpMma, list, int, int], tuple | None]
               ) -> tuple[list[L.For], tuple] | None:
    """The nests of warp tiles holding the mmas ``ws`` (:func:`_tile_nest`)
    and the shape ``shape_of(w, loops, tm, tn)`` they all share, or None when
    some mma has no such nest or no shape (``shape_of`` None), or the shapes
    differ."""
    owners, shapes = [], set()
    for w in ws:
        got = _tile_nest(w, stmts, nest)
        key = None if got is None else shape_of(w, got[1], got[2], got[3])
        if got is None or key is None:
            return None
        owners.append(got[0])
        shapes.add(key)
    return (owners, shapes.pop()) if len(shapes) == 1 else None


def _tile_nest(w: L.WarpMma, stmts: list, nest: Any) -> tuple[L.For, list, int, int] | None:
    """The nest of warp tiles holding exactly ``w``: ``(outermost loop,
    loops, tm, tn)`` when it is two loops ``[0, tm) x [0, tn)`` of constant
    extents, else None."""
    owner = [s for s in stmts if isinstance(s, L.For) and s.kind == "vector"
             and nest(s)[1] == (w,)][:1]
    if not owner:
        return None
    loops, _ = nest(owner[0])
    if len(loops) != 2 or any(_const(lp.lo) != 0 or _const(lp.hi) is None for lp in loops):
        return None
    tm, tn = (_const(lp.hi) for lp in loops)
    return owner[0], loops, tm, tn


def _companions(out: dict[str, FragTile], stmts: list, mmas: list, nest: Any,
                readers: Readers) -> None:
    """Add to ``out`` the companion tiles of its accumulator tiles: a shared
    buffer ``Y`` of a tile's ``rows x cols`` elements that no ``mma`` reads or
    writes, every access of which is in an elementwise nest over that shape
    (at its own element), one of them also accessing the tile. Every nest
    touching ``Y`` is then distributed by the tile's layout, so the thread
    owning element ``(i, j)`` performs every access to ``Y[i, j]`` too and
    ``Y`` is private to its lanes as the tile is: attention's running
    accumulator, which the rescaled copy that ``P V`` accumulates into is
    read from and written back to, leaves shared memory with it."""
    in_mma = {f.buf.name for m in mmas for f in (m.a, m.b, m.c)}
    nests = [s for s in stmts if isinstance(s, L.For) and s.kind == "vector"]
    grew = True
    while grew:
        grew = False
        for ft in list(out.values()):
            rows, cols = ft.tm * ft.wm, ft.cols
            for s in nests:
                if not _home(s, ft.buf.name, rows, cols, nest, readers, ft.folds):
                    continue
                if not any(_x_accesses(t, ft.buf.name) for t in L.walk((s,))):
                    continue
                for Y in _buffers(s):
                    if (Y.name in out or Y.name in in_mma or Y.space != "shared"
                            or Y.layout is not None or _const(Y.size) != rows * cols):
                        continue
                    users = [t for t in stmts if _x_accesses(t, Y.name)]
                    homes = [n for n in nests
                             if _home(n, Y.name, rows, cols, nest, readers, ft.folds)]
                    inside = {id(t) for n in homes for t in L.walk((n,))}
                    if any(id(t) not in inside for t in users):
                        continue
                    local = L.Buffer(f"{Y.name}.frag{next(_ids)}", Y.dtype, "local",
                                     E.Const(ft.reps * ft.cells))
                    out[Y.name] = replace(ft, buf=Y, local=local)
                    grew = True


def _operand_tiles(out: dict[str, FragTile], stmts: list, mmas: list, nest: Any,
                   body: tuple, readers: Readers) -> None:
    """Add to ``out`` the first operands that can stay in registers: a shared
    16-bit tile ``Y`` that is the ``a`` of one or more warp mmas (``WarpMma``;
    no other operand of any), each of whose warp tiles span whole rows
    (``wm x n``, ``tm`` of them, one warp tile per row of tiles) of a ``Y``
    of ``tm wm x k``, every other access of which is in an elementwise nest
    (at its element) -- when a register tile of ``out`` has that layout over
    ``tm wm x k`` (``wm`` rows, ``k`` columns per warp tile: attention's
    probabilities, computed in the scores' layout, for ``P V``; also when
    they are carried to the next key block and the product after the loop
    reads the last of them). The lane owning element ``(i, j)`` in that
    layout then holds it; the ``m16n8k16`` instruction's first operand
    takes, for rows ``16 p + l // 4 (+ 8)`` and columns ``16 kk + 2 (l % 4)
    (+ 1, + 8, + 9)``, exactly the lane's cells of column blocks ``2 kk`` and
    ``2 kk + 1`` (``Frag.lane_cols`` on ``a``), so each product reads them
    from the lane's registers instead of shared memory. A warpgroup's
    ``wgmma`` (four warps, ``wm = 64``) takes its first operand from
    registers in the same per-warp layout, warp ``w`` of the group giving
    rows ``16 w`` to ``16 w + 15``: the rows that warp owns in the register
    tile of the same rows, so a warpgroup tile spanning whole rows passes its
    probabilities to ``P V`` the same way."""
    nests = [s for s in stmts if isinstance(s, L.For) and s.kind == "vector"]
    loops_of = _loops_around(body)
    by_a: dict[str, list[L.WarpMma]] = {}
    for w in mmas:
        by_a.setdefault(w.a.buf.name, []).append(w)
    for name, ws in by_a.items():
        Y = ws[0].a.buf
        # (a warpgroup's operand tile was given the swizzled layout its
        # shared form needs; in registers it has none)
        if (name in out or Y.space != "shared" or Y.dtype.name not in ("f16", "bf16")
                or any(w.opaque or w.a.lane_cols or (Y.layout is not None and w.group == 1)
                       for w in ws)
                or any(name in (m.b.buf.name, m.c.buf.name) for m in mmas)):
            continue
        def a_shape(w: L.WarpMma, loops: list, tm: int, tn: int) -> tuple | None:
            pitch = w.a.si
            if (tn != 1 or w.a.sj != 1 or _const(Y.size) != tm * w.m * pitch
                    or not _affine_is(w.a.offset, [lp.var.name for lp in loops],
                                      [w.m * pitch, 0])):
                return None
            return (w.group, w.m, w.k, tm, pitch)

        got = _one_shape(ws, stmts, nest, a_shape)
        if got is None:
            continue
        owners, (group, wm, wk, tm, pitch) = got
        src = [ft for ft in out.values() if ft.group == group and ft.tn == 1 and ft.wm == wm
               and ft.tm == tm and ft.wn == wk]
        if not src:
            continue
        rows, cols = tm * wm, wk
        homes = [s for s in nests if _elementwise(s, Y.name, rows, cols, nest, readers, pitch)]
        inside = {id(t) for n in homes for t in L.walk((n,))} | \
            {id(t) for o in owners for t in L.walk((o,))}
        if any(_x_accesses(t, Y.name) and id(t) not in inside for t in stmts):
            continue
        # a tile copied in from memory at every step of the loop around the
        # product stays a shared tile (its copies coalesce there, and a ring
        # overlaps them): only values computed in registers, or written
        # before that loop, are taken. A warpgroup reads a shared operand
        # through its descriptor at no cost in instructions or registers,
        # so there only values computed without reading memory are taken
        # (P, or a fill of constants; not Q)
        around = {x for o in owners for x in loops_of.get(id(o), ())}
        writes = [n for n in homes
                  if any(isinstance(t, L.Store) and t.buf.name == name for t in L.walk((n,)))]
        if group > 1 and any(_reads_memory(n, out, name) for n in writes):
            continue
        if group == 1 and any(not any(_x_accesses(t, x) for t in L.walk((n,)) for x in out)
                              and around & set(loops_of.get(id(n), ())) for n in writes):
            continue
        local = L.Buffer(f"{name}.frag{next(_ids)}", Y.dtype, "local",
                         E.Const(src[0].reps * src[0].cells))
        out[name] = replace(src[0], buf=Y, local=local)


def _reads_memory(n: Any, tiles: dict[str, FragTile], own: str) -> bool:
    """Does nest ``n`` read a shared or global buffer other than ``own`` and
    the register tiles ``tiles``?"""
    return any(isinstance(y, L.Load) and y.buf.space in ("shared", "global")
               and y.buf.name != own and y.buf.name not in tiles
               for t in L.walk((n,)) for y in L.evaluated((t,), nested=False))


def _loops_around(body: tuple, outer: tuple = ()) -> dict[int, tuple[int, ...]]:
    """For each statement of ``body`` (nested ones too), the ``id`` of every
    loop other than a ``vector`` one that encloses it."""
    out: dict[int, tuple[int, ...]] = {}
    for s in body:
        out[id(s)] = outer
        if isinstance(s, L.For):
            out.update(_loops_around(s.body, outer + (() if s.kind == "vector" else (id(s),))))
        elif isinstance(s, L.If):
            out.update(_loops_around(s.then, outer))
            out.update(_loops_around(s.orelse, outer))
        elif isinstance(s, L.While):
            out.update(_loops_around(s.pre + s.body, outer + (id(s),)))
    return out


def _buffers(s: Any) -> list[L.Buffer]:
    """The buffers statement ``s`` (nested statements included) loads or stores."""
    seen: dict[str, L.Buffer] = {}
    for t in L.walk((s,)):
        for y in L.evaluated((t,), nested=False):
            if isinstance(y, L.Load):
                seen.setdefault(y.buf.name, y.buf)
        if isinstance(t, L.Store):
            seen.setdefault(t.buf.name, t.buf)
    return [seen[n] for n in sorted(seen)]


def tiles_in(body: tuple, tiles: dict[str, FragTile]) -> list[FragTile]:
    """The tiles of ``tiles`` that statements of ``body`` access."""
    return [tiles[n] for n in sorted(tiles) if any(_x_accesses(t, n) for t in L.walk(body))]


#: the merges a row fold may regroup (with the ``reassoc`` mark)
FOLD_OPS = ("add", "mul", "maximum", "minimum")


@dataclass(frozen=True)
class RowFold:
    """A row reduction over register tiles (:func:`row_fold`): for each row
    ``row.var`` of the tile (the nest's other loops of extent 1, ``units``),
    ``pre``, then ``fold`` over the row's columns updating each accumulator
    of ``merges`` -- ``(local, op, contribution, dtype, flags)``, ``acc =
    op{reassoc}(acc, contribution)`` -- then ``post``."""

    row: L.For
    units: tuple[L.For, ...]
    pre: tuple
    fold: L.For
    post: tuple
    merges: tuple[tuple[L.LVar, str, Any, Any, frozenset], ...]


def row_fold(loops: list[L.For], inner: tuple, names: set[str], rows: int,
             cols: int) -> RowFold | None:
    """The nest ``loops`` / ``inner`` as a :class:`RowFold` over the tiles
    ``names`` (``rows x cols``, row-major), or None. It is one when, loops of
    extent 1 aside, it is a loop over the ``rows`` rows whose body is
    assignments, one loop over the ``cols`` columns and then statements
    touching none of the tiles; that column loop's body is only the updates
    of accumulators the assignments before it start, each one merge marked
    ``reassoc`` (a tree policy's permission to regroup) of an operation in
    :data:`FOLD_OPS`, and its contributions read the tiles only at the
    element (row, column). Those updates may then be regrouped: each lane
    folds the cells of a row it owns and the lanes and warps sharing the
    row combine their partial results."""
    kept, units = squeeze(loops)
    if len(kept) != 1 or (_const(kept[0].lo), _const(kept[0].hi)) != (0, rows):
        return None
    folds = [k for k, st in enumerate(inner) if isinstance(st, L.For)]
    if len(folds) != 1:
        return None
    pre, fold, post = inner[:folds[0]], inner[folds[0]], inner[folds[0] + 1:]
    if (fold.kind not in ("serial", "vector") or fold.reverse
            or (_const(fold.lo), _const(fold.hi)) != (0, cols)
            or not all(isinstance(st, L.Assign) for st in pre)):
        return None
    started = {st.var.name for st in pre}
    merges = []
    for st in fold.body:
        b = st.value if isinstance(st, L.Assign) else None
        if not (isinstance(b, L.Bin) and st.var.name in started and b.op in FOLD_OPS
                and "reassoc" in b.flags and isinstance(b.a, L.Ref)
                and b.a.var.name == st.var.name and st.var.name not in L.names(b.b)):
            return None
        merges.append((st.var, b.op, b.b, b.dtype, b.flags))
    if len({m[0].name for m in merges}) != len(merges):
        return None
    outside = pre + post
    if any(_x_accesses(t, n) for t in L.walk(outside) for n in names) or any(
            isinstance(t, (L.For, L.While, L.WarpMma, L.Shuffle, L.LaneReduce, L.Barrier))
            for t in L.walk(outside)):
        return None
    vs = [kept[0].var.name, fold.var.name]
    for y in L.evaluated(fold.body):
        if isinstance(y, L.Load) and y.buf.name in names and not (
                isinstance(y.index, L.IExpr)
                and _affine_is(E.subst(y.index.e, units), vs, [cols, 1])):
            return None
    unit_loops = tuple(lp for lp in loops if E.Var(lp.var.name) in units)
    return RowFold(kept[0], unit_loops, pre, fold, post, tuple(merges))


def _home(s: L.For, name: str, rows: int, cols: int, nest: Any, readers: Readers,
          folds: bool) -> bool:
    """May nest ``s`` access tile ``name`` (``rows x cols``) in the tile's
    layout: an elementwise nest, or (where the layout runs them,
    :attr:`FragTile.folds`) a row fold."""
    if _elementwise(s, name, rows, cols, nest, readers):
        return True
    loops, inner = nest(s)
    return (folds and row_fold(loops, inner, {name}, rows, cols) is not None
            and readers.private(s, inner))


class Readers:
    """The statements of a phase body (nested ones included) that read each
    local themselves (:func:`~tilenest.lowering.loopir.own_references`),
    gathered once: the plans ask, for nest after nest, whether a local it
    assigns is read outside it, and a walk of the whole body per question
    made a plan quadratic in the phase's size."""

    def __init__(self, body: tuple) -> None:
        self._by_name: dict[str, list[int]] = {}
        self._body = body  # the statements, alive while their ids are in use
        for t in L.walk(body):
            for n in L.own_references(t):
                self._by_name.setdefault(n, []).append(id(t))

    def private(self, s: L.For, inner: tuple) -> bool:
        """Does nest ``s`` (innermost body ``inner``) assign no local that a
        statement of the body outside it reads?"""
        inside = {id(u) for u in L.walk((s,))}
        return not any(i not in inside for n in L.assigned(inner)
                       for i in self._by_name.get(n, ()))


def _elementwise(s: L.For, name: str, rows: int, cols: int, nest: Any, readers: Readers,
                 pitch: int | None = None) -> bool:
    """Is ``s`` a nest over the ``rows x cols`` tile accessing ``name`` only
    at its own element (rows ``pitch`` elements apart, ``cols`` unless
    given), with independent iterations (module docstring)?"""
    loops, inner = nest(s)
    loops, units = squeeze(loops)
    if len(loops) != 2 or [(_const(lp.lo), _const(lp.hi)) for lp in loops] != [(0, rows),
                                                                              (0, cols)]:
        return False
    vs = [lp.var.name for lp in loops]
    for st in L.walk(inner):
        if isinstance(st, (L.WarpMma, L.While, L.Shuffle, L.LaneReduce, L.Barrier)) or (
                isinstance(st, L.For) and st.kind == "thread"):
            return False
        for acc in _x_accesses(st, name):
            if not (isinstance(acc.index, L.IExpr)
                    and _affine_is(E.subst(acc.index.e, units), vs, [pitch or cols, 1])):
                return False
    return readers.private(s, inner)


def lane_frag(ft: FragTile, rep: E.Expr) -> L.Frag:
    """The ``WarpMma`` accumulator of warp tile ``rep`` of a thread: its cells
    in the thread's fragment buffer."""
    return L.Frag(ft.local, E.mul(rep, ft.cells), 0, 0, ft.wn, 16 * ft.group)


# ---------------------------------------------------------------------------
# row statistics kept in the lanes' registers


@dataclass(frozen=True)
class RowRegs:
    """A row vector ``buf`` (one element per row of register tiles whose
    warp tiles span whole rows, ``wm`` rows each, ``tm`` of them, tiles of
    ``group`` warps) kept in the registers of the lanes owning each row in
    those tiles: lane ``l`` (of the warp, or of the warpgroup) running tile
    ``wi`` at its step ``r`` holds row ``wi wm + i`` at :meth:`slot` ``(r,
    p, h)`` of ``local``, where ``i`` is the row of its cells ``(p, q, h,
    e)`` (:func:`~tilenest.lowering.loopir.lane_cell`: ``16 p + 8 h + l //
    4`` for one warp) -- the four lanes of a quad each hold a copy of their
    two rows per 16-row block."""

    buf: L.Buffer
    local: L.Buffer
    wm: int
    tm: int
    reps: int
    group: int = 1

    @property
    def slots(self) -> int:
        """Rows a lane holds per tile: two per 16-row block of its warp."""
        return self.wm // (8 * self.group)

    def slot(self, rep: E.Expr, p: E.Expr, h: E.Expr) -> L.IExpr:
        return L.IExpr(E.add(E.mul(rep, self.slots), E.add(E.mul(p, 2), h)))


def _maximal_nests(body: tuple) -> list[L.For]:
    """The ``vector`` loops of ``body`` that no other ``vector`` loop encloses."""
    out: list[L.For] = []
    for s in body:
        if isinstance(s, L.For) and s.kind == "vector":
            out.append(s)
        elif isinstance(s, L.For):
            out.extend(_maximal_nests(s.body))
        elif isinstance(s, L.If):
            out.extend(_maximal_nests(s.then) + _maximal_nests(s.orelse))
        elif isinstance(s, L.While):
            out.extend(_maximal_nests(s.pre + s.body))
    return out


def _at_row(acc: Any, units: dict, row: str) -> bool:
    """Does access ``acc`` (a load or store) index its row vector by ``row``
    alone (the nest's unit loops at their one value)?"""
    return isinstance(acc.index, L.IExpr) and _affine_is(E.subst(acc.index.e, units), [row], [1])


def plan_rows(body: tuple, tiles: dict[str, FragTile], nest: Any) -> dict[str, RowRegs]:
    """The row vectors of phase ``body`` (sequential form) that can live in
    the lanes' registers beside the register tiles ``tiles``, by buffer name.

    A candidate is a ``shared`` buffer of one element per row of some
    register tiles whose warp (or warpgroup) tiles span whole rows (``tn =
    1``), accessed only inside ``vector`` nests of three kinds, each at the
    nest's row:

    * a row fold over such tiles (:func:`row_fold`), reading it anywhere and
      storing it in the statements after the fold, which store nothing but
      such vectors (they run in every lane of the quad owning the row, on
      the quad's combined value, instead of in one lane);
    * an elementwise nest over such tiles, reading it (the rescaling of
      attention's accumulator by ``alpha``, its division by the row sums);
    * a nest over the rows alone that touches no tile and stores nothing but
      such vectors (their initial values), run by every lane for the rows it
      owns.

    Every nest touching one runs in one row layout (the same ``wm`` and
    ``tm``), so each element is read and written only by the lanes holding
    it, in program order, each lane computing the same value from the same
    operands: the vector is private to those lanes, and needs no shared
    memory and no barrier."""
    layouts = {(ft.wm, ft.tm, ft.reps, ft.group) for ft in tiles.values() if ft.tn == 1}
    if not layouts:
        return {}
    stmts = list(L.walk(body))
    readers = Readers(body)
    in_mma = {f.buf.name for m in stmts if isinstance(m, L.WarpMma) for f in (m.a, m.b, m.c)}
    # (a buffer with an asynchronous store is left in memory too)
    in_mma |= {t.buf.name for t in stmts if isinstance(t, L.Store) and t.mode}
    bufs = {b.name: b for t in body for b in _buffers(t)}
    rows_of = {wm * tm for wm, tm, _r, _g in layouts}
    cands = {n for n, b in bufs.items()
             if b.space == "shared" and b.layout is None and n not in tiles and n not in in_mma
             and _const(b.size) in rows_of}
    nests = _maximal_nests(body)
    inside = {id(t) for s in nests for t in L.walk((s,))}
    # every access outside a nest leaves the vector in memory
    for t in stmts:
        if id(t) not in inside:
            cands -= {n for n in list(cands) if _x_accesses(t, n)}
    uses: dict[str, set] = {n: set() for n in cands}  # name -> layouts of its tile nests
    stores_in: list[tuple[set[str], set[str]]] = []  # (vectors touched, other buffers stored)
    row_nests: list[set[str]] = []  # the vectors of each nest over the rows alone
    for s in nests:
        touched = {n for n in cands if any(_x_accesses(t, n) for t in L.walk((s,)))}
        if not touched:
            continue
        loops, inner = nest(s)
        kept, units = squeeze(loops)
        fts = tiles_in((s,), tiles)
        lay = {(f.wm, f.tm, f.reps, f.group) for f in fts}
        stored = {t.buf.name for t in L.walk((s,)) if isinstance(t, L.Store)}
        ok = False
        if fts and len(lay) == 1 and lay <= layouts and all(f.tn == 1 for f in fts):
            ft = fts[0]
            rows, cols = ft.tm * ft.wm, ft.cols
            rf = row_fold(loops, inner, {f.buf.name for f in fts}, rows, cols)
            if rf is not None and readers.private(s, inner):
                row = rf.row.var.name
                post = {id(t) for t in L.walk(rf.post)}
                ok = all(_at_row(a, units, row) and (isinstance(a, L.Load) or id(t) in post)
                         for t in L.walk((s,)) for n in touched for a in _x_accesses(t, n))
                ok = ok and not any(isinstance(t, L.Store) and t.buf.name in {
                    f.buf.name for f in fts} for t in L.walk(rf.post))
            elif rf is None and _elementwise(s, ft.buf.name, rows, cols, nest, readers):
                i = kept[0].var.name
                ok = all(isinstance(a, L.Load) and _at_row(a, units, i)
                         for t in L.walk((s,)) for n in touched for a in _x_accesses(t, n))
                stored = set()  # its stores are to its tiles, in their layout
            if ok:
                for n in touched:
                    uses[n] |= lay
        elif not fts and len(kept) == 1 and _const(kept[0].lo) == 0 and readers.private(s, inner) \
                and not any(isinstance(t, (L.For, L.While, L.WarpMma, L.Shuffle, L.LaneReduce,
                                           L.Barrier)) for t in L.walk(inner)):
            i = kept[0].var.name
            ok = all(_at_row(a, units, i) and _const(kept[0].hi) == _const(bufs[n].size)
                     for t in L.walk((s,)) for n in touched for a in _x_accesses(t, n))
            row_nests.append(touched)
        if not ok:
            cands -= touched
            continue
        stores_in.append((touched, stored))
    # one layout per vector, of its own length; statements storing a vector
    # store nothing that stays in memory (they run in four lanes at once)
    keep = {n for n in cands if len(uses[n]) == 1
            and next(iter(uses[n]))[0] * next(iter(uses[n]))[1] == _const(bufs[n].size)}
    # a nest over the rows alone runs in the layout of all its vectors
    for touched in row_nests:
        if len({frozenset(uses[n]) for n in touched & keep}) > 1:
            keep -= touched
    changed = True
    while changed:
        changed = False
        for touched, stored in stores_in:
            if touched & keep and stored - keep:
                keep -= touched
                changed = True
    out: dict[str, RowRegs] = {}
    for n in sorted(keep):
        wm, tm, reps, group = next(iter(uses[n]))
        b = bufs[n]
        local = L.Buffer(f"{n}.rows{next(_ids)}", b.dtype, "local",
                         E.Const(reps * wm // (8 * group)))
        out[n] = RowRegs(b, local, wm, tm, reps, group)
    return out
