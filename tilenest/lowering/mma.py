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

SIMT schedules (``Schedule.block_threads``; :func:`simt_contract`) invert
the nest: the micro-tiles are the independent iterations of a ``vector``
nest that the SIMT form distributes over the block's threads (one micro-tile
per thread and step), and inside each the contraction runs with the
``rows x cols`` micro-tile unrolled innermost, so each thread keeps its
accumulators in registers across the contraction and reuses each loaded
element of ``a`` ``cols`` times and of ``b`` ``rows`` times.
"""

from __future__ import annotations

from dataclasses import dataclass
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


@dataclass(frozen=True)
class Clamp:
    """Contraction extents shortened past the operands' zero padding
    (``values._padding_clamp``): ``extents`` replaces the contraction dims'
    extents; where ``skipped`` holds, ``settle(q)`` then adds ``+0`` once to
    output element ``q`` in place of the dropped ``+0`` products."""

    extents: dict[Dim, E.Expr]
    skipped: E.Pred
    settle: Callable[[Index], None]

    def around(self, lw: Lowerer, points: Callable[[Callable[[Index], None]], None]) -> None:
        """``settle`` for every output point that ``points`` enumerates, under
        ``skipped``."""
        with lw.collect() as stmts:
            points(self.settle)
        if stmts:
            lw.emit(L.If(L.IPred(self.skipped), tuple(stmts), ()))


@dataclass(frozen=True)
class Edges:
    """Work a micro-kernel does on its micro-tile's elements around its
    contraction (``accumulators.py``): ``fill(q)`` before it where ``first``
    holds, ``store(q)`` after it where ``last`` holds (either may be None)."""

    first: E.Pred
    fill: Callable[[Index], None] | None
    last: E.Pred
    store: Callable[[Index], None] | None


def contract(lw: Lowerer, res: BufH, roles: dict, ext_of: dict[Dim, E.Expr],
             update: Callable[[Index], None], site: Any = None,
             clamp: Clamp | None = None, edges: Edges | None = None) -> bool:
    """Emit loops calling ``update(q)`` once for every point ``q`` of the
    ``mma`` iteration space (batch, free and contraction dims), such that for
    each output element the contraction points come in lexicographic order
    (``site``: the ``mma`` op's location, for schedule errors); with
    ``clamp``, only the contraction points before the operands' padding.
    ``edges`` run around each micro-tile's contraction where the nest has
    micro-tiles (the CPU's, with a free dim in ``b``): returns whether they
    did."""
    fa, fb = list(roles["free_a"]), list(roles["free_b"])
    batch, red = list(roles["batch"]), list(roles["contraction"])
    if clamp is not None:  # only the contraction dims' extents change
        ext_of = ext_of | clamp.extents
    if lw.sched.block_threads:
        simt_contract(lw, roles, ext_of, update, clamp)
        return False
    if not fb:
        def point(q: Index) -> None:
            _box(lw, red, ext_of, q, update)
            if clamp is not None:
                clamp.around(lw, lambda settle: settle(q))
        _box(lw, batch + fa, ext_of, {}, point)
        return False
    rows_blk, vecs = block_of(lw.sched, site)
    cols_blk = vecs * lanes(res.dtype, lw.sched.vector_bits or 128)
    rdim, cdim = (fa[-1] if fa else None), fb[-1]
    outer = batch + fa[:-1] + fb[:-1]

    def edge(when: E.Pred, fn: Callable[[Index], None] | None, q: Index, r0: E.Expr,
             rows: E.Expr, c0: E.Expr, cols: E.Expr) -> None:
        if fn is None:
            return
        with lw.collect() as stmts:
            _cells(lw, rdim, rows, r0, cdim, cols, c0, q, fn)
        if stmts:
            lw.emit(L.If(L.IPred(when), tuple(stmts), ()))

    def micro(q: Index, r0: E.Expr, rows: E.Expr, c0: E.Expr, cols: E.Expr) -> None:
        """One micro-tile: the contraction nest around rows x cols."""
        if edges is not None:
            edge(edges.first, edges.fill, q, r0, rows, c0, cols)
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
        if clamp is not None:
            clamp.around(lw, lambda settle: _cells(lw, rdim, rows, r0, cdim, cols, c0, q,
                                                   settle))
        if edges is not None:
            edge(edges.last, edges.store, q, r0, rows, c0, cols)

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
    return True


#: the largest SIMT micro-tile side (accumulators per thread: at most 64)
SIMT_TILE = 8


def simt_tile(rows: E.Expr, cols: E.Expr, threads: int) -> tuple[int, int]:
    """The SIMT micro-tile ``(tm, tn)`` for an output of ``rows x cols``
    elements and ``threads`` threads: powers of two dividing constant extents,
    grown (columns first, then rows, alternately) while the micro-tiles still
    number at least ``threads``, each side at most :data:`SIMT_TILE`;
    ``(1, 1)`` for symbolic extents."""
    if not (isinstance(rows, E.Const) and isinstance(cols, E.Const)):
        return 1, 1
    R, C = rows.value, cols.value
    tm = tn = 1
    grew = True
    while grew:
        grew = False
        for side in ("n", "m"):
            m2, n2 = (tm, 2 * tn) if side == "n" else (2 * tm, tn)
            if (max(m2, n2) <= SIMT_TILE and R % m2 == 0 and C % n2 == 0
                    and (R // m2) * (C // n2) >= threads):
                tm, tn, grew = m2, n2, True
    return tm, tn


def _cells(lw: Lowerer, rdim: Dim | None, rows: E.Expr, r0: E.Expr, cdim: Dim, cols: E.Expr,
           c0: E.Expr, q: Index, fn: Callable[[Index], None]) -> None:
    """``fn`` for every output element of a micro-tile (rows, then a vector
    loop over its columns)."""
    def row(qr: Index) -> None:
        _loop(lw, E.Const(0), cols, "vector", lambda c: fn(qr | {cdim: c0 + c}))
    if rdim is None:
        row(q)
    else:
        _loop(lw, E.Const(0), rows, "serial", lambda r: row(q | {rdim: r0 + r}))


def simt_contract(lw: Lowerer, roles: dict, ext_of: dict[Dim, E.Expr],
                  update: Callable[[Index], None], clamp: Clamp | None = None) -> None:
    """The SIMT nest of ``mma`` (module docstring): batch and outer free dims
    serial, then ``for.vector ib: for.vector jb:`` over the micro-tiles of
    the last free dims, the contraction dims serial inside, and the
    ``tm x tn`` micro-tile unrolled innermost. Each output element still sees
    its contraction points in lexicographic order."""
    fa, fb = list(roles["free_a"]), list(roles["free_b"])
    batch, red = list(roles["batch"]), list(roles["contraction"])
    rdim = fa[-1] if fa else None
    cdim = fb[-1] if fb else None
    outer = batch + fa[:-1] + fb[:-1]
    one = E.Const(1)
    rows = ext_of[rdim] if rdim is not None else one
    cols = ext_of[cdim] if cdim is not None else one
    tm, tn = simt_tile(rows, cols, lw.sched.block_threads or 1)

    def cell_q(q: Index, ib: E.Expr, jb: E.Expr, r: E.Expr | int, c: E.Expr | int) -> Index:
        qq = dict(q)
        if rdim is not None:
            qq[rdim] = ib * tm + r
        if cdim is not None:
            qq[cdim] = jb * tn + c
        return qq

    def tiles(q: Index) -> None:
        def cell(ib: E.Expr, jb: E.Expr) -> None:
            def inner(qk: Index) -> None:
                for r in range(tm):
                    for c in range(tn):
                        update(cell_q(qk, ib, jb, r, c))
            _box(lw, red, ext_of, q, inner)
            if clamp is not None:  # loops, not unrolled: one access for the proofs
                clamp.around(lw, lambda settle: _loop(
                    lw, E.Const(0), E.Const(tm), "serial", lambda r: _loop(
                        lw, E.Const(0), E.Const(tn), "serial",
                        lambda c: settle(cell_q(q, ib, jb, r, c)))))

        _loop(lw, E.Const(0), rows // tm, "vector",
              lambda ib: _loop(lw, E.Const(0), cols // tn, "vector",
                               lambda jb: cell(ib, jb)))

    _box(lw, outer, ext_of, {}, tiles)


# ---------------------------------------------------------------------------
# tensor cores

#: the largest warp tile side (accumulators per lane: at most 64 x 64 / 32)
WARP_TILE = 64
MMA_UNITS = ("auto", "tensor", "wgmma", "simt")
#: warpgroup tile widths tried (``wgmma`` n), widest first
GROUP_TILE_N = (256, 128, 64)
#: the narrower widths the instruction also takes, for an ``N`` that no width
#: of :data:`GROUP_TILE_N` divides (attention's scores over 32 keys)
NARROW_TILE_N = (32, 16, 8)


def warpgroups_first(program: Any, sched: Any, profile: Any) -> bool:
    """Whether ``mma_unit="auto"`` tries the warpgroup tensor cores first
    (``lower_verified``): the target has them (``Profile.tensor_cores``), the
    schedule distributes programs over a whole number of warpgroups, and
    some ``mma`` of ``program`` may regroup its sum with 2-d operands of a
    dtype they take (16-bit floats or FP8). Whether each ``mma`` then fits
    their plan is the plan's own decision (:func:`tensor_plan`); a program
    where one does not is lowered for ``mma.sync`` instead.

    Operand tiles with dims of extent 1 (attention's ``[1, 1, rows, D]``
    tiles) are tried too when every such ``mma`` gives each warpgroup one
    64-row band of its own (constant output rows, 64 per warpgroup): then
    its tiles span whole rows and the tiles computed from them stay in
    registers (L-10, *Warpgroup tiles in registers*; attention 1.2-1.4x
    faster than on ``mma.sync`` on an H200). With fewer rows two
    warpgroups would share each row of tiles, and attention's
    probabilities would go through shared memory, slower than
    ``mma.sync``; with more, each warpgroup would keep several bands'
    tiles in registers, a form not measured."""
    if not (sched.mma_unit == "auto" and "wgmma" in profile.tensor_cores
            and sched.block_threads and sched.block_threads % 128 == 0):
        return False
    mmas = _tensor_mmas(program)
    if any(_plain(op) for op in mmas):
        return True
    return _band_rows(mmas) == 64 * (sched.block_threads // 128)


def band_threads(program: Any, profile: Any) -> int | None:
    """The threads per block that give each warpgroup one 64-row band of
    every tensor-core ``mma`` of ``program`` with unit dims (128 per 64 rows
    of :func:`band_rows`), when the target has warpgroup tensor cores and
    the block can hold them; else None. The default ``block_threads`` of
    such a program on such a target (``default_schedule``): attention with
    64-row query tiles then runs on one warpgroup, its tiles in registers
    (0.534 ms against 0.634 on 256 threads with ``mma.sync``, an H200,
    spec/lowering.md L-10)."""
    rows = band_rows(program)
    if rows is None or "wgmma" not in profile.tensor_cores:
        return None
    threads = 128 * (rows // 64)
    return threads if threads <= profile.max_threads else None


def band_rows(program: Any) -> int | None:
    """The output rows ``R`` shared by every tensor-core ``mma`` of
    ``program`` (a reassociating one on 16-bit or FP8 operands) when all of
    them have operand tiles with unit dims (attention's ``[1, 1, rows, D]``),
    two dims other than 1 in each operand and result, all constant, and
    ``R`` a multiple of 64; else None."""
    return _band_rows(_tensor_mmas(program))


def _band_rows(mmas: list) -> int | None:
    """:func:`band_rows` of the tensor-core ``mma`` ops ``mmas``."""
    if not mmas or any(_plain(op) for op in mmas):
        return None
    rows = set()
    for op in mmas:
        sq = [_squeezed(o.type) for o in (*op.operands[:2], op.results[0])]
        if not all(x is not None and len(x) == 2 for x in sq):
            return None
        rows.add(sq[2][0])  # type: ignore[index]
    (r, *more) = rows
    return r if not more and r % 64 == 0 else None


def _tensor_mmas(program: Any) -> list:
    """The ``mma`` ops of ``program`` tensor cores may compute: reassociating,
    on 16-bit float or FP8 operands."""
    return [op for op in program.walk() if op.name == "mma"
            and op.attrs.get("allow_reassociation")
            and all((o.type.dtype.is_float and o.type.dtype.itemsize == 2)
                    or o.type.dtype.is_fp8 for o in op.operands[:2])]


def _plain(op: Any) -> bool:
    """Whether ``mma`` op ``op`` has 2-d operands (no unit dims to squeeze)."""
    return all(o.type.rank == 2 for o in op.operands[:2])


def _squeezed(t: Any) -> list[int] | None:
    """The extents of tile type ``t`` other than 1, or None when one is not
    a constant."""
    out = []
    for x in t.extents:
        if not isinstance(x, E.Const):
            return None
        if x.value != 1:
            out.append(x.value)
    return out


def warp_tile(rows: int, cols: int, warps: int, sides: tuple[int, ...] = (16, 32, 64),
              whole_rows: bool = False) -> tuple[int, int]:
    """The warp tile ``(wm, wn)`` of an output of ``rows x cols`` on
    ``warps`` warps: sides in ``sides`` dividing the output, the largest
    area that still gives every warp a tile (the smallest when none does),
    the squarer one among equals (fewest fragment loads per ``mma``). With
    ``whole_rows`` (an output whose rows are reduced, or rescaled by row
    statistics) a tile spanning the whole row is taken when one still gives
    every warp a tile, up to twice :data:`WARP_TILE` wide."""
    sides = tuple(x for x in sides if x <= WARP_TILE)
    wide = (cols,) if whole_rows and cols not in sides and cols <= 2 * WARP_TILE \
        and cols % 8 == 0 else ()
    cands = [(wm, wn) for wm in sides for wn in sides + wide
             if rows % wm == 0 and cols % wn == 0]
    full = [c for c in cands if (rows // c[0]) * (cols // c[1]) >= warps]
    if whole_rows and any(c[1] == cols for c in full):
        full = [c for c in full if c[1] == cols]
    pool = full or [min(cands, key=lambda c: c[0] * c[1])]
    return max(pool, key=lambda c: (c[0] * c[1], -abs(c[0] - c[1]), c[0]))


#: the simdgroup tile sides tried on Metal (8 x 8 matrices; at most 16 live
#: accumulator matrices per simdgroup)
SIMDGROUP_SIDES = (8, 16, 32)


@dataclass(frozen=True)
class TensorPlan:
    """How an ``mma`` runs on the matrix unit (:func:`tensor_plan`): an ``m x
    n x k`` product over the dims ``(fa, fb, red)`` (the one free dim of each
    operand and the contraction dim that are not of extent 1) in ``wm x wn``
    tiles of ``group`` warps (``opaque``: simdgroup matrices), once for
    every point of the ``batch`` dims (constant extents, a loop each); every
    other dim has extent 1 and stays at 0. ``a`` and ``b``: the operands'
    buffers; ``strides``: the element strides ``(row, column)`` of ``a``
    (``fa``, ``red``), ``b`` (``red``, ``fb``) and the accumulator (``fa``,
    ``fb``)."""

    m: int
    n: int
    k: int
    wm: int
    wn: int
    strides: tuple[tuple[int, int], ...]
    group: int
    opaque: bool
    dims: tuple[Dim, Dim, Dim]
    a: BufH
    b: BufH
    batch: tuple[tuple[Dim, int], ...] = ()


def _unit(x: E.Expr) -> bool:
    return isinstance(x, E.Const) and x.value == 1


def _stride(h: BufH, d: Dim) -> E.Expr:
    """The element stride of dim ``d`` in dense buffer ``h``."""
    zero = {x: E.Const(0) for x in h.dims}
    return E.add(h.offset(zero | {d: E.Const(1)}), E.mul(-1, h.offset(zero)))


def tensor_plan(lw: Lowerer, op: Any, a: Any, b: Any, res: BufH, roles: dict,
                ext_of: dict[Dim, E.Expr]) -> "str | TensorPlan":
    """Whether this ``mma`` runs on the target's matrix unit
    (``Profile.tensor_cores``): the reason it does not (a string), or its
    :class:`TensorPlan`. It qualifies when the schedule is SIMT, the ``mma``
    reassociates, dims of extent 1 aside there is one free dim in each
    operand and one contraction dim, the batch dims (looped) have constant
    extents, the extents and strides are constants, and the unit takes the
    types and the shape (an operand not yet in a program buffer is evaluated
    into one):

    * ``mma.sync`` / ``wgmma`` (NVIDIA): f16 (or bf16) operands into f32,
      rows and contraction multiples of 16, columns of 16, every fragment row
      16-byte aligned (strides multiples of 8 elements); or two FP8 operands
      (``mma.sync`` ``m16n8k32`` or ``wgmma`` ``k32``, either format each)
      into f32, the contraction a multiple of 32 and both operands contiguous
      along it (the 8-bit operands are read untransposed; strides multiples
      of 16);
    * ``simdgroup_matrix`` (Metal): f16 or f32 operands into f32 (bfloat
      matrices need MSL 3.1, which the target does not assume), every side a
      multiple of 8, each of ``a``, ``b`` and the accumulator contiguous
      along one of its two axes (the other is the row stride of the 8 x 8
      loads and stores)."""
    at, bt, ct = (o.type for o in op.operands)
    if not lw.sched.block_threads:
        return "the schedule is not SIMT (block_threads unset)"
    if not op.attrs["allow_reassociation"]:
        return "the mma does not allow reassociation (tensor cores regroup the sum)"
    simdgroup = "simdgroup_matrix" in lw.profile.tensor_cores
    if simdgroup:
        if at.dtype != bt.dtype or at.dtype.name not in ("f16", "f32") or ct.dtype != D.f32:
            why = (" (bfloat simdgroup matrices need MSL 3.1, which the metal target does "
                   "not assume)" if D.bf16 in (at.dtype, bt.dtype) else "")
            return (f"operands {at.dtype} x {bt.dtype} into {ct.dtype}: simdgroup matrices "
                    f"take f16 or f32 into f32{why}")
    elif not ((at.dtype == bt.dtype and at.dtype.name in ("f16", "bf16"))
              or (at.dtype.is_fp8 and bt.dtype.is_fp8)) or ct.dtype != D.f32:
        return (f"operands {at.dtype} x {bt.dtype} into {ct.dtype}: tensor cores take f16 or "
                "bf16, or two FP8 formats, into f32")
    fp8 = at.dtype.is_fp8
    fa, fb, red = ([d for d in roles[r] if not _unit(ext_of[d])]
                   for r in ("free_a", "free_b", "contraction"))
    if len(fa) != 1 or len(fb) != 1 or len(red) != 1:
        return ("tensor cores need one free dim in each operand and one contraction dim "
                "(besides dims of extent 1)")
    batch = [d for d in roles["batch"] if not _unit(ext_of[d])]
    if not all(isinstance(ext_of[d], E.Const) for d in batch):
        return "a batch dim of symbolic extent"
    m, n, k = (ext_of[d] for d in (fa[0], fb[0], red[0]))
    if not all(isinstance(x, E.Const) for x in (m, n, k)):
        return "symbolic tile extents"
    dims = (fa[0], fb[0], red[0])
    looped = tuple((d, ext_of[d].value) for d in batch)
    M, N, K = m.value, n.value, k.value
    side = 8 if simdgroup else 16
    if M % side or N % side or K % side:
        return (f"tile {M}x{N}x{K}: rows, columns and contraction must be multiples of "
                f"{side}")
    if fp8 and K % 32:
        return f"tile {M}x{N}x{K}: FP8 tensor cores take the contraction in steps of 32"
    # the unit reads its operands from memory: a value not yet in a buffer (a
    # cast, an elementwise result) is evaluated into a program buffer first
    a, b = (h if isinstance(h, BufH) else lw.materialize(h, o.name)
            for h, o in zip((a, b), op.operands[:2]))
    strides = []
    for h, (di, dj) in ((a, (fa[0], red[0])), (b, (red[0], fb[0])), (res, (fa[0], fb[0]))):
        si, sj = _stride(h, di), _stride(h, dj)
        if not (isinstance(si, E.Const) and isinstance(sj, E.Const)):
            return "an operand has symbolic strides"
        strides.append((si.value, sj.value))
    if simdgroup:
        for (si, sj), what in zip(strides, ("a", "b", "the accumulator")):
            if 1 not in (si, sj):
                return (f"{what} has strides ({si}, {sj}): simdgroup matrices are loaded "
                        "and stored along a contiguous axis")
        if lw.sched.mma_unit == "wgmma":
            return "the target's matrix unit is simdgroup_matrix, not wgmma"
        wm, wn = warp_tile(M, N, lw.sched.block_threads // 32, SIMDGROUP_SIDES)
        return TensorPlan(M, N, K, wm, wn, tuple(strides), 1, True, dims, a, b, looped)
    row = 16 // at.dtype.itemsize  # elements of a 16-byte fragment row
    for si, sj in strides[:2]:
        if 1 not in (si, sj) or max(si, sj) % row:
            return (f"operand strides ({si}, {sj}): one must be 1 and the other a multiple of "
                    f"{row} (16-byte fragment rows)")
    if fp8 and (strides[0][1] != 1 or strides[1][0] != 1):
        return ("FP8 tensor cores read both operands along the contraction: a must be "
                "contiguous along its contraction dim and b too (b stored N x K, as "
                "torch._scaled_mm takes it)")
    if lw.sched.mma_unit == "wgmma":
        if looped or any(sum(not _unit(x) for x in h.extents) != 2 for h in (a, b)):
            return "wgmma takes 2-d operand tiles (no batch dims; dims of extent 1 aside)"
        return _group_plan(lw, a, b, M, N, K, strides, dims)
    wm, wn = warp_tile(M, N, lw.sched.block_threads // 32,
                       whole_rows=op.results[0].name in lw.row_reduced)
    return TensorPlan(M, N, K, wm, wn, tuple(strides), 1, False, dims, a, b, looped)


def group_tile(M: int, N: int, groups: int) -> tuple[int, int] | None:
    """The warpgroup tile ``(64, wn)`` of an ``M x N`` output on ``groups``
    warpgroups: the widest ``wn`` of :data:`GROUP_TILE_N` dividing ``N`` that
    still gives every group a tile (else the narrowest dividing one); when
    none divides ``N``, the widest of :data:`NARROW_TILE_N` that does; None
    when no width does (``N`` not a multiple of 8)."""
    fits = [wn for wn in GROUP_TILE_N if N % wn == 0]
    full = [wn for wn in fits if (M // 64) * (N // wn) >= groups]
    narrow = [wn for wn in NARROW_TILE_N if N % wn == 0][:1]
    got = (full or fits[-1:] or narrow)
    return (64, got[0]) if got else None


def _group_plan(lw: Lowerer, a: BufH, b: BufH, M: int, N: int, K: int,
                strides: list, dims: tuple) -> "str | TensorPlan":
    """The ``wgmma`` plan (``mma_unit="wgmma"``): the reason it does not
    apply, or the plan of ``64 x wn`` tiles of 4 warps. Both operands must be shared
    tiles in the :class:`~tilenest.lowering.loopir.Swizzle128` arrangement
    (row-major ``M x K`` and ``K x N``; FP8: ``M x K`` and ``N x K``, both
    read along K: given to ``mma``-only tiles of suitable extents by
    ``Lowerer.operand_layout``; a 16-bit ``b`` may be stored either way),
    ``M`` a multiple of 64 and the block a whole number of warpgroups."""
    W = lw.sched.block_threads
    if W % 128:
        return f"block_threads={W} is not a whole number of warpgroups (128 threads)"
    if M % 64:
        return f"tile {M}x{N}x{K}: wgmma needs rows in multiples of 64"
    # b is read K-major (stored N x K, as x @ W^T's W is) or, 16-bit only,
    # MN-major (K x N, the transpose bit): FP8 has no transpose
    fp8 = a.dtype.is_fp8
    kmajor = fp8 or strides[1] == (1, K)
    kn = ((N, K), (1, K)) if kmajor else ((K, N), (N, 1))
    for h, (R, C), (si, sj), want, what in ((a, (M, K), strides[0], (K, 1), "a"),
                                            (b, kn[0], strides[1], kn[1], "b")):
        lay = h.buf.layout
        if lay is None or (lay.rows, lay.cols) != (R, C) or (si, sj) != want:
            return (f"operand {what} ({R}x{C}) is not a shared tile in the 128-byte swizzled "
                    f"layout (rows a multiple of 8, columns a multiple of "
                    f"{128 // max(1, h.dtype.itemsize)}, read only by this mma"
                    + (", b stored N x K: FP8 wgmma reads both operands along K)"
                       if fp8 else ")"))
    tile = group_tile(M, N, W // 128)
    if tile is None:
        return f"tile {M}x{N}x{K}: wgmma tiles are a multiple of 8 columns wide"
    wm, wn = tile
    return TensorPlan(M, N, K, wm, wn, tuple(strides), 4, False, dims, a, b)


def tensor_contract(lw: Lowerer, res: BufH, plan: TensorPlan, fresh: bool = False) -> None:
    """The tensor-core nest of ``mma``: ``for.vector`` loops over the batch
    points, then ``for.vector ib: for.vector jb:`` over the ``wm x wn`` warp
    (or warpgroup) tiles of the output, each one ``WarpMma`` over the whole
    contraction (the SIMT form gives each iteration of the nest to one warp,
    or one warpgroup). Dims of extent 1 stay at 0. ``fresh``: ``res`` holds
    nothing yet and the products start from zero (``WarpMma.fresh``)."""
    M, N, K, wm, wn = plan.m, plan.n, plan.k, plan.wm, plan.wn
    a, b = plan.a, plan.b
    (sam, sak), (sbk, sbn), (scm, scn) = plan.strides
    fa, fb, red = plan.dims
    group, opaque = plan.group, plan.opaque
    tag = lw.fresh("wm", L.INDEX).name
    over = "".join(f" for each of {n}" for _, n in plan.batch)
    if opaque:
        lw.emit(L.Comment(f"mma on simdgroup matrices: {M}x{N}x{K}{over} in {wm}x{wn} "
                          f"simdgroup tiles of 8x8x8 ({a.dtype} -> f32)"))
    elif group == 1:
        lw.emit(L.Comment(f"mma on tensor cores: {M}x{N}x{K}{over} in {wm}x{wn} warp tiles of "
                          f"m16n8k{32 if a.dtype.is_fp8 else 16} ({a.dtype} x {b.dtype} -> f32)"))
    else:
        lw.emit(L.Comment(f"mma on tensor cores: {M}x{N}x{K} in {wm}x{wn} warpgroup tiles of "
                          f"wgmma m64n{wn}k{32 if a.dtype.is_fp8 else 16} ({a.dtype} x "
                          f"{b.dtype} -> f32, operands in shared memory)"))

    def at(h: BufH, q: Index) -> E.Expr:
        """The offset of ``h``'s element at ``q``, its other dims at 0."""
        return h.offset({d: q.get(d, E.Const(0)) for d in h.dims})

    def tile(q: Index, ib: E.Expr, jb: E.Expr) -> None:
        i0, j0 = E.mul(ib, wm), E.mul(jb, wn)
        fr_a = L.Frag(a.buf, at(a, q | {fa: i0}), sam, sak)
        fr_b = L.Frag(b.buf, at(b, q | {fb: j0}), sbk, sbn)
        fr_c = L.Frag(res.buf, at(res, q | {fa: i0, fb: j0}), scm, scn)
        lw.emit(L.WarpMma(fr_a, fr_b, fr_c, wm, wn, K, tag=tag, group=group, opaque=opaque,
                          fresh=fresh))

    def tiles(q: Index) -> None:
        _loop(lw, E.Const(0), E.Const(M // wm), "vector",
              lambda ib: _loop(lw, E.Const(0), E.Const(N // wn), "vector",
                               lambda jb: tile(q, ib, jb)))

    def points(q: Index, rest: tuple) -> None:
        if not rest:
            tiles(q)
            return
        (d, n), more = rest[0], rest[1:]
        _loop(lw, E.Const(0), E.Const(n), "vector", lambda v: points(q | {d: v}, more))

    points({}, plan.batch)


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

