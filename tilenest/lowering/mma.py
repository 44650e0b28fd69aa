"""The loop nest of ``mma``: register blocking of the contraction.

Meaning (V-22): for every output element ``q`` the accumulator is updated
once per contraction point, in lexicographic order,
``acc[q] = acc[q] + conv(a[q,k]) * conv(b[q,k])`` with the product and the sum
rounded separately; a reassociating ``mma`` with the schedule's ``fma`` on may
fuse them (``Fma``). Any loop order that visits each output element's
contraction points in that order computes exactly this, so the lowering is
free to choose the order of the *free* loops.

Realization (:func:`contract`): the output is cut into *micro-tiles* of
``rows`` elements of the last free(a) dim by ``cols`` elements of the last
free(b) dim (``Schedule.mma_block``, in vector registers of the accumulator
type). For each micro-tile the whole contraction nest runs with the
micro-tile innermost: its rows unrolled in the loop IR (so that no loop runs
across rows for a vectorizer to pick), each a vector loop over its columns.
The micro-tile's accumulator addresses do not depend on the contraction
variables, so the backend keeps the ``rows x cols`` block in vector registers
across the contraction (load once, store once), each step broadcasting one
element of ``a`` per row against ``cols / lanes`` vectors of ``b``. Extents
that are not multiples of the block get one tail band of rows and one tail
block of columns, with the same structure. Without a free(b) dim there is
nothing to vectorize across: the plain order batch, free(a), contraction
runs.
"""

from __future__ import annotations

from typing import Any, Callable

from ..errors import TilenestError
from ..semantics import dtypes as D
from ..semantics import expr as E
from ..semantics.space import Dim
from . import loopir as L
from .core import Lowerer
from .handles import BufH, Index
from .schedule import Schedule, default_mma_block


def lanes(dt: D.DType, vector_bits: int) -> int:
    """Elements of ``dt`` per vector register (narrow floats compute in f32)."""
    return max(1, vector_bits // max(32, dt.bits))


def block_of(sched: Schedule, site: Any = None) -> tuple[int, int]:
    """The schedule's ``mma_block`` (or the automatic one), checked."""
    blk = sched.mma_block or default_mma_block(sched.vector_bits)
    ok = isinstance(blk, (tuple, list)) and len(blk) == 2 and all(
        isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in blk)
    if not ok:
        raise TilenestError(f"schedule field mma_block={blk!r} is not a pair of positive "
                            "integers", site, "mma_block=(rows, vectors), e.g. (8, 2)")
    return blk[0], blk[1]


def contract(lw: Lowerer, res: BufH, roles: dict, ext_of: dict[Dim, E.Expr],
             update: Callable[[Index], None], site: Any = None) -> None:
    """Emit loops calling ``update(q)`` once for every point ``q`` of the
    ``mma`` iteration space (batch, free and contraction dims), such that for
    each output element the contraction points come in lexicographic order
    (``site``: the ``mma`` op's location, for schedule errors)."""
    fa, fb = list(roles["free_a"]), list(roles["free_b"])
    batch, red = list(roles["batch"]), list(roles["contraction"])
    if not fb:
        _box(lw, batch + fa + red, ext_of, {}, update)
        return
    rows_blk, vecs = block_of(lw.sched, site)
    cols_blk = vecs * lanes(res.dtype, lw.sched.vector_bits or 128)
    rdim, cdim = (fa[-1] if fa else None), fb[-1]
    outer = batch + fa[:-1] + fb[:-1]

    def micro(q: Index, r0: E.Expr, rows: E.Expr, c0: E.Expr, cols: E.Expr) -> None:
        """One micro-tile: the contraction nest around rows x cols."""
        def inner(qk: Index) -> None:
            def row(qr: Index) -> None:
                _loop(lw, E.Const(0), cols, "vector",
                      lambda c: update(qr | {cdim: c0 + c}))
            if rdim is None:
                row(qk)
            elif isinstance(rows, E.Const):  # unrolled: no loop across rows to vectorize
                for r in range(rows.value):
                    row(qk | {rdim: r0 + r})
            else:
                _loop(lw, E.Const(0), rows, "serial", lambda r: row(qk | {rdim: r0 + r}))
        _box(lw, red, ext_of, q, inner)

    def band(q: Index, r0: E.Expr, rows: E.Expr) -> None:
        """A band of ``rows`` rows: full column blocks, then the column tail."""
        _blocks(lw, ext_of[cdim], cols_blk,
                lambda c0, cols: micro(q, r0, rows, c0, cols))

    def tiles(q: Index) -> None:
        if rdim is None:
            band(q, E.Const(0), E.Const(1))
            return
        _blocks(lw, ext_of[rdim], rows_blk, lambda r0, rows: band(q, r0, rows))

    _box(lw, outer, ext_of, {}, tiles)


def _blocks(lw: Lowerer, n: E.Expr, size: int,
            emit: Callable[[E.Expr, E.Expr], None]) -> None:
    """Cover ``[0, n)`` by blocks of ``size`` and one tail block: calls
    ``emit(start, length)`` inside a loop over the full blocks, then once for
    the tail (skipped where the extents show it empty)."""
    full = n // size
    tail = n - full * size
    if full == E.Const(1):
        emit(E.Const(0), E.Const(size))
    elif not _empty(full):
        _loop(lw, E.Const(0), full, "serial", lambda i: emit(i * size, E.Const(size)))
    if not _empty(tail):
        emit(full * size, tail)


def _empty(n: E.Expr) -> bool:
    """Whether the extent ``n`` is known to be empty (a constant <= 0)."""
    return isinstance(n, E.Const) and n.value <= 0


def _box(lw: Lowerer, dims: list[Dim], ext_of: dict[Dim, E.Expr], q: Index,
         body: Callable[[Index], None]) -> None:
    """Serial loops over ``dims`` in order (row-major), extending ``q``."""
    if not dims:
        body(q)
        return
    d = dims[0]
    _loop(lw, E.Const(0), ext_of[d], "serial",
          lambda v: _box(lw, dims[1:], ext_of, q | {d: v}, body))


def _loop(lw: Lowerer, lo: E.Expr, hi: E.Expr, kind: str,
          body: Callable[[E.Expr], None]) -> None:
    """``for v in [lo, hi)`` of ``kind`` around ``body(v)``; the range is a
    known fact inside (so guards it implies vanish)."""
    v = lw.fresh("i", L.INDEX)
    x = E.Var(v.name)
    mark = lw.facts.push([x.ge(lo), x.lt(hi)])
    with lw.collect() as stmts:
        body(x)
    lw.facts.pop(mark)
    if stmts:
        lw.emit(L.For(v, lo, hi, tuple(stmts), kind))

