"""The lowering driver: TileIR -> loop IR.

Meaning is preserved op by op. Each op has one lowering rule (``RULES``, filled
by ``values.py``, ``memory.py``, ``regions.py`` and ``reductions.py``) that
turns the handles of its operands (``handles.py``) into handles of its results,
emitting loop-IR statements into the current statement list. A missing rule
is a ``NotAvailableError`` naming the op and the target.

The driver owns what every rule shares: the value environment, the binding
of TileIR index variables to loop-IR index expressions, per-program local
buffers, the known facts used to drop implied guards, error codes, and the
loop nests that evaluate a handle over a tile (:meth:`Lowerer.nest`), with
their range restriction (``facts.py``).

Phases: each top-level ``parallel`` becomes one phase whose program ids are
its domain points (row-major); root-level ops outside it that have no effects
are replayed at the start of each program. A root with other effects is cut
into parallel, ordered and partials phases in program order (``phases.py``);
only where a value crossing a cut has no fixed size does the whole root
stay one ordered phase of a single program.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Any, Callable, Iterator

from ..errors import NotAvailableError, TilenestError
from ..semantics import dtypes as D
from ..semantics import expr as E
from ..semantics.ir import Block, Operation, TileProgram, Value
from ..semantics.space import Dim
from ..semantics.types import TensorType, TileType
from . import loopir as L
from .accumulators import accumulations
from .facts import Facts, conjuncts, residual, split_range, upper_bounds
from .handles import BufH, Handle, Index, LazyH, TensorH, VarH, linear
from .schedule import LAZY_OPS, Schedule, default_schedule, storage_plan, target_row

Rule = Callable[["Lowerer", Operation], None]
RULES: dict[str, Rule] = {}


def rule(*names: str) -> Callable[[Rule], Rule]:
    """Register the lowering of ops ``names``."""

    def deco(fn: Rule) -> Rule:
        for n in names:
            RULES[n] = fn
        return fn

    return deco


def unsupported(op: Operation, target: str, why: str = "") -> NotAvailableError:
    extra = f" ({why})" if why else ""
    return NotAvailableError(f"op '{op.name}' has no lowering for target '{target}'{extra}",
                             op.loc, "run it on the reference interpreter (call the kernel)")


#: region ops whose operands seed values carried from step to step, which
#: the steps' ``yield`` replaces and the op's results give after the loop
CARRYING = ("serial", "pipeline")


def _mma_only(prog: TileProgram) -> set[str]:
    """Names of the values whose every use is as operand ``a`` or ``b`` of an
    ``mma``, directly or through the ``yield`` of a pipeline ``stage`` into
    the stage's result of the same position, or through a loop's carried
    value (a greatest fixpoint). A loop's carried value is one storage for
    its seed, its steps' argument and ``yield`` and its result after the
    loop (``regions.carry_init``, named for the result): its uses are those
    of the step's argument and of the result, and the seed and the yielded
    value reach it (attention's probabilities carried to the next key block
    for a ``P V`` issued there)."""
    uses: dict[str, list[tuple[str, Any]]] = {}

    def via(parent: Any, i: int) -> tuple[str, Any]:
        return ("via", parent.results[i].name if i < len(parent.results) else None)

    def visit(ops: Any, parent: Any) -> None:
        for op in ops:
            for i, o in enumerate(op.operands):
                if op.name == "mma" and i < 2:
                    use: Any = ("mma", None)
                elif op.name == "yield" and parent is not None and parent.name in (
                        "stage",) + CARRYING:
                    use = via(parent, i)
                elif op.name in CARRYING and op.regions:
                    use = via(op, i)
                else:
                    use = ("other", None)
                uses.setdefault(o.name, []).append(use)
            for r in op.regions:
                visit(r.ops, op)
            if op.name in CARRYING and op.regions:
                # a step's argument is the carried storage the result names
                for a, res in zip(op.regions[0].args, op.results):
                    uses.setdefault(res.name, []).extend(uses.get(a.name, []))
                    uses[a.name] = [("via", res.name)]

    visit(prog.body.ops, None)
    good = set(uses)
    changed = True
    while changed:
        changed = False
        for n in list(good):
            if not all(k == "mma" or (k == "via" and v in good) for k, v in uses[n]):
                good.discard(n)
                changed = True
    return good


def _zero_from(h: Handle) -> dict[Dim, E.Expr] | None:
    """Where ``h`` is zero padding, per dim (``BufH.zero_from``): from the
    conjuncts outside of which a ``bounds.zero`` read gives ``+0``, each dim's
    upper bound that involves no other dim's index."""
    if not isinstance(h, LazyH) or h.zero_where is None:
        return None
    names = {f"zq.{i}": d for i, d in enumerate(h.dims)}
    q = {d: E.Var(n) for n, d in names.items()}
    return upper_bounds(h.zero_where(q), names) or None  # type: ignore[return-value]


def _units_first(extents: tuple[E.Expr, ...]) -> tuple[int, ...] | None:
    """A storage order of a tile with ``extents`` that puts its dims of
    extent 1 first and keeps the others in order (None: already so)."""
    unit = [i for i, x in enumerate(extents) if x == E.Const(1)]
    order = tuple(unit) + tuple(i for i in range(len(extents)) if i not in unit)
    return None if order == tuple(range(len(extents))) else order


def _row_reduced(prog: TileProgram) -> tuple[set[str], set[str]]:
    """Names of the ``mma`` results whose rows are reduced, and of the values
    computed from them on the way to such a reduce. Rows are reduced when a
    value computed
    from the result by ops of one tile result each, of the result's dims
    (elementwise: the scaling, masking and exponentials of attention's
    scores; in any order of the dims), is read inside a ``reduce`` whose
    domain runs over the ``mma``'s free ``b`` dim (a row maximum or sum).
    Their tensor-core tiles
    then prefer warp tiles spanning whole rows (``mma.warp_tile``), so that
    the row folds of ``fragments.py`` finish within each warp. So does an
    ``mma`` whose first operand is computed, by such ops, from a value on
    the way to those reduces (attention's ``P V``, ``P`` the cast
    probabilities): its rows are then owned by the warps that own them in the
    scores, and the row statistics they are rescaled by can stay in those
    warps' registers (``fragments.plan_rows``)."""
    from ..semantics.ops.values import mma_roles

    users: dict[str, list[Any]] = {}
    inside: dict[str, set] = {}  # value -> dims of the reduces whose regions read it

    def visit(ops: Any, dims: frozenset) -> None:
        for op in ops:
            for o in op.operands:
                users.setdefault(o.name, []).append(op)
                if dims:
                    inside.setdefault(o.name, set()).update(dims)
            inner = dims
            if op.name == "reduce":
                inner = dims | frozenset(f.dim for f in op.attrs["domain"].space.factors)
            for r in op.regions:
                visit(r.ops, inner)

    visit(prog.body.ops, frozenset())
    out: set[str] = set()
    derived: set[str] = set()
    for op in prog.walk():
        if op.name != "mma":
            continue
        at, bt, ct = (o.type for o in op.operands)
        fb = set(mma_roles(at, bt, ct)["free_b"])
        res = op.results[0]
        seen, todo = {res.name}, [res.name]
        while todo:
            v = todo.pop()
            if fb & inside.get(v, set()):
                out.add(res.name)
                derived.update(seen)
            for u in users.get(v, []):
                if (len(u.results) == 1 and not u.regions
                        and set(getattr(u.results[0].type, "dims", ())) == set(res.type.dims)
                        and u.results[0].name not in seen):
                    seen.add(u.results[0].name)
                    todo.append(u.results[0].name)
    # values computed elementwise from a row-derived one, and the products they feed
    todo = list(derived)
    grown = set(derived)
    while todo:
        v = todo.pop()
        for u in users.get(v, []):
            if u.name == "mma" and u.operands[0].name == v:
                out.add(u.results[0].name)
            elif (len(u.results) == 1 and not u.regions and u.results[0].name not in grown
                  and set(getattr(u.results[0].type, "dims", ())) == set(next(
                      o for o in u.operands if o.name == v).type.dims)):
                grown.add(u.results[0].name)
                todo.append(u.results[0].name)
    return out, derived


def _b_copies(prog: TileProgram, sched: Schedule) -> dict[tuple[Dim, ...], tuple[Any, int]]:
    """How the CPU packs the copy of every ``mma``'s ``b`` operand that has
    a free dim, per dims of the operand (the first ``mma`` met decides):
    ``(order, panel)``. The micro-kernel (``mma.contract``) keeps its
    accumulators in vector registers along the last free dim of ``b`` in the
    accumulator's order, ``panel`` elements at a time (its column block: the
    register block's vectors times the accumulator type's lanes). ``order``
    is the storage order (``BufH.order``) with that dim moved last, None when
    it is last already; the copy is stored in column panels of ``panel``
    elements (``BufH.panel``), so that the micro-kernel reads one panel's
    rows from one contiguous stretch whatever the tile's width."""
    from ..semantics.ops.values import mma_roles
    from .mma import block_of, lanes

    out: dict[tuple[Dim, ...], tuple[Any, int]] = {}
    for op in prog.walk():
        if op.name != "mma":
            continue
        at, bt, ct = (o.type for o in op.operands)
        fb = mma_roles(at, bt, ct)["free_b"]
        if not fb or bt.dims in out:
            continue
        col = bt.dims.index(fb[-1])
        order = None if col == bt.rank - 1 else \
            tuple(i for i in range(bt.rank) if i != col) + (col,)
        width = block_of(sched, op.loc)[1] * lanes(ct.dtype, sched.vector_bits or 128)
        out[bt.dims] = (order, width)
    return out


class Lowerer:
    """State of one lowering (see the module docstring)."""

    def __init__(self, prog: TileProgram, schedule: Schedule):
        self.prog = prog
        self.sched = schedule
        self.target = schedule.target
        #: the target's device profile (its registry row's, tilenest.targets)
        self.profile = target_row(schedule.target).profile
        self.plan = storage_plan(prog, schedule)
        self.env: dict[str, Any] = {}
        self.ivars: dict[str, E.Expr] = {}
        self.locals: list[L.Buffer] = []
        self.errors: list[L.ErrorSite] = []
        self.sinks: list[list[L.Stmt]] = [[]]
        self.facts = Facts()
        self.count = 0
        self.expr_mode = 0
        self.depth = 0
        self.def_depth: dict[str, int] = {}
        self.reassoc: set[int] = set()
        self.put_into: dict[int, Any] = {}  # put op id -> result storage of a parallel join
        self.frozen: set[str] = set()  # values that must not be overwritten in place
        self.pending: list[L.Stmt] = []
        self.uses: dict[str, int] = {}
        for op in prog.walk():
            for o in op.operands:
                self.uses[o.name] = self.uses.get(o.name, 0) + 1
        self.params: list[L.Param] = []
        self.globals: list[L.Buffer] = []
        #: values read only as ``mma`` operands (their copies may be padded)
        self.mma_only = _mma_only(prog)
        #: mma results whose rows are reduced, and the values computed from
        #: them on the way (:func:`_row_reduced`)
        self.row_reduced, self.row_derived = _row_reduced(prog)
        #: the storage order and panel width of the local copies of ``mma``
        #: ``b`` operands (CPU)
        self.b_copies = {} if schedule.block_threads else _b_copies(prog, schedule)
        #: mma op id -> the loop tile it accumulates into, whose fill and
        #: store it may fold into its micro-kernels (``accumulators.py``)
        self.accums = {} if schedule.block_threads else accumulations(prog)
        #: loop op id -> ``(first, last, none)``: the predicates of its first
        #: and last step and of its having no step, while its body is
        #: lowered (forward, unchunked loops of one variable)
        self.steps: dict[int, tuple[E.Pred, E.Pred, E.Pred]] = {}
        #: the fills folded: ``(loop id, position)``
        self.folded: set[tuple[int, int]] = set()
        #: store op id -> the condition under which it still runs (its loop
        #: has no step), for stores folded into the loop's last step
        self.folded_stores: dict[int, E.Pred] = {}
        #: reduce op id -> ``(lo, hi)``: the part of the domain's points, in
        #: lexicographic order, a program of a partials phase runs (``phases.py``)
        self.chunks: dict[int, tuple[E.Expr, E.Expr]] = {}
        #: op ids lowered by a phase's own function instead of their rule (the
        #: combine of a reduce split over programs, ``phases.py``)
        self.instead: dict[int, Rule] = {}
        #: reduce op id -> the fixed tree a lowering decision committed it to
        self.trees: dict[int, Any] = {}
        #: root value -> the scratch buffer it crosses a phase boundary in
        #: (``phases.py``); materialized at the root, it is stored there, not
        #: in a local
        self.kept: dict[str, Any] = {}

    # -- statements ---------------------------------------------------------
    def emit(self, *stmts: L.Stmt) -> None:
        """Append statements (after any checks the expressions they use raised)."""
        if self.pending:
            self.sinks[-1].extend(self.pending)
            self.pending = []
        self.sinks[-1].extend(stmts)

    @contextlib.contextmanager
    def collect(self) -> Iterator[list[L.Stmt]]:
        """Statements emitted inside the ``with`` go to the yielded list."""
        out: list[L.Stmt] = []
        self.sinks.append(out)
        try:
            yield out
        finally:
            if self.pending:
                out.extend(self.pending)
                self.pending = []
            self.sinks.pop()

    def fresh(self, base: str, dtype: D.DType) -> L.LVar:
        self.count += 1
        return L.LVar(f"{base}.{self.count}", dtype)

    def local(self, base: str, dtype: D.DType, extents: tuple[E.Expr, ...],
              layout: L.Swizzle128 | None = None) -> L.Buffer:
        """A per-program local buffer holding a dense tile of ``extents``
        (``layout``: its physical arrangement, ``Buffer.layout``)."""
        size: E.Expr = E.Const(1)
        for x in extents:
            size = size * x
        if any(isinstance(lf, (E.Var, E.Val)) for lf in E.leaves(size)):
            raise NotAvailableError(
                f"a tile of extent {E.to_str(size)} varies inside one program; the llvm target "
                "needs tile extents fixed per call", None,
                "give tiles a fixed extent and mask the ragged part")
        self.count += 1
        b = L.Buffer(f"%{base}.{self.count}", dtype, "local", size, layout=layout)
        self.locals.append(b)
        return b

    def error(self, kind: str, message: str, site: Any) -> int:
        code = len(self.errors) + 1
        self.errors.append(L.ErrorSite(code, kind, message, site))
        return code

    def lazy_error(self, kind: str, message: str, site: Any) -> Callable[[], int]:
        """An error code allocated only when first needed (a check is emitted)."""
        box: list[int] = []

        def get() -> int:
            if not box:
                box.append(self.error(kind, message, site))
            return box[0]

        return get

    def check(self, cond: E.Pred, code: int) -> None:
        """Record a check of ``cond`` to be emitted before the next statement."""
        if cond != E.TRUE:
            self.pending.append(L.Check(L.IPred(cond), code))

    # -- values and indices -------------------------------------------------
    def ix(self, x: Any) -> Any:
        """A TileIR index expression/predicate in loop-IR terms: region
        variables replaced by their loop expressions, scalar values by locals."""
        m: dict[E.Expr, E.Expr] = {}
        for lf in E.leaves(x):
            if isinstance(lf, E.Var) and lf.name in self.ivars:
                m[lf] = self.ivars[lf.name]
            elif isinstance(lf, E.Val):
                e = self.index_value(self.env[lf.name])
                m[lf] = e if e is not None else E.Val(self.scalar_var(lf.name).name)
        return E.subst(x, m) if m else x

    def index_value(self, h: Handle) -> E.Expr | None:
        """The index expression that the integer scalar ``h`` equals (an
        ``index`` op, or the least or greatest of such, not yet evaluated
        into a local), so indices and trip counts built from it stay index
        arithmetic the proofs see through; None for a data value. Asking
        emits nothing: what evaluating ``h`` would emit or check is dropped
        (an index expression needs neither)."""
        if not (isinstance(h, LazyH) and h.rank == 0 and h.dtype == L.INDEX and not h.reads):
            return None
        pending = list(self.pending)
        with self.collect():
            x = h.at(self, {})
        self.pending = pending
        return x.e if isinstance(x, L.IExpr) else None

    def scalar_var(self, name: str) -> L.LVar:
        """The local holding integer scalar value ``name`` (materialized if lazy)."""
        h = self.env[name]
        if isinstance(h, VarH):
            return h.var
        if self.expr_mode:
            raise NotAvailableError(f"data-dependent index %{name} inside an inlined region",
                                    None, "materialize the index first")
        v = self.fresh(name, h.dtype)
        self.emit(L.Assign(v, h.at(self, {})))
        self.env[name] = VarH(v)
        return v

    def extents(self, t: TileType) -> tuple[E.Expr, ...]:
        return tuple(self.ix(x) for x in t.extents)

    def handle(self, v: Value) -> Any:
        try:
            return self.env[v.name]
        except KeyError:
            raise TilenestError(f"internal: %{v.name} used before it was lowered") from None

    def define(self, v: Value, h: Any) -> None:
        """Bind ``v`` to ``h``, materializing it when the storage plan says so
        (a scalar that is an index expression stays one: :meth:`index_value`)."""
        if (isinstance(h, LazyH) and not self.expr_mode
                and self.plan.get(v.name, "inline") == "materialize"
                and self.index_value(h) is None):
            h = self.materialize(h, v.name)
        self.env[v.name] = h
        self.def_depth[v.name] = self.depth

    # -- loop nests ---------------------------------------------------------
    def nest(self, dims: tuple[Dim, ...], extents: tuple[E.Expr, ...],
             body: Callable[[Index], None], guards: Callable[[Index], list[E.Pred]] | None = None,
             exclusive: bool = False, reverse: bool = False, kind: str = "vector") -> None:
        """Emit loops over the box ``extents`` (row-major, dims in order), calling
        ``body(q)`` to emit one element's statements.

        ``guards(q)`` lists conjuncts worth range-restricting the innermost loop
        by: inside the main range they are known facts (so implied guards
        vanish); the rest of the range runs the general body. ``exclusive``
        says the body has no effect where any of them is false (then the rest
        of the range is not emitted)."""
        if not dims:
            body({})
            return
        lvs = [self.fresh("i", L.INDEX) for _ in dims]
        q = {d: E.Var(v.name) for d, v in zip(dims, lvs, strict=True)}
        if (self.sched.block_threads and kind == "vector" and not reverse and len(dims) > 1
                and all(isinstance(e, E.Const) for e in extents[1:])):
            # SIMT: one perfect vector nest over the whole box, guards kept per
            # element, so that one distributed loop covers the box (its linear
            # index splits into the dims by constant divisors)
            self._flat(0, lvs, extents, q, body)
            return
        self._nest(0, lvs, dims, extents, q, body, guards, exclusive, reverse, kind)

    def _flat(self, k: int, lvs: list, extents: tuple, q: Index, body: Callable) -> None:
        if k == len(lvs):
            body(q)
            return
        self._loop(lvs[k], E.Const(0), extents[k],
                   lambda: self._flat(k + 1, lvs, extents, q, body), "vector", False)

    def _range_facts(self, v: L.LVar, lo: E.Expr, hi: E.Expr, ext: E.Expr) -> int:
        x = E.Var(v.name)
        return self.facts.push([x.ge(lo), x.lt(hi), x.ge(0), x.lt(ext)])

    def _loop(self, v: L.LVar, lo: E.Expr, hi: E.Expr, inner: Callable[[], None],
              kind: str, reverse: bool, extra: list[E.Pred] = (), ext: E.Expr | None = None
              ) -> None:
        mark = self._range_facts(v, lo, hi, hi if ext is None else ext)
        self.facts.push(list(extra))
        with self.collect() as b:
            inner()
        self.facts.pop(mark)
        if b:
            self.emit(L.For(v, lo, hi, tuple(b), kind, reverse))

    def _nest(self, k: int, lvs: list, dims: tuple, extents: tuple, q: Index,
              body: Callable, guards: Any, exclusive: bool, reverse: bool, kind: str) -> None:
        v, ext = lvs[k], extents[k]
        last = k == len(dims) - 1
        if not last:
            self._loop(v, E.Const(0), ext, lambda: self._nest(
                k + 1, lvs, dims, extents, q, body, guards, exclusive, reverse, kind),
                "serial", reverse)
            return
        gs = [] if guards is None or reverse else [g for g in guards(q)]
        lo, hi, used, outer = split_range(gs, v.name, ext, set())
        # a guard that holds over the loop's whole range needs no split
        mark = self._range_facts(v, E.Const(0), ext, ext)
        used = [u for u in used if not self.facts.implied(u)]
        self.facts.pop(mark)
        outer = [o for o in outer if not self.facts.implied(o)]
        run = lambda: body(q)  # noqa: E731
        if not used and not outer:
            self._loop(v, E.Const(0), ext, run, kind, reverse)
            return
        if not used:
            lo, hi = E.Const(0), ext
        with self.collect() as main:
            zero = lo == E.Const(0)
            if used and not zero and not exclusive:
                self._loop(v, E.Const(0), E.minimum(lo, ext), run, kind, False, ext=ext)
            self._loop(v, lo, hi, run, kind, False, used + outer, ext=ext)
            if used and hi != ext and not exclusive:
                self._loop(v, E.maximum(hi, lo), ext, run, kind, False, ext=ext)
        if not outer:
            self.emit(*main)
            return
        with self.collect() as other:
            if not exclusive:
                self._loop(v, E.Const(0), ext, run, kind, False)
        self.emit(L.If(L.IPred(E.pand(*outer)), tuple(main), tuple(other)))

    def guard_of(self, preds: list[E.Pred]) -> L.Expr | None:
        """The residual guard of ``preds`` under the current facts (None = true)."""
        r = residual(preds, self.facts)
        return None if r == E.TRUE else L.IPred(r)

    # -- storage ------------------------------------------------------------
    def materialize(self, h: Handle, base: str) -> Handle:
        """Evaluate ``h`` into a scalar local (rank 0) or a local buffer."""
        if isinstance(h, (VarH, BufH)):
            return h
        kept = self.kept.get(base) if self.depth == 0 and not self.expr_mode else None
        if isinstance(kept, BufH):  # a root value crossing a phase boundary: its
            del self.kept[base]  # snapshot goes straight to its scratch buffer, once
            self.store_into(h, kept)
            return kept
        if h.rank == 0:
            v = self.fresh(base, h.dtype)
            self.emit(L.Assign(v, h.at(self, {})))
            return VarH(v)
        pitch = self.operand_pitch(h, base)
        ext, padded = h.extents, None
        if pitch is not None:
            # dims of extent 1 add nothing to an offset: stored first, they
            # leave the tile's column dim last, the one the pitch pads
            padded = _units_first(h.extents)
            col = (padded or range(h.rank))[-1]
            ext = h.extents[:col] + (pitch,) + h.extents[col + 1:]
        buf = self.local(base, h.dtype, ext, self.operand_layout(h.dtype, h.extents, base))
        zero = _zero_from(h) if base in self.mma_only else None
        out = BufH(buf, h.dims, h.extents, pitch, padded, zero_from=zero)
        packing = self.b_copies.get(h.dims) if base in self.mma_only else None
        if packing is not None and pitch is None:
            # the copy a CPU micro-kernel reads as ``b``: its vector dim
            # contiguous (a transposed operand is transposed as it is
            # copied), in column panels when the extents are constants
            order, width = packing
            const = all(isinstance(x, E.Const) for x in h.extents)
            out = BufH(buf, h.dims, h.extents, None, order, zero_from=zero,
                       panel=width if const else None)
            if order is not None and const:
                # first as stored (contiguous reads, the bounds handled
                # there), then the transposing copy between two local tiles
                # of constant extents, which the CPU code generator runs as
                # blocks transposed in registers (backends/llvm/transpose.py)
                src = BufH(self.local(f"{base}.rows", h.dtype, h.extents), h.dims, h.extents)
                self.store_into(h, src)
                h = src
        with self.collect() as copy:
            self.store_into(h, out)
        self.emit(*self.bulk_copy(h, out, copy))
        return out

    def bulk_copy(self, h: Handle, out: BufH, copy: list) -> list:
        """``copy`` (the loop nest storing ``h`` into the swizzled tile
        ``out``) with the permission to run it as bulk tensor copies
        (:class:`~tilenest.lowering.loopir.BulkCopy`) when the target has a
        tensor memory accelerator, the schedule's ``tma`` is on, and ``h``
        reads a box of a dense tensor: the tile's rows along one tensor dim,
        its columns along the last, unit steps, ``+0`` outside the tensor
        (``LazyH.box``); the tile's dims of extent 1 are single coordinates.
        Anything else keeps the element copies."""
        box = getattr(h, "box", None)
        lay = out.buf.layout
        # the tile's two dims of extent above 1 (the layout's rows and columns)
        sides = [d for d, x in zip(h.dims, h.extents, strict=True) if x != E.Const(1)]
        if (box is None or lay is None or len(copy) != 1 or not isinstance(copy[0], L.For)
                or not self.sched.tma or "tma" not in self.profile.async_copy
                or len(sides) != 2 or not 2 <= len(box.tensor.shape) <= 5):
            return copy
        rows_d, cols_d = sides
        zero = {d: E.Const(0) for d in h.dims}
        origin = box.coords(zero)
        i, j = E.Var("%bulk.i"), E.Var("%bulk.j")
        moved = [E.add(x, E.mul(-1, o))
                 for x, o in zip(box.coords({**zero, rows_d: i, cols_d: j}), origin, strict=True)]
        axes = {x: d for d, x in enumerate(moved) if x != E.Const(0)}
        last = len(origin) - 1
        if len(axes) != 2 or axes.get(j) != last or i not in axes:
            return copy
        return [replace(copy[0], bulk=L.BulkCopy(box.tensor.buf, box.tensor.shape,
                                                  tuple(origin), axes[i], out.buf, E.Const(0)))]

    def operand_layout(self, dtype: D.DType, extents: tuple[E.Expr, ...],
                       base: str) -> L.Swizzle128 | None:
        """The swizzled arrangement of the shared copy of an ``mma`` operand
        that warpgroup tensor cores read in place (``mma_unit="wgmma"``): a
        2-d tile of ``dtype`` (16-bit or FP8) of constant ``extents``, rows a
        multiple of 8 and a whole number of 128-byte panels per row
        (:class:`~tilenest.lowering.loopir.Swizzle128`), named ``base`` among
        the values used only as operands; None otherwise."""
        if not (self.sched.block_threads and self.sched.mma_unit == "wgmma"
                and base in self.mma_only
                and (dtype.itemsize == 2 or dtype.is_fp8)
                and all(isinstance(x, E.Const) for x in extents)):
            return None
        # dims of extent 1 add nothing to a row-major index: the tile is 2-d
        sides = [x.value for x in extents if x.value != 1]
        if len(sides) != 2:
            return None
        rows, cols = sides
        if rows % 8 or cols % (128 // dtype.itemsize):
            return None
        return L.Swizzle128(rows, cols, dtype.itemsize)

    def operand_pitch(self, h: Handle, base: str) -> E.Expr | None:
        """The padded row pitch of the shared copy of an ``mma`` operand on a
        target whose tensor cores take ``mma.sync`` fragments (``cuda``; None:
        dense). Tensor-core fragments are read eight rows of
        16 bytes at a time; rows an even number of 16-byte units apart fall
        on the same shared-memory banks (an 8-way conflict at 128 bytes), so
        such rows get 16 bytes of padding (an odd number of units: the eight
        rows hit distinct banks). The rows are those of the tile's last dim of
        extent above 1 (:meth:`materialize` stores dims of extent 1 first)."""
        if not ("mma.sync" in self.profile.tensor_cores and self.sched.block_threads and base in self.mma_only
                and h.rank >= 2) or \
                self.operand_layout(h.dtype, h.extents, base) is not None:
            return None
        cols = [x for x in h.extents if x != E.Const(1)]
        if not cols or not isinstance(cols[-1], E.Const):
            return None
        size = max(1, h.dtype.itemsize)
        row = cols[-1].value * size
        if row % 16 or (row // 16) % 2:
            return None
        return E.Const(cols[-1].value + 16 // size)

    def store_into(self, h: Handle, dst: Handle) -> None:
        """``dst[q] = h[q]`` for every q (``dst`` a VarH or BufH over h's dims)."""
        if isinstance(dst, VarH):
            self.emit(L.Assign(dst.var, h.at(self, {})))
            return

        def body(q: Index) -> None:
            self.emit(L.Store(dst.buf, L.IExpr(dst.offset(q, self.facts)), h.at(self, q)))

        # in storage order: the innermost loop stores consecutive elements
        order = dst.order or range(len(dst.dims))
        dims = dst.storage_dims()
        extents = tuple(dst.extents[i] for i in order)
        if dst.panel is None:
            self.nest(dims, extents, body, h.guards)
            return
        # a panel's columns innermost; the panels inside the lines (the
        # source's rows read in order), or, for a copy that transposes (its
        # source runs along the lines), around them, so that each panel is
        # one transposing copy (``backends/llvm/transpose.py``)
        col, width = dims[-1], dst.panel
        full, tail = divmod(extents[-1].value, width)
        hi = Dim.fresh("panel")
        outer = dst.order is not None and dst.order[-1] != len(dims) - 1

        def at(q: Index, j: E.Expr) -> Index:
            return {d: x for d, x in q.items() if d != hi} | {col: E.add(E.mul(j, width), q[col])}

        def panels(lines: tuple, n: int, w: int, j: Callable[[Index], E.Expr]) -> None:
            order = ((hi,) + lines if outer else lines + (hi,)) if n > 1 else lines
            ext = dict(zip(lines, extents[:-1], strict=True)) | {hi: E.Const(n)}
            self.nest(order + (col,), tuple(ext[d] for d in order) + (E.Const(w),),
                      lambda q: body(at(q, j(q))), lambda q: h.guards(at(q, j(q))))

        if full:
            panels(dims[:-1], full, width, lambda q: q[hi] if full > 1 else E.Const(0))
        if tail:
            panels(dims[:-1], 1, tail, lambda q: E.Const(full))

    def new_storage(self, t: TileType, base: str) -> Handle:
        """Storage for a value of type ``t`` named ``base`` (a loop's carried
        value, an ``if``'s result): a variable, or a program buffer, in the
        swizzled layout of an ``mma`` operand when ``base`` is one only."""
        if t.rank == 0:
            return VarH(self.fresh(base, t.dtype))
        ext = self.extents(t)
        return BufH(self.local(base, t.dtype, ext, self.operand_layout(t.dtype, ext, base)),
                    t.dims, ext)

    # -- blocks -------------------------------------------------------------
    def lower_block(self, b: Block, args: list[Any]) -> list[Any]:
        """Lower the ops of ``b`` with its arguments bound to ``args``; returns
        the handles of the yielded values."""
        for a, h in zip(b.args, args, strict=True):
            self.env[a.name] = h
            self.def_depth[a.name] = self.depth
        for op in b.ops:
            if op.name == "yield":
                return [self.env[o.name] for o in op.operands]
            self.lower_op(op)
        return []

    def lower_op(self, op: Operation) -> None:
        if self.expr_mode and op.name not in LAZY_OPS:
            raise unsupported(op, self.target, "inside an inlined scalar region")
        fn = self.instead.get(op.oid) or RULES.get(op.name)
        if fn is None:
            raise unsupported(op, self.target)
        try:
            fn(self, op)
        except TilenestError as e:
            raise e.with_site(op.loc) from None

    # -- domains ------------------------------------------------------------
    def domain_loops(self, op: Operation, inner: Callable[[], None], reverse: bool = False,
                     kind: str = "serial", guards: Callable[[], list[E.Pred]] | None = None
                     ) -> None:
        """Loops over ``op``'s domain in lexicographic (or reversed) order with
        the region variables bound; the domain predicate guards ``inner``.
        Where ``chunks`` holds ``op``, only the part ``[lo, hi)`` of the
        domain's points in lexicographic order runs: one loop over that range
        of the flattened index, each coordinate recovered by division.

        ``guards()`` (called with the region variables bound to the loop
        variables) lists conjuncts worth range-restricting the innermost loop
        by, as :meth:`nest` does: its range is cut into three consecutive
        parts, in order, and inside the middle one they are known facts."""
        dom = op.attrs["domain"]
        vars_ = op.attrs["vars"]
        exts = tuple(self.ix(x) for x in dom.space.extents)
        lvs = [self.fresh(v, L.INDEX) for v in vars_]
        flat = op.oid in self.chunks and len(lvs) > 1
        if flat:
            lvs = [self.fresh("f", L.INDEX)]
        coords = (L.delinearize(E.Var(lvs[0].name), exts) if flat
                  else [E.Var(lv.name) for lv in lvs])

        @contextlib.contextmanager
        def bound() -> Iterator[None]:
            saved = {v: self.ivars.get(v) for v in vars_}
            for v, x in zip(vars_, coords, strict=True):
                self.ivars[v] = x
            try:
                yield
            finally:
                for v, old in saved.items():
                    if old is None:
                        self.ivars.pop(v, None)
                    else:
                        self.ivars[v] = old

        def point() -> None:
            # a flattened coordinate lies in its axis whenever the loop runs
            # (the flat index is below the product of the extents)
            box = [p for x, n in zip(coords, exts, strict=True) for p in (x.ge(0), x.lt(n))]
            with bound():
                mark = self.facts.push(box if flat else [])
                pred = self.ix(dom.pred)
                if pred == E.TRUE or self.facts.implied(pred):
                    inner()
                else:
                    self.facts.push([pred])
                    with self.collect() as b:
                        inner()
                    if b:
                        self.emit(L.If(L.IPred(pred), tuple(b)))
                self.facts.pop(mark)

        def level(k: int) -> None:
            if k == len(lvs):
                point()
                return
            last = k == len(lvs) - 1
            ext = _product(exts) if flat else exts[k]
            lo, hi = E.Const(0), ext
            if k == 0 and op.oid in self.chunks:
                lo, hi = self.chunks[op.oid]
                lo, hi = E.minimum(lo, ext), E.minimum(hi, ext)
            if not last:
                self._loop(lvs[k], lo, hi, lambda: level(k + 1), "serial", reverse, ext=ext)
                return
            used: list[E.Pred] = []
            if guards is not None and not reverse:
                with bound():
                    gs = guards()
                g0, g1, used, _ = split_range(gs, lvs[k].name, ext, set())
                mark = self._range_facts(lvs[k], lo, hi, ext)
                used = [u for u in used if not self.facts.implied(u)]
                self.facts.pop(mark)
            if not used:
                self._loop(lvs[k], lo, hi, point, kind, reverse, ext=ext)
                return
            # [lo, m0) general, [m0, m1) where ``used`` holds, [m1, hi) general
            m0 = E.minimum(E.maximum(g0, lo), hi)
            m1 = E.maximum(E.minimum(g1, hi), m0)
            self._loop(lvs[k], lo, m0, point, kind, False, ext=ext)
            self._loop(lvs[k], m0, m1, point, kind, False, used, ext=ext)
            self._loop(lvs[k], m1, hi, point, kind, False, ext=ext)

        self.depth += 1
        try:
            level(0)
        finally:
            self.depth -= 1


def _product(xs: tuple[E.Expr, ...]) -> E.Expr:
    out: E.Expr = E.Const(1)
    for x in xs:
        out = E.mul(out, x)
    return out


# ---------------------------------------------------------------------------
# the whole program


def _effect_free(op: Operation, stored: set[str]) -> bool:
    """Whether replaying ``op`` in every program is invisible (no effects, and
    reads only of tensors nothing stores to)."""
    if op.name in ("tensor.store", "memory.alloc", "memory.store", "memory.load", "parallel"):
        return False
    if op.name == "tensor.load" and op.operands[0].name in stored:
        return False
    return all(_effect_free(o, stored) for r in op.regions for o in r.ops if o.name != "yield")


def refuse_fp8(program: TileProgram, target: str) -> None:
    """On a target whose profile does not compile the FP8 formats (V-24), a
    program holding an FP8 value is refused, at the first argument or op
    that does, before anything is lowered (the interpreter evaluates it)."""
    from ..targets import profile

    if profile(target).fp8:
        return
    for name in (d.name for d in D.FP8):
        use = program.first_use_of(name)
        if use is not None:
            what, detail, site = use
            raise NotAvailableError(
                f"{what} {'(' + detail + ') ' if detail else ''}holds {name} values, which the "
                f"'{target}' target does not compile yet (FP8 runs on the reference "
                "interpreter and the llvm and cuda targets)", site,
                "compile for llvm or cuda, call the kernel or tn.reference(...), or cast to "
                "f16/bf16/f32 at the kernel's boundary")


def lower(program: TileProgram, schedule: Schedule | None = None) -> L.Kernel:
    """Lower ``program`` to a loop-IR kernel under ``schedule`` (default: the
    automatic schedule for llvm)."""
    from . import memory, reductions, regions, values  # noqa: F401  (register rules)
    from .phases import parallel_phases
    from .schedule import apply_transforms, stride_symbol

    schedule = schedule or default_schedule(program)
    refuse_fp8(program, schedule.target)
    program, _obligations = apply_transforms(program, schedule)
    lw = Lowerer(program, schedule)
    syms = list(program.syms)
    for i, a in enumerate(program.args):
        t = a.type
        if isinstance(t, TensorType):
            buf = L.Buffer(a.name, t.dtype, "global", E.Const(0), i)
            lw.params.append(L.Param(a.name, "tensor", t.dtype, tuple(t.shape)))
            lw.globals.append(buf)
            strides = None
            if a.name in schedule.strided and len(t.shape) > 1:
                outer = [stride_symbol(a.name, d) for d in range(len(t.shape) - 1)]
                syms += outer
                strides = tuple(E.Sym(n) for n in outer) + (E.Const(1),)
            lw.env[a.name] = TensorH(buf, tuple(t.shape), t.dims, strides)
        else:
            assert isinstance(t, TileType)
            buf = L.Buffer(a.name, t.dtype, "scalar", E.Const(1), i)
            lw.params.append(L.Param(a.name, "scalar", t.dtype, ()))
            lw.globals.append(buf)
            ld = L.Load(buf, L.IExpr(E.Const(0)))
            lw.env[a.name] = LazyH(t.dtype, (), (), lambda lw_, q, ld=ld: ld, cheap=True)
    stored = schedule.written(program)
    root = [op for op in program.body.ops if op.name != "yield"]
    phases: list[L.Phase] = []
    replayable = all(op.name == "parallel" and not op.operands or _effect_free(op, stored)
                     for op in root)
    if replayable and any(op.name == "parallel" for op in root):
        prefix: list[Operation] = []
        for op in root:
            if op.name != "parallel":
                prefix.append(op)
                continue
            phases.extend(parallel_phases(lw, op, prefix, len(phases)))
    else:
        from .phases import lower_phases

        split = lower_phases(lw, root, stored)
        if split is not None:
            phases = split
        else:
            pid = lw.fresh("pid", L.INDEX)
            with lw.collect() as body:
                for op in root:
                    lw.lower_op(op)
            phases.append(L.Phase(f"{program.name}_0", (E.Const(1),), pid, tuple(body), False))
    return L.Kernel(program.name, tuple(lw.params), tuple(syms), tuple(lw.locals),
                    tuple(phases), tuple(lw.errors), tuple(lw.globals),
                    tuple(sorted(lw.trees.items())))


def offsets_of(h: TensorH, coords: list[E.Expr]) -> E.Expr:
    return linear(h.shape, coords)


_ = conjuncts
