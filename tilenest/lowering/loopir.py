"""The loop IR: a small imperative language that every backend consumes.

A :class:`Kernel` is a list of :class:`Phase` s run one after another (one per
top-level ``parallel`` region of the TileIR program). A phase is a body that
the runtime executes once for every *program id* ``pid`` in ``[0, size)``;
program ids of one phase are independent and may run on different cores, in
any order. Within one program everything is sequential: ``For`` loops,
``If``/``While``, scalar assignments to mutable locals, loads and stores.

Values and their meaning:

* Scalars have a :class:`~tilenest.semantics.dtypes.DType`; the meaning of every
  arithmetic node is the scalar function of ``semantics/numerics.py`` of the
  same name (IEEE round-to-nearest per op, integer wrap-around, saturating
  float-to-int casts...). ``Bin.flags`` may grant *permissions* the backend may
  use without changing the admitted set: ``reassoc`` (the op is the merge of a
  tree-permitted reduction: the enclosing loop may regroup and reorder it),
  ``contract`` (a multiply feeding this add may be fused, only inside a
  reassociating ``mma``).
* Index arithmetic is written as semantics index expressions
  (:class:`IExpr`, :class:`IPred`) over loop variables (``Var``), kernel
  symbols (``Sym``) and integer locals (``Val``): exact integer semantics with
  floor division, evaluated in 64-bit two's complement.
* Buffers live in an address space: ``global`` (a kernel argument, C-contiguous,
  shared by all programs of a phase), ``shared`` (one copy per program, seen by
  all of the program's threads), ``local`` (private to one thread of a
  program; the runtime gives every worker its own copy), ``scalar`` (a kernel
  argument passed by reference).

Threads (SIMT form). A program may be executed cooperatively by several
threads. ``For(kind="thread", scope="block")`` over ``[0, W)`` runs its body
once for every thread id ``t < W``, all ``W`` iterations *concurrently*: each
iteration is one thread, with private copies of the locals it assigns and of
``local`` buffers (thread ``t``'s copy of a ``local`` buffer keeps its
contents from one thread loop of the program to the next). Code outside thread loops is *program-level* (uniform): it
means one execution, and a SIMT backend may run it redundantly on every
thread (its locals then hold the same value in every thread, its stores are
done by one thread, its loads by all). Between two synchronization points the
threads' accesses are unordered, so no two threads may make conflicting
accesses (one a write) to one location of a ``shared`` or ``global`` buffer
unless a ``Barrier(scope="block")`` separates them (the *barrier
sufficiency* obligation, ``proofs/barriers.py``). A block barrier stands at
program level between thread loops, or inside a thread loop under control
flow that does not depend on the thread id; either way every access before it,
by any thread, happens before every access after it. ``Shuffle`` and
``LaneReduce`` are *warp collectives* inside a thread loop: the threads of one
aligned group of ``width`` lanes (``t // width`` equal) exchange a value, and
every lane of ``mask`` executes them together; ``WarpMma`` is one too (a
tensor-core tile multiply-accumulate by the 32 lanes of a warp). A backend without threads runs
a thread loop as a sequence of its iterations, split at every
synchronization point inside it (``lowering/serialize.py``).

The loop IR is immutable (frozen dataclasses, tuple children). :func:`print_kernel`
renders it; ``verify.py`` checks it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, replace
from typing import Any, Union

from ..semantics import dtypes as D
from ..semantics import expr as E
from ..semantics.dtypes import DType

INDEX = D.i64

#: status codes of the arithmetic errors generated code detects itself
#: (integer division by zero, a negative shift count); ``ErrorSite`` codes are
#: below them
DIV_ZERO = 1_000_001
NEG_SHIFT = 1_000_002

# ---------------------------------------------------------------------------
# expressions


@dataclass(frozen=True)
class LVar:
    """A mutable scalar local (or loop variable) of one program."""

    name: str
    dtype: DType

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Const:
    """A literal; ``value`` is a Python number already representable in ``dtype``."""

    value: Any
    dtype: DType


@dataclass(frozen=True)
class Ref:
    """The current value of a local."""

    var: LVar

    @property
    def dtype(self) -> DType:
        return self.var.dtype


@dataclass(frozen=True)
class IExpr:
    """An index expression (i64): ``Var`` leaves are loop variables / i64 locals,
    ``Sym`` leaves kernel symbols, ``Val`` leaves integer locals (any int dtype)."""

    e: E.Expr
    dtype: DType = INDEX


@dataclass(frozen=True)
class IPred:
    """A predicate over index expressions (bool)."""

    p: E.Pred
    dtype: DType = D.bool_


@dataclass(frozen=True)
class Un:
    """``op(a)`` with the meaning of ``numerics.unary``; ``dtype`` is the result's.
    ``ulp`` is the accuracy bound the program declared for this application
    (the op's ``ulp`` attribute, ``numerics.ulp_bound``), None for the
    function's own: a target may realize it by any computation within it."""

    op: str
    a: "Expr"
    dtype: DType
    ulp: float | None = None


@dataclass(frozen=True)
class Bin:
    """``op(a, b)`` with the meaning of ``numerics.binary`` on ``a.dtype``."""

    op: str
    a: "Expr"
    b: "Expr"
    dtype: DType
    flags: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Fma:
    """``a * b + c`` where fusing into one rounding is *permitted* (not required);
    only emitted inside a reassociating ``mma``."""

    a: "Expr"
    b: "Expr"
    c: "Expr"

    @property
    def dtype(self) -> DType:
        return self.c.dtype


@dataclass(frozen=True)
class Select:
    """``a`` where ``c`` else ``b`` (both evaluated; neither may have effects)."""

    c: "Expr"
    a: "Expr"
    b: "Expr"

    @property
    def dtype(self) -> DType:
        return self.a.dtype


@dataclass(frozen=True)
class Cast:
    """``numerics.cast`` from ``a.dtype`` to ``dtype`` (into an FP8 format
    with the ``overflow`` policy of the cast op)."""

    a: "Expr"
    dtype: DType
    overflow: str | None = None


@dataclass(frozen=True)
class Bitcast:
    """``numerics.bitcast`` from ``a.dtype`` to ``dtype`` (equal widths)."""

    a: "Expr"
    dtype: DType


@dataclass(frozen=True)
class Load:
    """``buf[index]``; with ``guard``: ``buf[index]`` if guard else ``fill``
    (no access when the guard is false)."""

    buf: "Buffer"
    index: "Expr"
    guard: "Expr | None" = None
    fill: "Expr | None" = None

    @property
    def dtype(self) -> DType:
        return self.buf.dtype


Expr = Union[Const, Ref, IExpr, IPred, Un, Bin, Fma, Select, Cast, Bitcast, Load]

# ---------------------------------------------------------------------------
# buffers


@dataclass(frozen=True)
class Swizzle128:
    """The physical arrangement of a ``shared`` tile that Hopper's
    warpgroup tensor cores read directly (``wgmma`` with the 128-byte swizzle
    mode): a row-major ``rows x cols`` tile (logical index ``L = r cols + c``)
    is cut into *panels* of ``A = 128 / itemsize`` columns; panel ``c // A``
    holds its ``rows`` rows of 128 bytes one after another, and inside each
    row the 16-byte chunk ``x`` (``G = 16 / itemsize`` elements) is stored at
    chunk ``x XOR (r mod 8)``::

        phys(L) = (c // A) rows A + r A + ((c mod A) // G  XOR  r mod 8) G + c mod G

    A buffer of several versions of the tile (a ring, ``double_buffer.py``)
    repeats it every ``rows cols`` elements. For each row the chunk map is a
    permutation of the row's 8 chunks, so ``phys`` is a permutation of
    ``[0, rows cols)``: distinct logical elements are distinct locations, and
    every analysis stated over logical indices (races, barriers, bounds)
    holds for the physical one. The loop IR keeps logical indices; only the
    code generator applies ``phys`` (``tn_swz128`` in the CUDA prelude).
    Groups of ``G`` consecutive elements starting at a multiple of ``G`` stay
    contiguous and 16-byte aligned. Each 8-row group of a panel is one
    1024-byte *atom*; the buffer starts 1024-byte aligned, which the
    hardware's swizzle (address bits 4-6 XOR bits 7-9) requires."""

    rows: int
    cols: int
    itemsize: int

    ATOM_BYTES = 1024

    def __post_init__(self) -> None:
        a = self.panel
        if self.itemsize not in (1, 2, 4) or self.rows % 8 or self.cols % a:
            raise ValueError(f"swizzle128 needs rows a multiple of 8 and columns a multiple of "
                             f"{a}: {self.rows}x{self.cols}")

    @property
    def panel(self) -> int:
        """Columns per panel (128 bytes)."""
        return 128 // self.itemsize

    @property
    def chunk(self) -> int:
        """Elements per 16-byte chunk."""
        return 16 // self.itemsize

    def phys(self, index: int) -> int:
        """The physical element position of logical ``index`` (class docstring)."""
        period = self.rows * self.cols
        ver, L = divmod(index, period)
        r, c = divmod(L, self.cols)
        A, G = self.panel, self.chunk
        return (ver * period + (c // A) * self.rows * A + r * A
                + ((((c % A) // G) ^ (r % 8)) * G) + c % G)

    def __str__(self) -> str:
        return f"swizzle128({self.rows}x{self.cols})"


@dataclass(frozen=True)
class Buffer:
    """Storage: ``size`` elements of ``dtype`` in address space ``space``
    (``global``, ``shared``, ``local`` or ``scalar``). ``size`` is an index expression over
    kernel symbols (the runtime evaluates it); ``arg`` is the kernel-argument
    position of global/scalar buffers. ``layout`` (``shared`` tiles only) is
    a physical arrangement of the logical elements (:class:`Swizzle128`);
    ``None`` is the identity."""

    name: str
    dtype: DType
    space: str
    size: E.Expr = E.Const(1)
    arg: int = -1
    layout: Swizzle128 | None = None

    def __str__(self) -> str:
        return self.name


# ---------------------------------------------------------------------------
# statements


@dataclass(frozen=True)
class Assign:
    var: LVar
    value: Expr


@dataclass(frozen=True)
class Store:
    """``buf[index] = value`` (if ``guard``). ``mode="async"`` permits the
    target to complete the store at any time before the block barrier that
    orders its group (``Barrier.keep``: the next one when every ``keep`` is
    0) -- an asynchronous copy, ``cp.async`` on ``cuda``; the stores of
    ``double_buffer.py``'s producers are so. Until then it is unordered with
    every access, the storing thread's own included (the barrier proof checks
    both)."""

    buf: Buffer
    index: Expr
    value: Expr
    guard: Expr | None = None
    mode: str = ""


@dataclass(frozen=True)
class For:
    """``for var in [lo, hi)`` (descending with ``reverse``). ``kind``:
    ``serial`` (iterations in order), ``vector`` (iterations independent except
    for reductions whose merge carries ``reassoc``: the backend may vectorize),
    ``parallel`` (only the program-id loop of a phase), ``thread`` (``lo`` is
    0 and every iteration is one thread of the enclosing program, all running
    concurrently; ``scope`` names which threads: ``block``; see the module
    docstring). ``tree``: a ``serial`` loop that folds states with a
    tree-permitted reducer may instead be run as that fixed tree
    (:class:`TreeFold`); a backend without threads ignores it."""

    var: LVar
    lo: E.Expr
    hi: E.Expr
    body: tuple["Stmt", ...]
    kind: str = "serial"
    reverse: bool = False
    scope: str = ""
    tree: "TreeFold | None" = None
    bulk: "BulkCopy | None" = None
    roles: "Roles | None" = None


@dataclass(frozen=True)
class Roles:
    """The permission of a program-level ``serial`` loop of the shape

        for i in [lo, hi):
            P(i)             -- ``produce`` statements: bulk copies (standing
                                ``BulkCopy`` thread loops, possibly under an
                                ``If``) into version ``(i - lo) % stages`` of
                                the ring's tiles
            barrier block
            C(i)             -- ``consume`` statements: thread loops whose only
                                shared-memory accesses are overlapped warpgroup
                                mmas reading those versions
            barrier block

    to be run *warp-specialized*: a producer warp of ``producers`` threads
    (numbered after the block's ``consumers`` threads) issues ``P(i)`` up to
    ``stages`` steps ahead of the consumers, and the two roles hand each
    version over through two rings of completion barriers (``full`` and
    ``empty``, ``stages`` each) instead of block barriers. The loop's body is
    the meaning (the barrier proof discharges it as written); the handshake
    that makes the overlapped schedule equivalent to it is these fields,
    which the ``roles.*`` obligations discharge (``proofs/gpu.py``):

    * step ``n`` of the phase's specialized rings -- counted across every run
      of them, so a block that runs rings several times (several rings in a
      phase, or grid-stride programs) keeps the barriers' phases --
      uses slot ``n % stages`` of both rings, in phase ``n // stages``, while
      its tiles are the version the loop's own index expressions name (a
      block barrier follows every run of the ring, so only steps of one run
      are ever in flight together);
    * the producer waits, before writing step ``i >= stages``, for the
      ``empty`` phase of step ``i - stages``, then announces the copies'
      bytes on ``full`` and arrives there;
    * a consumer waits for the ``full`` phase of step ``i`` before ``C(i)``
      when ``wait_full`` (always, in a kernel the lowering makes; the flag
      exists so that a missing wait can be stated and refuted);
    * after ``C(i)`` it completes all but its ``release_keep`` newest mma
      groups and arrives on the ``empty`` slot of step ``i - release_lag``;
      after the loop it completes every group and releases the steps it has
      not released yet. The producer, before it leaves, waits for the
      release of its last ``stages`` steps.

    ``split`` is the number of ``produce`` statements at the head of the
    body (``body[split]`` and ``body[-1]`` are the two barriers)."""

    stages: int
    producers: int
    consumers: int
    split: int
    release_lag: int = 1
    release_keep: int = 1
    wait_full: bool = True

    def produce(self, loop: "For") -> tuple:
        """The producer's statements of ``loop``'s body."""
        return loop.body[:self.split]

    def consume(self, loop: "For") -> tuple:
        """The consumers' statements of ``loop``'s body."""
        return loop.body[self.split + 1:-1]

    def __str__(self) -> str:
        extra = "" if self.wait_full else ", no full wait"
        return (f"roles(producer warp of {self.producers} after {self.consumers} consumers, "
                f"{self.stages} slots, release step i-{self.release_lag} after "
                f"mma_keep={self.release_keep}{extra})")


@dataclass(frozen=True)
class BulkCopy:
    """The permission of a ``thread`` loop whose iterations together copy one
    *box* of a global tensor into a swizzled ``shared`` tile, and do nothing
    else, to be issued instead as bulk tensor copies by one thread (Hopper's
    Tensor Memory Accelerator; a backend without one runs the loop). The
    loop's stores are the copy's meaning: tile element ``(i, j)`` of ``dst``
    (its :class:`Swizzle128` layout, ``rows x cols``, the copy at element
    offset ``at``) is ``src[origin + i e_row + j e_last]`` where that lies in
    the tensor (``shape``, dense row-major), and ``+0`` elsewhere. ``row`` is
    the tensor dim the tile's rows run along (its last dim runs along the
    columns; every other dim is a single coordinate). The stores must be
    asynchronous (``Store.mode == "async"``): the copy completes, as theirs
    would, at the barrier that orders its group (``Barrier.keep``)."""

    src: Buffer
    shape: tuple[E.Expr, ...]
    origin: tuple[E.Expr, ...]
    row: int
    dst: Buffer
    at: E.Expr

    @property
    def layout(self) -> "Swizzle128":
        assert self.dst.layout is not None
        return self.dst.layout

    def box(self) -> tuple[int, ...]:
        """Elements the box spans along each tensor dim (outermost first) for
        one 128-byte panel: the panel's columns, the tile's rows, else 1."""
        lay = self.layout
        n = len(self.shape)
        return tuple(lay.panel if d == n - 1 else lay.rows if d == self.row else 1
                     for d in range(n))

    def exprs(self) -> tuple[E.Expr, ...]:
        """Every index expression it holds."""
        return self.shape + self.origin + (self.at,)

    def mapped(self, f: Any) -> "BulkCopy":
        """``self`` with every index expression through ``f``."""
        return replace(self, shape=tuple(f(x) for x in self.shape),
                       origin=tuple(f(x) for x in self.origin), at=f(self.at))

    def __str__(self) -> str:
        o = ", ".join(E.to_str(x) for x in self.origin)
        return (f"bulk({self.src.name}[{o}] {self.layout.rows}x{self.layout.cols} -> "
                f"{self.dst.name}+{E.to_str(self.at)})")


@dataclass(frozen=True)
class TreeFold:
    """The permission of a ``serial`` loop over the contributions of a
    tree-policy reduction (source op ``oid``) to be evaluated as a fixed
    :class:`~tilenest.semantics.trees.BlockTree` instead of in order: every
    iteration updates the locals ``states`` (assigned before the loop: the
    running state; nothing else is carried) as ``states = merge(states,
    lift(x))`` of its contribution, so a thread may fold its own iterations
    from ``identity`` and the partial states combine with the contract's
    merge: with ``a`` and ``b`` bound to two states (one local per
    component, in the order of ``states``), ``body`` then ``out`` compute
    ``merge(a, b)``. ``ordered``: the policy is ``ordered_tree`` (or the
    merge is not commutative), so the tree must keep source order
    (``blocked``)."""

    oid: int
    states: tuple[LVar, ...]
    identity: tuple[Const, ...]
    a: tuple[LVar, ...]
    b: tuple[LVar, ...]
    body: tuple["Stmt", ...]
    out: tuple["Expr", ...]
    ordered: bool


@dataclass(frozen=True)
class If:
    cond: Expr
    then: tuple["Stmt", ...]
    orelse: tuple["Stmt", ...] = ()


@dataclass(frozen=True)
class While:
    """``loop { pre; if not cond: break; body }``."""

    pre: tuple["Stmt", ...]
    cond: Expr
    body: tuple["Stmt", ...]


@dataclass(frozen=True)
class Check:
    """Record error ``code`` when ``cond`` is false."""

    cond: Expr
    code: int


@dataclass(frozen=True)
class Barrier:
    """All work of the enclosing scope before it is complete before any after it.
    ``scope``: ``block`` (every thread of the enclosing thread loop), ``warp``
    (the lanes of one 32-thread group) or ``program`` (outside thread loops,
    where program order already gives it).

    ``keep`` (block barriers) lets asynchronous stores run on across it: the
    ``mode="async"`` stores a thread issued since its previous block barrier
    form one *group*, committed at this barrier; the barrier then orders only
    the groups older than the thread's ``keep`` newest ones (``keep = 0``:
    every earlier access, the plain meaning). So a store whose group was
    committed at barrier ``B_g`` is complete before the first later barrier
    ``B_h`` with ``h - g >= keep(B_h)``: with every ``keep`` equal to ``N`` it
    stays in flight across ``N`` barriers after its issue (its *lag*), and the
    barrier proof treats it as unordered with every access within that many
    barriers of it.

    ``mma_keep`` does the same for *overlapped* warpgroup mmas
    (``WarpMma.overlap``): each such statement a thread executes is one group
    of tensor-core work, and the barrier completes all but the thread's
    ``mma_keep`` newest groups (their shared-memory reads and accumulator
    updates); the barrier proof gives their reads a lag of the phase's
    largest ``mma_keep``."""

    scope: str = "program"
    keep: int = 0
    mma_keep: int = 0


#: shuffle modes: which lane ``src`` a lane ``l`` of a ``width`` group reads
#: (``b = l - l % width`` its group's first lane; an ``src`` outside the
#: group reads the lane's own value, as CUDA's ``__shfl_*_sync`` do)
SHUFFLE_MODES = ("idx", "xor", "up", "down")
FULL_MASK = 0xFFFFFFFF


@dataclass(frozen=True)
class Shuffle:
    """Warp collective: ``dst = value`` as computed by lane ``src(l)`` of this
    lane's ``width`` group, where for lane offset ``l % width = q`` and
    argument ``lane``: ``idx``: ``src = b + lane % width``; ``xor``: ``b + (q
    ^ lane)``; ``up``: ``b + q - lane`` when ``q >= lane``, else ``l``;
    ``down``: ``b + q + lane`` when ``q + lane < width``, else ``l``. Every lane
    in ``mask`` executes it together; ``lane`` is uniform over the group."""

    dst: LVar
    value: Expr
    lane: E.Expr
    mode: str = "xor"
    width: int = 32
    mask: int = FULL_MASK


@dataclass(frozen=True)
class LaneReduce:
    """Warp collective: ``dst`` = the ``op``-reduction of ``value`` over the
    lanes of this lane's ``width`` group, by the butterfly: for ``o = width/2,
    width/4, .., 1``: ``v = op(v, shuffle_xor(v, o))``. With a commutative
    ``op`` every lane ends with the same value; the grouping is this fixed
    tree, so it is only used where the reduction's policy permits a tree."""

    dst: LVar
    op: str
    value: Expr
    width: int = 32
    mask: int = FULL_MASK
    flags: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Frag:
    """A matrix view of a buffer for :class:`WarpMma`: element ``(i, j)`` is
    ``buf[offset + i * si + j * sj]`` (``offset`` an index expression, the
    strides constants).

    With ``lane_cols = n`` it is instead a *lane fragment* of an ``m x n``
    accumulator tile: the elements lane ``l`` owns in the ``mma.m16n8k16``
    layout (:meth:`WarpMma.lane_cells`) held in that lane's own ``local``
    buffer, element ``(16 p + l // 4 + 8 h, 8 q + 2 (l % 4) + e)`` at
    ``offset + cell(p, q, h, e)`` with ``cell = 4 (p n/8 + q) + 2 h + e``
    (:func:`frag_cell`): each lane's registers, in the order the
    instruction's accumulator operands take them. The first operand ``a``
    (``m x k``) of one warp's collective may be such a fragment too, in the
    same layout with ``k`` columns: the ``m16n8k16`` instruction's ``a``
    registers for rows ``16 p + l // 4 + 8 h`` and 16 columns from ``16 kk``
    are then the lane's cells of column blocks ``2 kk`` and ``2 kk + 1``, in
    order -- the lanes of the warp hold the block between them, each its own
    elements, so :meth:`WarpMma.reference` (one lane alone) does not apply."""

    buf: Buffer
    offset: E.Expr
    si: int
    sj: int
    lane_cols: int = 0
    #: rows between a lane's consecutive 16-row blocks ``p`` (lane fragments):
    #: 16 for a warp's ``mma.sync`` tile, 64 for a warpgroup's ``wgmma`` tile
    #: (whose four warps own one 16-row block each)
    lane_period: int = 16

    def at(self, i: E.Expr, j: E.Expr) -> E.Expr:
        if self.lane_cols:
            p, h = E.floordiv(i, self.lane_period), E.floordiv(E.mod(i, 16), 8)
            q, e = E.floordiv(j, 8), E.mod(j, 2)
            return E.add(self.offset, frag_cell(p, q, h, e, self.lane_cols))
        return E.add(self.offset, E.add(E.mul(i, self.si), E.mul(j, self.sj)))

    def __str__(self) -> str:
        if self.lane_cols:
            return f"{self.buf.name}[{E.to_str(self.offset)} + lane cells of {self.lane_cols} cols]"
        return f"{self.buf.name}[{E.to_str(self.offset)} + {self.si}i + {self.sj}j]"


def frag_cell(p: E.Expr, q: E.Expr, h: E.Expr, e: E.Expr, cols: int) -> E.Expr:
    """The position of accumulator element ``(p, q, h, e)`` (16 x 8 block
    ``(p, q)``, half ``h``, pair element ``e``) among a lane's
    ``4 (m/16) (cols/8)`` elements of an ``m x cols`` tile."""
    return E.add(E.mul(E.add(E.mul(p, cols // 8), q), 4), E.add(E.mul(h, 2), e))


def lane_cell(lane: E.Expr, p: E.Expr, q: E.Expr, h: E.Expr, e: E.Expr,
              group: int = 1) -> tuple[E.Expr, E.Expr]:
    """The coordinates ``(i, j)`` of accumulator element ``(p, q, h, e)`` of
    ``lane`` in a tensor-core tile of ``group`` warps (:class:`WarpMma`):
    ``(16 group p + 16 (lane // 32) + (lane % 32) // 4 + 8 h, 8 q + 2 (lane % 4)
    + e)``; for one warp (``lane < 32``) the ``mma.m16n8k16`` layout."""
    if group == 1:
        row = E.add(E.mul(p, 16), E.add(E.floordiv(lane, 4), E.mul(h, 8)))
    else:
        row = E.add(E.add(E.mul(p, 16 * group), E.mul(E.floordiv(lane, 32), 16)),
                    E.add(E.floordiv(E.mod(lane, 32), 4), E.mul(h, 8)))
    return row, E.add(E.mul(q, 8), E.add(E.mul(E.mod(lane, 4), 2), e))


#: the tensor-core instruction shape of :class:`WarpMma` (rows, cols, depth)
MMA_SHAPE = (16, 8, 16)
#: the shape of an opaque :class:`WarpMma` (``opaque``: 8 x 8 simdgroup matrices)
OPAQUE_SHAPE = (8, 8, 8)
#: the instruction shape of a :class:`WarpMma` of FP8 operands (``mma.m16n8k32``)
FP8_MMA_SHAPE = (16, 8, 32)


@dataclass(frozen=True)
class WarpMma:
    """A matrix multiply-accumulate on tensor cores: for ``i < m``, ``j < n``

        c[i, j] = c[i, j] + sum over kk < k of conv(a[i, kk]) * conv(b[kk, j])

    (``conv``: the exact conversion of the f16/bf16 operands, or of two FP8
    ones, to the f32 accumulator). Only emitted for a reassociating ``mma``:
    the sum may be evaluated in any grouping, each addition rounded
    faithfully (V-22; with FP8 operands to 14 significant bits, V-24).
    ``m``, ``n``, ``k`` are multiples of :attr:`shape` (:data:`MMA_SHAPE`;
    FP8: :data:`FP8_MMA_SHAPE`, 32 deep).

    With ``lane`` (an index expression, the lane id ``t % 32`` of the thread
    loop it is in) it is a *warp collective*: the 32 lanes of one warp execute
    it together (its offsets are uniform over the warp) and between them
    compute the whole tile. Lane ``l`` owns the accumulator elements
    ``(16 p + l // 4 + 8 h, 8 q + 2 (l % 4) + e)`` for ``p < m/16``, ``q < n/8``,
    ``h, e < 2`` (the PTX fragment layout of ``mma.m16n8k16``: it reads and
    writes exactly those of ``c``) and may read any element of the ``m x k``
    block of ``a`` and the ``k x n`` block of ``b`` (:meth:`footprint`).
    Without ``lane`` it is executed by one thread and computes every element.

    With ``group = 4`` it is a *warpgroup* collective (Hopper ``wgmma``): the
    128 threads of four consecutive warps (``lane = t % 128``, the group
    ``t // 128``) compute an ``m x n`` tile with ``m = 64``; warp ``w = lane
    // 32`` of the group owns rows ``16 w + l // 4 + 8 h`` (``l = lane % 32``)
    and columns ``8 q + 2 (l % 4) + e`` for ``q < n/8`` -- the same per-warp
    layout, one 16-row block per warp. Its operands are read straight from
    shared memory, which must hold them in the :class:`Swizzle128`
    arrangement (``a`` row-major ``m x k``; ``b`` row-major ``k x n``, or
    with FP8 operands row-major ``n x k``: the 8-bit instruction reads both
    operands along the contraction).

    With ``opaque`` (Metal's ``simdgroup_matrix``; ``group = 1``) the lanes'
    shares of the tile are unspecified: the collective reads ``a``, ``b`` and
    ``c`` and writes ``c`` from memory in whole 8 x 8 blocks
    (:data:`OPAQUE_SHAPE`), any lane touching any element. Its meaning for
    the analyses is that lane 0 makes every accumulator access (reads and
    writes every element of ``c``; every lane may read all of ``a`` and
    ``b``): any other thread's access to ``c`` is then ordered against it by
    a barrier, and the backend orders the lanes of the simdgroup among
    themselves around the statement (a simdgroup barrier before and after),
    so that no lane's own accesses race with the hidden ones.
    """

    a: Frag
    b: Frag
    c: Frag
    m: int
    n: int
    k: int
    lane: E.Expr | None = None
    tag: str = "mma"
    #: warps executing it together: 1 (``mma.sync``) or 4 (a warpgroup, ``wgmma``)
    group: int = 1
    #: a warpgroup mma that runs on while later statements execute: its
    #: shared reads and accumulator updates complete at a later block barrier
    #: (``Barrier.mma_keep``) or wait (:class:`MmaWait`), and until then the
    #: thread touches neither its accumulator nor writes what it reads
    #: (``mma_waits.py`` checks this for the waits it places; a ring's
    #: mmas by ``double_buffer.overlappable``)
    overlap: bool = False
    #: the lanes' shares are unspecified (simdgroup matrices; see above)
    opaque: bool = False
    #: ``c`` starts at zero: ``c[i, j] = sum ...``, its prior contents neither
    #: read nor needed (a warpgroup mma of a fresh accumulator, ``wgmma``'s
    #: scale-d 0 on its first step, so no statement zeroes it first)
    fresh: bool = False

    @property
    def shape(self) -> tuple[int, int, int]:
        """The instruction shape the tile's sides are multiples of."""
        return (OPAQUE_SHAPE if self.opaque else FP8_MMA_SHAPE if self.a.buf.dtype.is_fp8
                else MMA_SHAPE)

    @property
    def threads(self) -> int:
        """Threads of one collective instance."""
        return 32 * self.group

    def lane_cells(self, lane: E.Expr) -> tuple[list[tuple["LVar", int]], E.Expr, E.Expr]:
        """The loops ``(var, extent)`` enumerating lane ``lane``'s accumulator
        elements and their coordinates ``(i, j)`` over those loop variables."""
        vs = [LVar(f"{self.tag}.{x}", INDEX) for x in ("p", "q", "h", "e")]
        p, q, h, e = (E.Var(v.name) for v in vs)
        i, j = lane_cell(lane, p, q, h, e, self.group)
        return list(zip(vs, (self.m // (16 * self.group), self.n // 8, 2, 2))), i, j

    def update(self, i: E.Expr, j: E.Expr) -> tuple["Stmt", ...]:
        """The in-order contraction of element ``(i, j)``: one admitted
        evaluation, ``c = fma(a, b, c)`` over ``kk`` ascending."""
        kv = LVar(f"{self.tag}.k", INDEX)
        kk = E.Var(kv.name)
        acc = LVar(f"{self.tag}.acc", self.c.buf.dtype)
        dt = acc.dtype
        ca = IExpr(self.c.at(i, j))
        term = Fma(Cast(Load(self.a.buf, IExpr(self.a.at(i, kk))), dt),
                   Cast(Load(self.b.buf, IExpr(self.b.at(kk, j))), dt), Ref(acc))
        start = Const(0.0, dt) if self.fresh else Load(self.c.buf, ca)
        return (Assign(acc, start),
                For(kv, E.Const(0), E.Const(self.k), (Assign(acc, term),)),
                Store(self.c.buf, ca, Ref(acc)))

    def cells(self, body: Any) -> tuple["Stmt", ...]:
        """``body(i, j)`` inside loops over the accumulator elements this
        statement's executor owns: with ``lane``, that lane's
        (:meth:`lane_cells`; for an opaque tile every element, in lane 0
        alone); without, every element."""
        if self.lane is None or self.opaque:
            iv, jv = LVar(f"{self.tag}.i", INDEX), LVar(f"{self.tag}.j", INDEX)
            loops, i, j = [(iv, self.m), (jv, self.n)], E.Var(iv.name), E.Var(jv.name)
        else:
            loops, i, j = self.lane_cells(self.lane)
        out = tuple(body(i, j))
        for v, n in reversed(loops):
            out = (For(v, E.Const(0), E.Const(n), out),)
        if self.opaque and self.lane is not None:
            out = (If(IPred(E.cmp("==", self.lane, E.Const(0))), out, ()),)
        return out

    def reference(self) -> tuple["Stmt", ...]:
        """The statement without concurrency: with ``lane``, what that lane
        computes (its own elements); without, every element."""
        return self.cells(self.update)

    def footprint(self) -> tuple["Stmt", ...]:
        """Statements making every access one lane of the collective may make
        (for the race and barrier analyses): reads of the whole ``a`` and
        ``b`` blocks, then the lane's own read-modify-write of ``c``."""
        r, kk, cc = (LVar(f"{self.tag}.{x}", INDEX) for x in ("fr", "fk", "fc"))
        rv, kv, cv = (E.Var(v.name) for v in (r, kk, cc))
        sink = LVar(f"{self.tag}.sink", self.a.buf.dtype)
        rd_a = For(r, E.Const(0), E.Const(self.m), (For(kk, E.Const(0), E.Const(self.k), (
            Assign(sink, Load(self.a.buf, IExpr(self.a.at(rv, kv)))),)),))
        rd_b = For(kk, E.Const(0), E.Const(self.k), (For(cc, E.Const(0), E.Const(self.n), (
            Assign(sink, Load(self.b.buf, IExpr(self.b.at(kv, cv)))),)),))
        return (rd_a, rd_b) + self.reference_cells()

    def reference_cells(self) -> tuple["Stmt", ...]:
        """The accumulator accesses of :meth:`reference` (no operand reads)."""
        acc = LVar(f"{self.tag}.acc", self.c.buf.dtype)

        def rmw(i: E.Expr, j: E.Expr) -> tuple:
            ca = IExpr(self.c.at(i, j))
            if self.fresh:  # written, not read
                return (Store(self.c.buf, ca, Const(0.0, self.c.buf.dtype)),)
            return (Assign(acc, Load(self.c.buf, ca)), Store(self.c.buf, ca, Ref(acc)))

        return self.cells(rmw)


@dataclass(frozen=True)
class MmaWait:
    """The thread's overlapped warpgroup mmas (``WarpMma.overlap``) complete,
    all but its ``keep`` newest: each execution of an overlapped mma is one
    group of tensor-core work, and a group is complete here when at least
    ``keep`` groups were issued after it. Complete means its reads of ``a``
    and ``b`` and its update of the accumulator are done, so the thread may
    read the accumulator and write the registers and shared tiles it read.

    It stands outside thread loops (every thread of the block runs it) and
    orders only the thread's own accesses after its own mmas: what other
    threads may do with the shared operands is ordered by block barriers,
    which complete overlapped mmas too (``Barrier.mma_keep``).
    ``lowering/mma_waits.py`` places these, each where a pending mma's
    results are first needed."""

    keep: int = 0


@dataclass(frozen=True)
class Comment:
    text: str


Stmt = Union[Assign, Store, For, If, While, Check, Barrier, Shuffle, LaneReduce, WarpMma,
             MmaWait, Comment]

#: statements at which the threads of a thread loop synchronize
SYNC = (Barrier, Shuffle, LaneReduce, WarpMma)

# ---------------------------------------------------------------------------
# kernels


@dataclass(frozen=True)
class Param:
    """A kernel argument: a tensor (``shape`` as index expressions over symbols),
    a runtime scalar (``shape == ()``, ``kind == 'scalar'``), or a *scratch*
    buffer (``kind == 'scratch'``, ``shape == (elements,)``): global memory the
    runtime allocates for each call, holding the values that cross a phase
    boundary (``lowering/phases.py``); the caller never passes it."""

    name: str
    kind: str
    dtype: DType
    shape: tuple[E.Expr, ...] = ()


@dataclass(frozen=True)
class Phase:
    """One launch: ``body`` runs for every program id ``pid`` in
    ``[0, prod(extents))``; ``parallel`` says whether program ids may run
    concurrently (a top-level ``parallel``) or must run in order."""

    name: str
    extents: tuple[E.Expr, ...]
    pid: LVar
    body: tuple[Stmt, ...]
    parallel: bool = True

    def coordinates(self) -> list[E.Expr]:
        """The program's coordinates in the grid ``extents`` (row-major):
        :func:`delinearize` of ``pid``, the expressions the lowering assigns."""
        return delinearize(E.Var(self.pid.name), self.extents)


def delinearize(pid: E.Expr, exts: tuple[E.Expr, ...]) -> list[E.Expr]:
    """``[c_0, .., c_{n-1}]`` with ``pid = sum c_i * prod(exts[i+1:])`` and
    ``0 <= c_i < exts[i]`` for ``0 <= pid < prod(exts)``: ``c_{n-1} = pid %
    e_{n-1}``, ``c_{n-2} = (pid // e_{n-1}) % e_{n-2}``, .., ``c_0`` the
    quotient left (a bijection of ``[0, prod(exts))`` onto the box)."""
    out: list[E.Expr] = []
    rest = pid
    for i in range(len(exts) - 1, 0, -1):
        out.append(rest % exts[i])
        rest = rest // exts[i]
    out.append(rest)
    return out[::-1]


@dataclass(frozen=True)
class ErrorSite:
    """What status ``code`` means: the error class name, a message and a site."""

    code: int
    kind: str
    message: str
    site: Any = None


@dataclass(frozen=True)
class Kernel:
    """A lowered program: parameters, symbols, the buffers of each program
    (``locals``: space ``local``, private to a thread, or ``shared``, one per
    program), phases."""

    name: str
    params: tuple[Param, ...]
    syms: tuple[str, ...]
    locals: tuple[Buffer, ...]
    phases: tuple[Phase, ...]
    errors: tuple[ErrorSite, ...] = ()
    globals: tuple[Buffer, ...] = field(default=())
    #: reduce op id -> the fixed tree (``semantics.trees``) the lowering
    #: committed a tree reduction to (a reduce split over programs)
    trees: tuple[tuple[int, Any], ...] = ()


# ---------------------------------------------------------------------------
# printing


def expr_str(x: Any) -> str:
    """One expression in the printed syntax."""
    if isinstance(x, Const):
        v = x.value
        return f"{v!r}:{x.dtype}" if not isinstance(v, bool) else f"{str(v).lower()}"
    if isinstance(x, Ref):
        return x.var.name
    if isinstance(x, IExpr):
        return f"[{E.to_str(x.e)}]"
    if isinstance(x, IPred):
        return f"[{E.pred_to_str(x.p)}]"
    if isinstance(x, Un):
        bound = "" if x.ulp is None else f"{{ulp={x.ulp:g}}}"
        return f"{x.op}{bound}({expr_str(x.a)})"
    if isinstance(x, Bin):
        fl = "{" + ",".join(sorted(x.flags)) + "}" if x.flags else ""
        return f"{x.op}{fl}({expr_str(x.a)}, {expr_str(x.b)})"
    if isinstance(x, Fma):
        return f"fma({expr_str(x.a)}, {expr_str(x.b)}, {expr_str(x.c)})"
    if isinstance(x, Select):
        return f"select({expr_str(x.c)}, {expr_str(x.a)}, {expr_str(x.b)})"
    if isinstance(x, Cast):
        pol = f", {x.overflow}" if x.overflow else ""
        return f"cast<{x.dtype}{pol}>({expr_str(x.a)})"
    if isinstance(x, Bitcast):
        return f"bitcast<{x.dtype}>({expr_str(x.a)})"
    if isinstance(x, Load):
        s = f"{x.buf.name}[{expr_str(x.index)}]"
        if x.guard is not None:
            s += f" if {expr_str(x.guard)} else {expr_str(x.fill)}"
        return s
    raise TypeError(f"not a loop-IR expression: {x!r}")


def _stmts(body: tuple, ind: int, out: list[str]) -> None:
    pad = "  " * ind
    for s in body:
        if isinstance(s, Assign):
            out.append(f"{pad}{s.var.name}: {s.var.dtype} = {expr_str(s.value)}")
        elif isinstance(s, Store):
            g = f" if {expr_str(s.guard)}" if s.guard is not None else ""
            m = f" ({s.mode})" if s.mode else ""
            out.append(f"{pad}{s.buf.name}[{expr_str(s.index)}] ={m} {expr_str(s.value)}{g}")
        elif isinstance(s, For):
            rev = " reversed" if s.reverse else ""
            kind = f".{s.kind}" if s.kind != "serial" else ""
            kind += f".{s.scope}" if s.scope else ""
            tree = ""
            if s.tree is not None:
                tree = (f" tree({'ordered' if s.tree.ordered else 'unordered'}, "
                        f"{', '.join(v.name for v in s.tree.states)})")
            bulk = f" {s.bulk}" if s.bulk is not None else ""
            bulk += f" {s.roles}" if s.roles is not None else ""
            out.append(f"{pad}for{kind} {s.var.name} in "
                       f"[{E.to_str(s.lo)}, {E.to_str(s.hi)}){rev}{tree}{bulk}:")
            _stmts(s.body, ind + 1, out)
        elif isinstance(s, If):
            out.append(f"{pad}if {expr_str(s.cond)}:")
            _stmts(s.then, ind + 1, out)
            if s.orelse:
                out.append(f"{pad}else:")
                _stmts(s.orelse, ind + 1, out)
        elif isinstance(s, While):
            out.append(f"{pad}loop:")
            _stmts(s.pre, ind + 1, out)
            out.append(f"{pad}  break unless {expr_str(s.cond)}")
            _stmts(s.body, ind + 1, out)
        elif isinstance(s, Check):
            out.append(f"{pad}check {expr_str(s.cond)} else error {s.code}")
        elif isinstance(s, Barrier):
            out.append(f"{pad}barrier {s.scope}" + (f" keep={s.keep}" if s.keep else "")
                       + (f" mma_keep={s.mma_keep}" if s.mma_keep else ""))
        elif isinstance(s, Shuffle):
            out.append(f"{pad}{s.dst.name}: {s.dst.dtype} = shuffle.{s.mode}({expr_str(s.value)}, "
                       f"[{E.to_str(s.lane)}], width={s.width}, mask={s.mask:#x})")
        elif isinstance(s, LaneReduce):
            fl = "{" + ",".join(sorted(s.flags)) + "}" if s.flags else ""
            out.append(f"{pad}{s.dst.name}: {s.dst.dtype} = lane_reduce.{s.op}{fl}("
                       f"{expr_str(s.value)}, width={s.width}, mask={s.mask:#x})")
        elif isinstance(s, WarpMma):
            who = f", lane [{E.to_str(s.lane)}]" if s.lane is not None else ""
            op = ("warp_mma" + (".opaque" if s.opaque else "") if s.group == 1
                  else "group_mma" + (".overlap" if s.overlap else ""))
            out.append(f"{pad}{op}.{s.m}x{s.n}x{s.k} {s.c} += {s.a} * {s.b}{who}")
        elif isinstance(s, MmaWait):
            out.append(f"{pad}mma_wait keep={s.keep}")
        elif isinstance(s, Comment):
            out.append(f"{pad}# {s.text}")
        else:
            raise TypeError(f"not a loop-IR statement: {s!r}")


#: alignment (bytes) of shared buffers without a layout
SHARED_ALIGN = 16


def shared_buffers(node: Any) -> set[str]:
    """The names of the ``shared`` buffers loop-IR ``node`` (a statement
    tuple, a statement or an expression) reads or writes, anywhere inside it."""
    out: set[str] = set()
    seen: set[int] = set()

    def visit(x: Any) -> None:
        if isinstance(x, (str, int, float, bool, type(None), E.Expr, E.Pred, D.DType)):
            return
        if id(x) in seen:
            return
        seen.add(id(x))
        if isinstance(x, Buffer):
            if x.space == "shared":
                out.add(x.name)
            return
        if isinstance(x, (tuple, list)):
            for y in x:
                visit(y)
        elif dataclasses.is_dataclass(x):
            for f in dataclasses.fields(x):
                visit(getattr(x, f.name))

    visit(node)
    return out


def shared_arrangement(k: "Kernel", phase: "Phase | None" = None
                       ) -> tuple[list[tuple[Buffer, E.Expr]], E.Expr]:
    """Where each ``shared`` buffer of ``k`` lies in a block's shared memory:
    ``([(buffer, byte offset)], bytes to allocate)``. Buffers with a layout
    (:class:`Swizzle128`, whose sizes are whole 1024-byte atoms) come first,
    each at a multiple of 1024 bytes; the others follow in declaration order
    at multiples of :data:`SHARED_ALIGN`. Offsets count from a base aligned
    to the strictest of these; since a block's dynamic shared memory is only
    guaranteed 16-byte alignment, a kernel with laid-out buffers allocates
    1024 bytes more and rounds its base up at run time.

    Each phase is its own launch, so nothing in shared memory outlives it:
    with ``phase``, only the buffers that phase reads or writes are placed
    (and those no phase names, which the code generator uses on its own,
    such as the completion barriers of bulk copies), from offset 0. Without
    it, every buffer. This is the one definition both the code generator and
    the ``shared.capacity`` obligation (:func:`shared_bytes`) use."""
    return _arrange(k, None if phase is None else _phase_buffers(k)[phase.name])


def _phase_buffers(k: "Kernel") -> dict[str, set[str]]:
    """The names of the shared buffers each phase places (by phase name):
    those it reads or writes, and those no phase names."""
    used = {ph.name: shared_buffers(ph.body) for ph in k.phases}
    named = set().union(*used.values())
    unnamed = {b.name for b in k.locals if b.space == "shared"} - named
    return {n: u | unnamed for n, u in used.items()}


def _arrange(k: "Kernel", placed: set[str] | None
             ) -> tuple[list[tuple[Buffer, E.Expr]], E.Expr]:
    """:func:`shared_arrangement` of the buffers named in ``placed`` (None:
    all of them)."""
    bufs = [b for b in k.locals if b.space == "shared" and (placed is None or b.name in placed)]
    swz = [b for b in bufs if b.layout is not None]
    off: E.Expr = E.Const(0)
    out = []
    for b in swz + [b for b in bufs if b.layout is None]:
        out.append((b, off))
        nbytes = E.mul(b.size, max(1, b.dtype.itemsize))
        off = E.add(off, E.mul(E.cdiv(nbytes, SHARED_ALIGN), SHARED_ALIGN))
    return out, (E.add(off, Swizzle128.ATOM_BYTES) if swz else off)


def phase_arrangements(k: "Kernel") -> dict[str, tuple[list[tuple[Buffer, E.Expr]], E.Expr]]:
    """:func:`shared_arrangement` of every phase of ``k``, by phase name."""
    return {n: _arrange(k, placed) for n, placed in _phase_buffers(k).items()}


def shared_bytes(k: "Kernel") -> E.Expr:
    """The most shared memory one block of any phase of ``k`` allocates
    (:func:`shared_arrangement` per phase)."""
    most: E.Expr = E.Const(0)
    for _, total in phase_arrangements(k).values():
        most = E.maximum(most, total)
    return most


def print_kernel(k: Kernel) -> str:
    """The whole kernel as text (stable: golden tests compare it)."""
    out = []
    ps = ", ".join(
        f"{p.name}: {p.dtype}[{', '.join(E.to_str(x) for x in p.shape)}]" if p.kind == "tensor"
        else f"scratch {p.name}: {p.dtype}[{E.to_str(p.shape[0])}]" if p.kind == "scratch"
        else f"{p.name}: {p.dtype}" for p in k.params)
    out.append(f"kernel {k.name}({ps}) syms [{', '.join(k.syms)}]")
    for b in k.locals:
        lay = f" {b.layout}" if b.layout is not None else ""
        out.append(f"  {b.space} {b.name}: {b.dtype}[{E.to_str(b.size)}]{lay}")
    for e in k.errors:
        out.append(f"  error {e.code}: {e.kind}: {e.message}")
    for ph in k.phases:
        ext = ", ".join(E.to_str(x) for x in ph.extents)
        mode = "parallel" if ph.parallel else "ordered"
        out.append(f"  phase {ph.name} {mode} {ph.pid.name} in [{ext}]:")
        _stmts(ph.body, 2, out)
    return "\n".join(out) + "\n"


def format_stmts(body: tuple) -> list[str]:
    """The lines :func:`print_kernel` gives statements ``body``."""
    out: list[str] = []
    _stmts(body, 0, out)
    return out


def walk(body: tuple) -> Any:
    """Every statement of ``body``, nested ones included, in pre-order."""
    for s in body:
        yield s
        if isinstance(s, For):
            yield from walk(s.body)
        elif isinstance(s, If):
            yield from walk(s.then)
            yield from walk(s.orelse)
        elif isinstance(s, While):
            yield from walk(s.pre)
            yield from walk(s.body)


def walk_paths(body: tuple, path: tuple = ()) -> Any:
    """``(statement, its enclosing statements)`` for every statement of
    ``body``, nested ones included, in pre-order (``path`` outermost first)."""
    for s in body:
        yield s, path
        if isinstance(s, For):
            yield from walk_paths(s.body, path + (s,))
        elif isinstance(s, If):
            yield from walk_paths(s.then, path + (s,))
            yield from walk_paths(s.orelse, path + (s,))
        elif isinstance(s, While):
            yield from walk_paths(s.pre, path + (s,))
            yield from walk_paths(s.body, path + (s,))


def subexprs(x: Any) -> Any:
    """``x`` and every expression below it."""
    yield x
    if isinstance(x, Un):
        yield from subexprs(x.a)
    elif isinstance(x, Bin):
        yield from subexprs(x.a)
        yield from subexprs(x.b)
    elif isinstance(x, Fma):
        for y in (x.a, x.b, x.c):
            yield from subexprs(y)
    elif isinstance(x, Select):
        for y in (x.c, x.a, x.b):
            yield from subexprs(y)
    elif isinstance(x, (Cast, Bitcast)):
        yield from subexprs(x.a)
    elif isinstance(x, Load):
        yield from subexprs(x.index)
        if x.guard is not None:
            yield from subexprs(x.guard)
            yield from subexprs(x.fill)


def evaluated(body: tuple, nested: bool = True) -> Any:
    """Every expression node the statements of ``body`` evaluate (those of
    nested statements too unless ``nested`` is false), subexpressions
    included."""
    for st in (walk(body) if nested else body):
        for x in stmt_exprs(st):
            yield from subexprs(x)


def stmt_exprs(s: Any) -> list:
    """The expressions a statement evaluates directly (not nested statements')."""
    if isinstance(s, Assign):
        return [s.value]
    if isinstance(s, Store):
        return [s.index, s.value] + ([s.guard] if s.guard is not None else [])
    if isinstance(s, (If, While)):
        return [s.cond]
    if isinstance(s, Check):
        return [s.cond]
    if isinstance(s, (Shuffle, LaneReduce)):
        return [s.value]
    return []


# ---------------------------------------------------------------------------
# rewriting


def map_expr(x: Any, f: Any) -> Any:
    """Rebuild expression ``x`` bottom-up, replacing each node ``n`` by ``f(n)``
    when that is not ``None`` (children are rewritten first)."""
    if isinstance(x, Un):
        x = Un(x.op, map_expr(x.a, f), x.dtype, x.ulp)
    elif isinstance(x, Bin):
        x = Bin(x.op, map_expr(x.a, f), map_expr(x.b, f), x.dtype, x.flags)
    elif isinstance(x, Fma):
        x = Fma(map_expr(x.a, f), map_expr(x.b, f), map_expr(x.c, f))
    elif isinstance(x, Select):
        x = Select(map_expr(x.c, f), map_expr(x.a, f), map_expr(x.b, f))
    elif isinstance(x, Cast):
        x = Cast(map_expr(x.a, f), x.dtype, x.overflow)
    elif isinstance(x, Bitcast):
        x = Bitcast(map_expr(x.a, f), x.dtype)
    elif isinstance(x, Load):
        x = Load(x.buf, map_expr(x.index, f),
                 None if x.guard is None else map_expr(x.guard, f),
                 None if x.fill is None else map_expr(x.fill, f))
    r = f(x)
    return x if r is None else r


def map_stmts(body: tuple, fe: Any, fs: Any = None) -> tuple:
    """Rebuild statements: every expression through :func:`map_expr` with
    ``fe``, every index expression (loop bounds, ``IExpr``/``IPred`` contents,
    shuffle lanes) through ``fe`` too, as ``fe(IExpr(e))`` (so one callback
    sees all index leaves), and every rebuilt statement through ``fs`` (which
    returns a replacement tuple of statements, or ``None`` to keep it)."""
    def ix(e: E.Expr) -> E.Expr:
        r = map_expr(IExpr(e), fe)
        return r.e if isinstance(r, IExpr) else e

    out: list = []
    for s in body:
        if isinstance(s, Assign):
            s = Assign(s.var, map_expr(s.value, fe))
        elif isinstance(s, Store):
            s = replace(s, index=map_expr(s.index, fe), value=map_expr(s.value, fe),
                        guard=None if s.guard is None else map_expr(s.guard, fe))
        elif isinstance(s, For):
            s = For(s.var, ix(s.lo), ix(s.hi), map_stmts(s.body, fe, fs), s.kind, s.reverse,
                    s.scope, s.tree, None if s.bulk is None else s.bulk.mapped(ix), s.roles)
        elif isinstance(s, If):
            s = If(map_expr(s.cond, fe), map_stmts(s.then, fe, fs), map_stmts(s.orelse, fe, fs))
        elif isinstance(s, While):
            s = While(map_stmts(s.pre, fe, fs), map_expr(s.cond, fe), map_stmts(s.body, fe, fs))
        elif isinstance(s, Check):
            s = Check(map_expr(s.cond, fe), s.code)
        elif isinstance(s, Shuffle):
            s = Shuffle(s.dst, map_expr(s.value, fe), ix(s.lane), s.mode, s.width, s.mask)
        elif isinstance(s, LaneReduce):
            s = LaneReduce(s.dst, s.op, map_expr(s.value, fe), s.width, s.mask, s.flags)
        elif isinstance(s, WarpMma):
            s = replace(s, a=replace(s.a, offset=ix(s.a.offset)),
                        b=replace(s.b, offset=ix(s.b.offset)),
                        c=replace(s.c, offset=ix(s.c.offset)),
                        lane=None if s.lane is None else ix(s.lane))
        r = fs(s) if fs is not None else None
        out.extend((s,) if r is None else r)
    return tuple(out)


def index_definitions(k: "Kernel") -> tuple[dict[str, list[tuple]], set[str]]:
    """Each local that may hold an index value, with its definitions, and the
    locals that hold data values. A definition is ``("range", lo, hi)`` for a
    loop variable in ``[lo, hi)`` (the program id: ``[0, prod(extents))``) or
    ``("value", e)`` for an assignment of index expression (or integer
    constant of 32 bits) ``e``; a local assigned anything else (a wider
    constant too, such as the identity ``2^63 - 1`` of an integer minimum:
    no index, it must keep its width), or written by a warp collective,
    holds data."""
    defs: dict[str, list[tuple]] = {}
    data: set[str] = set()
    for ph in k.phases:
        n: E.Expr = E.Const(1)
        for x in ph.extents:
            n = E.mul(n, x)
        defs.setdefault(ph.pid.name, []).append(("range", E.Const(0), n))
        for st in walk(ph.body):
            if isinstance(st, For):
                defs.setdefault(st.var.name, []).append(("range", st.lo, st.hi))
            elif isinstance(st, Assign):
                v = st.value
                if isinstance(v, IExpr):
                    defs.setdefault(st.var.name, []).append(("value", v.e))
                elif (isinstance(v, Const) and isinstance(v.value, int)
                      and -2**31 <= v.value < 2**31):
                    defs.setdefault(st.var.name, []).append(("value", E.Const(int(v.value))))
                else:
                    data.add(st.var.name)
            elif isinstance(st, (Shuffle, LaneReduce)):
                data.add(st.dst.name)
    return defs, data


def assigned(body: tuple) -> dict[str, LVar]:
    """Locals assigned anywhere in ``body`` (loop variables and collective
    destinations included), by name."""
    out: dict[str, LVar] = {}
    for s in walk(body):
        if isinstance(s, Assign):
            out[s.var.name] = s.var
        elif isinstance(s, For):
            out[s.var.name] = s.var
        elif isinstance(s, (Shuffle, LaneReduce)):
            out[s.dst.name] = s.dst
    return out


def names(x: Any) -> set[str]:
    """Names of the locals expression ``x`` reads (``Ref`` and index leaves)."""
    out: set[str] = set()
    for y in subexprs(x):
        if isinstance(y, Ref):
            out.add(y.var.name)
        elif isinstance(y, (IExpr, IPred)):
            out.update(lf.name for lf in E.leaves(y.e if isinstance(y, IExpr) else y.p)
                       if isinstance(lf, (E.Var, E.Val)))
    return out


def referenced(body: tuple) -> set[str]:
    """Names of locals read anywhere in ``body`` (``Ref`` and index leaves)."""
    out: set[str] = set()
    for s in walk(body):
        out |= own_references(s)
    return out


def own_references(s: Any) -> set[str]:
    """Names of locals statement ``s`` reads itself (its nested statements'
    reads aside)."""
    out: set[str] = set()
    for x in stmt_exprs(s):
        out |= names(x)
    if isinstance(s, For):
        out |= names(IExpr(s.lo)) | names(IExpr(s.hi))
        for e in s.bulk.exprs() if s.bulk is not None else ():
            out |= names(IExpr(e))
    elif isinstance(s, Shuffle):
        out |= names(IExpr(s.lane))
    elif isinstance(s, WarpMma):
        for e in mma_indices(s):
            out |= names(IExpr(e))
    return out


def mma_indices(s: WarpMma) -> list[E.Expr]:
    """The index expressions a ``WarpMma`` reads (offsets and lane)."""
    return [s.a.offset, s.b.offset, s.c.offset] + ([s.lane] if s.lane is not None else [])


def is_block_barrier(s: Any) -> bool:
    """Whether ``s`` is a block barrier (every thread of the block)."""
    return isinstance(s, Barrier) and s.scope == "block"


def has_sync(body: tuple) -> bool:
    """Whether ``body`` contains a synchronization point (:data:`SYNC`)."""
    return any(isinstance(s, SYNC) and not (isinstance(s, Barrier) and s.scope == "program")
               for s in walk(body))
