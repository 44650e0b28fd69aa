"""GPU resource obligations of a loop-IR kernel in SIMT form, with the launch
preconditions a runtime checks per call. The limits are a target's device
profile (``tilenest.targets``, :func:`resource_obligations`).

* ``shared.capacity``: the ``shared`` buffers of one block fit::

      forall syms >= 0:  sum_b roundup(size_b * itemsize_b, align)  <=  limit

* ``binding.limit`` (threads): per phase, the threads per block ``W`` (the
  widest thread loop) satisfy ``1 <= W <= max_threads and W % lanes == 0``
  (``lanes``: the warp or simdgroup width);
* ``binding.limit`` (grid): per phase, ``prod(extents) <= max_grid`` programs
  for all symbol values;
* ``index.width``: every index value the generated code computes (each
  index expression and every subexpression of it) fits a 32-bit ``int``
  with ``2**20`` to spare (:data:`INDEX_LIMIT`), bounded from the loop
  ranges (:func:`index_bounds`): the code may then do its index arithmetic
  in 32 bits; a call whose sizes break it runs a 64-bit variant;
* ``binding.registers``: per phase, with ``regs`` the registers per thread
  that ``ptxas`` reports for the phase's entry, ``roundup(regs, unit) * W <=
  per_block`` (``unit = 1`` by default; the hardware allocates per warp in units
  of 256 registers, i.e. ``unit = 8`` per thread).

A claim over symbolic sizes is often true only for some sizes (a row buffer
``f32[C]`` fits only while ``4 * C <= limit``). Such an obligation is then
*refuted*, with symbol values that break it, and still usable: every
obligation built here carries in ``witness`` a :class:`Precondition`, the
predicate over the kernel's symbols under which its claim holds. A compiler
that accepts the kernel anyway passes :func:`launch_precondition` of the
obligations to the runtime, which evaluates it on each call's sizes
(:meth:`Precondition.check`) and refuses a launch that violates it. A proved
obligation's precondition is ``true``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from .. import targets as T
from ..errors import TilenestError
from ..semantics import expr as E
from . import formula as Fm
from .obligation import PROVED, REFUTED, Obligation, VarInfo

SHARED = "shared.capacity"
LIMIT = "binding.limit"
REGISTERS = "binding.registers"
INDEX = "index.width"

#: the default limits: the ``cuda`` row's device profile (``tilenest.targets``;
#: :func:`resource_obligations` takes any target's): shared memory per block
#: (sm_90's opt-in dynamic shared memory), threads per block, blocks per
#: launch, registers per block
SHARED_LIMIT = T.CUDA.profile.shared_bytes
MAX_THREADS = T.CUDA.profile.max_threads
MAX_GRID = T.CUDA.profile.max_grid
REGISTERS_PER_BLOCK = T.CUDA.profile.registers_per_block
#: the largest index magnitude 32-bit index code may meet: ``2**31 - 1`` less
#: ``2**20`` for the small offsets code generation adds to bounded expressions
#: (vector widths, fragment offsets within shared memory)
INDEX_LIMIT = 2**31 - 2**20
WARP = T.CUDA.profile.lanes


class LaunchError(TilenestError):
    """A call's sizes violate a kernel's launch precondition."""

    kind = "launch error"


@dataclass(frozen=True)
class Precondition:
    """``pred`` over the kernel symbols: the launch is within the resources
    exactly when it holds; ``what`` says which resource (for the error).
    A conjunction (:func:`launch_precondition`) keeps its conjuncts in
    ``parts``, so a failed check names the resources that fail, not all."""

    pred: E.Pred
    what: str
    parts: tuple["Precondition", ...] = ()

    @property
    def trivial(self) -> bool:
        return self.pred == E.TRUE

    def holds(self, syms: Mapping[str, int]) -> bool:
        """Whether the precondition holds for the symbol values ``syms``."""
        env = {E.Sym(k): int(v) for k, v in syms.items()}
        return bool(E.evaluate(self.pred, env))

    def check(self, syms: Mapping[str, int]) -> None:
        """Raise :class:`LaunchError` when ``syms`` violate it."""
        if not self.holds(syms):
            vals = ", ".join(f"{k} = {v}" for k, v in sorted(syms.items()))
            failing = [p for p in self.parts if not p.holds(syms)] or [self]
            why = "; ".join(f"{p.what}: {E.pred_to_str(p.pred)}" for p in failing)
            raise LaunchError(f"{why} fails for {vals}",
                              hint="use smaller sizes, or a schedule with smaller blocks/tiles")

    def __str__(self) -> str:
        return E.pred_to_str(self.pred)


def launch_precondition(obs: Iterable[Obligation]) -> Precondition:
    """The conjunction of the preconditions of the (discharged) resource
    obligations ``obs`` that are not proved: what a runtime must check per call."""
    parts = [pc for o in obs if o.status != PROVED
             and (pc := precondition_of(o)) is not None and not pc.trivial]
    return Precondition(E.pand(*(p.pred for p in parts)) if parts else E.TRUE,
                        "; ".join(p.what for p in parts) or "no limit", tuple(parts))


def precondition_of(o: Obligation) -> Precondition | None:
    """The launch precondition a resource obligation carries (None: none)."""
    pc = o.witness.get("precondition") if isinstance(o.witness, dict) else None
    return pc if isinstance(pc, Precondition) else None


def never_launchable(obs: Iterable[Obligation]) -> list[Obligation]:
    """The discharged resource obligations that no sizes satisfy: refuted
    with a precondition that is ``false`` outright (a block's shared memory
    or threads over the limit whatever the sizes). A kernel with
    one of them can never launch, so a compiler refuses it rather than
    leave the failure to every call."""
    return [o for o in obs if o.status == REFUTED
            and (pc := precondition_of(o)) is not None and pc.pred == E.FALSE]


def _symbolic(kind: str, title: str, bound: E.Pred, what: str, explain: Any = None,
              extra: dict | None = None) -> Obligation:
    """``forall syms >= 0: bound``, with ``bound`` as the launch precondition."""
    syms = sorted(n.name for n in E.leaves(bound) if isinstance(n, E.Sym))
    assume = Fm.conj(*(Fm.atom(E.Sym(s).ge(0)) for s in syms))
    claim = Fm.Claim((), Fm.TRUE, Fm.atom(bound), assume)
    return Obligation(kind, title, (), claim, explain=explain,
                      witness={"precondition": Precondition(bound, what), **(extra or {})})


def _roundup(x: E.Expr, align: int) -> E.Expr:
    return E.mul(E.floordiv(E.add(x, align - 1), align), align) if align > 1 else x


def shared_bytes(kernel: Any) -> E.Expr:
    """Bytes of ``shared`` memory of one block of the kernel's largest phase,
    as the code generator allocates them (``loopir.shared_arrangement`` per
    phase: each buffer rounded up to its alignment, plus the slack that
    aligns swizzled buffers)."""
    from ..lowering import loopir as L

    return L.shared_bytes(kernel)


def shared_capacity(kernel: Any, limit_bytes: int = SHARED_LIMIT) -> Obligation:
    """``shared.capacity``: the shared buffers of every phase's block fit in
    ``limit_bytes`` for all symbol values (module docstring); the
    precondition is ``shared_bytes(kernel) <= limit_bytes``, the largest
    phase's bytes."""
    from ..lowering import loopir as L

    total = shared_bytes(kernel)
    bufs = [b for b in kernel.locals if b.space == "shared"]
    align = L.SHARED_ALIGN

    def explain(pt: dict) -> list[str]:
        env = {E.Sym(k): v for k, v in pt.items()}
        parts = ", ".join(f"{b.name}: {E.evaluate(_roundup(E.mul(b.size, b.dtype.itemsize), align), env)}"
                          for b in bufs)
        return [(f"{E.evaluate(total, env)} bytes of shared memory per block exceed "
                f"{limit_bytes} ({parts})")]

    return _symbolic(SHARED, f"{kernel.name}: shared memory per block ({E.to_str(total)} "
                     f"bytes) <= {limit_bytes}", total.le(limit_bytes),
                     f"{kernel.name}: shared memory per block", explain, {"bytes": total})


def _threads_of(ph: Any) -> list[E.Expr]:
    """The block widths phase ``ph`` asks for: each thread loop's extent, and
    for a warp-specialized ring (``loopir.Roles``) its consumers plus the
    producer warp that runs after them (``lowering.simt.block_threads``)."""
    from ..lowering import loopir as L

    return [s.hi for s in L.walk(ph.body) if isinstance(s, L.For) and s.kind == "thread"] + [
        E.Const(s.roles.consumers + s.roles.producers) for s in L.walk(ph.body)
        if isinstance(s, L.For) and s.roles is not None]


def resource_obligations(kernel: Any, profile: T.Profile) -> list[Obligation]:
    """The shared-capacity and thread/grid obligations of ``kernel`` against
    a target's device profile (undischarged): shared bytes per block, threads
    per block (a multiple of its lane width) and blocks per launch."""
    return [shared_capacity(kernel, profile.shared_bytes)] + thread_limits(
        kernel, profile.max_threads, profile.max_grid, profile.lanes)


def thread_limits(kernel: Any, max_threads: int = MAX_THREADS,
                  max_grid: int = MAX_GRID, lanes: int = WARP) -> list[Obligation]:
    """``binding.limit`` per phase: threads per block (a multiple of the lane
    width ``lanes``) and grid size (module docstring). A phase without
    thread loops (one thread per block) has no thread obligation."""
    out = []
    for ph in kernel.phases:
        ws = list(dict.fromkeys(_threads_of(ph)))
        for w in ws:
            ok = E.pand(w.ge(1), w.le(max_threads), E.mod(w, lanes).eq(0))
            out.append(_symbolic(
                LIMIT, f"{ph.name}: {E.to_str(w)} threads per block (1..{max_threads}, a "
                f"multiple of {lanes})", ok, f"{ph.name}: threads per block",
                lambda pt, w=w: [(f"{E.evaluate(w, {E.Sym(k): v for k, v in pt.items()})} "
                                 "threads per block")]))
        n: E.Expr = E.Const(1)
        for x in ph.extents:
            n = E.mul(n, x)
        out.append(_symbolic(
            LIMIT, f"{ph.name}: grid of {E.to_str(n)} blocks <= {max_grid}",
            n.le(max_grid), f"{ph.name}: grid size",
            lambda pt, n=n: [(f"{E.evaluate(n, {E.Sym(k): v for k, v in pt.items()})} blocks "
                             f"exceed {max_grid}")], {"blocks": n}))
    return out


def register_limits(kernel: Any, regs: Mapping[str, int],
                    per_block: int = REGISTERS_PER_BLOCK, unit: int = 1) -> list[Obligation]:
    """``binding.registers`` per phase: ``roundup(regs, unit) * threads <=
    per_block``. ``regs`` maps phase names (the kernel entries) to the
    registers per thread ``ptxas`` reported; a phase missing from it gives
    an error (the check needs the number)."""
    out = []
    for ph in kernel.phases:
        if ph.name not in regs:
            raise TilenestError(f"no register count for phase '{ph.name}'",
                                hint=f"pass ptxas' registers per thread for {sorted(regs)} "
                                "and every phase")
        r = int(regs[ph.name])
        ru = -(-r // unit) * unit
        ws = [w for w in _threads_of(ph) if isinstance(w, E.Const)] or [E.Const(1)]
        w = max(x.value for x in ws)
        need = ru * w
        ob = Obligation(REGISTERS, f"{ph.name}: {ru} registers x {w} threads <= {per_block}",
                        formula_text=f"{ru} * {w} <= {per_block}",
                        witness={"regs": r, "threads": w, "needed": need})

        def decide(o: Obligation, t: float, need: int = need, r: int = r, w: int = w,
                   name: str = ph.name) -> None:
            if need <= per_block:
                o.set(PROVED, "structural")
                return
            o.set(REFUTED, "structural", f"{need} registers per block exceed {per_block}",
                  {"phase": name, "registers": r, "threads": w, "needed": need})
            o.details = [(f"{name}: {r} registers per thread x {w} threads = {need} > "
                         f"{per_block}"), ("use fewer threads per block or cap registers "
                         "(__launch_bounds__ / -maxrregcount)")]
            o.checked = True

        ob.decider = decide
        out.append(ob)
    return out


# ---------------------------------------------------------------------------- index width
class IndexWidth:
    """The ``index.width`` precondition: for a call's sizes, every index value
    the code computes lies in ``[-limit, limit]``.

    ``defs`` gives each index variable's definitions: ``("range", lo, hi)``
    for a loop ``v in [lo, hi)`` (or the program id, ``[0, programs)``),
    ``("value", e)`` for an assignment. :meth:`holds` bounds every node of
    every ``root`` expression for the call's symbol values
    (:func:`tilenest.semantics.expr.interval` with a check of each
    subexpression and of each partial sum and product, in the order the code
    computes them), so intermediate values are covered too. Intervals of variables follow their definitions: the program
    id is below ``prod(extents)``, so ``pid // n`` is below ``extents[0]``
    when ``n`` is the product of the others (a bound over the symbols alone
    would lose that)."""

    def __init__(self, defs: dict[str, tuple], roots: tuple[E.Expr, ...],
                 limit: int = INDEX_LIMIT):
        self.defs, self.roots, self.limit = defs, roots, limit

    def holds(self, syms: Mapping[str, int]) -> bool:
        try:
            self.intervals(syms)
        except OverflowError:
            return False
        return True

    def intervals(self, syms: Mapping[str, int]) -> dict[E.Expr, E.Interval]:
        """Each index variable's interval (:func:`E.interval` over its
        definitions, the symbols pinned to the call's values); OverflowError
        at the first value outside the limit, or an unbounded one."""
        lim = self.limit
        ranges: dict[E.Expr, E.Interval] = {E.Sym(k): (int(v), int(v)) for k, v in syms.items()}

        def ok(iv: E.Interval) -> None:
            if iv[0] is None or iv[1] is None or iv[0] < -lim or iv[1] > lim:
                raise OverflowError(iv)

        def bound(x: E.Expr) -> E.Interval:
            for lf in E.leaves(x):
                if isinstance(lf, E.Var) and lf not in ranges:
                    var(lf)
            return E.interval(x, ranges, ok)

        def var(v: E.Var) -> None:
            lo = hi = None
            for d in self.defs[v.name]:
                if d[0] == "range":
                    a, b = bound(d[1]), bound(d[2])
                    iv = (a[0], max(a[0], b[1] - 1))
                else:
                    iv = bound(d[1])
                lo = iv[0] if lo is None else min(lo, iv[0])
                hi = iv[1] if hi is None else max(hi, iv[1])
            ranges[v] = (lo, hi)
            ok(ranges[v])

        for r in self.roots:
            bound(r)
        return ranges

    def __str__(self) -> str:
        return (f"every index value within +-{self.limit} ({len(self.roots)} index "
                "expressions, checked per call)")


def index_width(kernel: Any, roots: Iterable[E.Expr],
                limit: int | None = None) -> Obligation | str:
    """The ``index.width`` obligation of 32-bit code for ``kernel`` whose
    generated code computes the index expressions ``roots`` (module
    docstring), or the reason there is none: data-dependent indices
    (``Val``), bit operations, a variable holding a data value, or one
    defined from itself. Proved when the kernel has no symbols and the bound
    holds; otherwise its precondition (:class:`IndexWidth`) is checked for
    each call's sizes."""
    from ..lowering import loopir as L
    from .obligation import UNKNOWN

    limit = INDEX_LIMIT if limit is None else limit
    defs, data = L.index_definitions(kernel)
    roots = tuple(dict.fromkeys(roots))
    seen: set[str] = set()

    def check(e: E.Expr, path: tuple[str, ...]) -> None:
        for lf in E.leaves(e):
            if isinstance(lf, E.Val):
                raise ValueError(f"the index {E.to_str(e)} depends on data ({lf.name})")
            if isinstance(lf, E.Var):
                if lf.name in data or lf.name not in defs:
                    raise ValueError(f"the index variable {lf.name} holds a data value")
                if lf.name in path:
                    raise ValueError(f"the index variable {lf.name} is defined from itself")
                if lf.name not in seen:
                    for d in defs[lf.name]:
                        for x in d[1:]:
                            check(x, path + (lf.name,))
                    seen.add(lf.name)
        if _has_bitop(e):
            raise ValueError(f"the index {E.to_str(e)} has bit operations")

    try:
        for r in roots:
            check(r, ())
    except ValueError as x:
        return str(x)
    used = {k: tuple(v) for k, v in defs.items() if k in seen}
    pc = IndexWidth(used, roots, limit)
    syms = sorted({lf.name for r in roots for lf in E.leaves(r) if isinstance(lf, E.Sym)}
                  | {lf.name for d in used.values() for x in d[1:] for lf in E.leaves(x)
                     if isinstance(lf, E.Sym)})
    ob = Obligation(INDEX, f"{kernel.name}: index values fit 32 bits ({len(roots)} index "
                    f"expressions within +-{limit})", role="evidence",
                    formula_text=str(pc), witness={"precondition": pc, "symbols": syms})
    if not syms:
        if not pc.holds({}):
            return f"an index value exceeds +-{limit}"
        ob.set(PROVED, "interval")
    else:
        ob.set(UNKNOWN, "interval", "checked for each call's sizes; a call that breaks it "
               "runs the kernel's 64-bit variant")
    return ob


def _has_bitop(e: E.Expr) -> bool:
    return isinstance(e, E.BitOp) or any(_has_bitop(c) for c in e.children)


#: the completion barriers of bulk copies are reused only after a wait
TMA_PHASES = "tma.phases"
#: every bulk copy lands inside its tile ring, on the swizzle's alignment
TMA_PLACEMENT = "tma.placement"


def tma_obligations(kernel: Any) -> list[Obligation]:
    """The bulk tensor copies' obligations (``lowering/bulk_copy.py``), undischarged:

    * ``tma.phases`` (when the kernel has block-barrier groups of copies,
      ``bulk_copy.BARRIERS``) -- the kernel's ``M`` completion barriers exceed the
      largest ``keep`` of its block barriers, so the copies of group ``g +
      M`` never signal barrier ``g mod M`` before every thread waited for
      group ``g``'s phase (a smaller ``M`` aliases two phases: a wait on the
      older one may pass on the newer one's completion, or never end);
    * ``tma.placement`` -- per bulk copy, for every value of the loop
      variables its destination offset ``at`` reads: the copy starts 1024
      bytes aligned (the 128-byte swizzle's atom, which the tensor cores'
      descriptors and the element layout both assume) and its tile lies
      inside the ring buffer; every copy, those of a warp-specialized ring
      (``warp_roles.py``) included.

    That no thread reads a tile before its copy completes, and no copy
    overwrites a version still being read, are the barrier proof's (the
    copies are the loop's asynchronous stores, with the same groups and
    lags: ``proofs/barriers.py``)."""
    from ..lowering import loopir as L
    from ..lowering.bulk_copy import BARRIERS, max_keep, standing

    bars = next((b for b in kernel.locals if b.name == BARRIERS), None)
    out = []
    if bars is not None:  # block-barrier groups (a specialized ring has its own: roles.*)
        M, K = int(bars.size.value), max_keep(kernel)
        out.append(Obligation(
            TMA_PHASES, f"{kernel.name}: {M} completion barriers > {K}, the largest keep of "
            "a block barrier", (), Fm.Claim((), Fm.TRUE, Fm.atom(E.Const(M).gt(K))),
            explain=lambda pt: [(f"group g + {M} signals the barrier of group g, which a "
                                 f"thread may wait for {K} barriers after its commit")]))
    seen = set()
    for ph in kernel.phases:
        for s in L.walk(ph.body):
            if not standing(s) or (s.bulk.dst.name, s.bulk.at) in seen:
                continue
            bc = s.bulk
            seen.add((bc.dst.name, bc.at))
            lay = bc.layout
            free = sorted({lf for lf in E.leaves(bc.at) if isinstance(lf, E.Var)},
                          key=lambda v: v.name)
            hyp = Fm.conj(*(Fm.atom(v.ge(0)) for v in free))
            concl = Fm.conj(Fm.atom(E.mod(E.mul(bc.at, lay.itemsize), L.Swizzle128.ATOM_BYTES)
                                    .eq(0)),
                            Fm.atom(bc.at.ge(0)),
                            Fm.atom(E.add(bc.at, lay.rows * lay.cols).le(bc.dst.size)))
            syms = sorted(n.name for n in E.leaves(bc.dst.size) if isinstance(n, E.Sym))
            base = Fm.conj(*(Fm.atom(E.Sym(n).ge(0)) for n in syms))
            out.append(Obligation(
                TMA_PLACEMENT, f"{ph.name}: the bulk copy {bc} starts on a 1024-byte atom "
                f"inside {bc.dst.name}", (),
                Fm.Claim(tuple(v.name for v in free), hyp, concl, base),
                info={v.name: VarInfo(v.name) for v in free}))
    return out


# ---------------------------------------------------------------------------- roles
#: a consumer reads, at step i, only the tiles the producer copied at step i,
#: after waiting for them
ROLES_FULL = "roles.full"
#: the producer never overwrites a version the consumers may still read
ROLES_VERSIONS = "roles.versions"
#: a version is released only after its mmas completed, and in time for the
#: producer that waits for it
ROLES_RELEASE = "roles.release"
#: each barrier of the two rings is one slot's, and its phases are waited in turn
ROLES_PARITY = "roles.parity"


@dataclass(frozen=True)
class _Ctx:
    """Where a statement inside a warp-specialized ring runs: the loop
    variables bound on the way (``vars``, the ring's own first), the facts
    that hold there (``facts``: their ranges, the index guards taken), the
    values of the index locals assigned before it (``values``, over the
    variables and values bound before each assignment), the variables of
    the thread loops on the way (``threads``), and ``inexact``: why the
    facts over-approximate the statement's instances (a guard on data, a
    ``while``), empty when exact.

    A local whose value is not known there (assigned a data value, or
    assigned in a loop or branch left since) stands for a fresh variable
    ``name?k`` (:meth:`unknown`), free in the claims, so that no fact about
    an earlier value of it constrains it."""

    vars: tuple[str, ...] = ()
    facts: tuple[E.Pred, ...] = ()
    values: tuple[tuple[E.Expr, E.Expr], ...] = ()
    threads: tuple[str, ...] = ()
    inexact: tuple[str, ...] = ()
    fresh: int = 0

    def ix(self, e: Any) -> Any:
        """``e`` (an expression or predicate) with the index locals replaced
        by their values."""
        return E.subst(e, dict(self.values)) if self.values else e

    def given(self, p: E.Pred) -> _Ctx:
        return replace(self, facts=self.facts + (self.ix(p),))

    def approx(self, why: str) -> _Ctx:
        return replace(self, inexact=self.inexact + (why,))

    def let(self, name: str, e: E.Expr) -> _Ctx:
        v = E.Var(name)
        return replace(self, values=tuple((k, x) for k, x in self.values if k != v)
                       + ((v, self.ix(e)),))

    def unknown(self, names: Iterable[str]) -> _Ctx:
        """The context after statements that assign ``names`` to values not
        known here: each stands for a fresh variable."""
        ctx = self
        for n in sorted(names):
            ctx = replace(ctx.let(n, E.Var(f"{n}?{ctx.fresh}")), fresh=ctx.fresh + 1)
        return ctx

    def loop(self, s: Any) -> _Ctx:
        """The context of the body of loop ``s`` (its bounds evaluated here;
        the locals its body assigns carry unknown values into an iteration)."""
        from ..lowering import loopir as L

        v = E.Var(s.var.name)
        rng = E.pand(v.ge(self.ix(s.lo)), v.lt(self.ix(s.hi)))
        inner = self.unknown(set(L.assigned(s.body)) - {s.var.name})
        return replace(inner, vars=inner.vars + (s.var.name,), facts=inner.facts + (rng,),
                       values=tuple((k, x) for k, x in inner.values if k != v),
                       threads=inner.threads + ((s.var.name,) if s.kind == "thread" else ()))


def _walk_ctx(body: tuple, ctx: _Ctx) -> Any:
    """``(statement, its context)`` for every statement of ``body``, nested ones
    included, in pre-order; a warpgroup mma is followed by the statements of
    its :meth:`~tilenest.lowering.loopir.WarpMma.footprint` (every access a
    lane of it may make)."""
    from ..lowering import loopir as L

    for s in body:
        yield s, ctx
        if isinstance(s, L.Assign):
            v = s.value
            if isinstance(v, L.IExpr):
                ctx = ctx.let(s.var.name, v.e)
            elif isinstance(v, L.Const) and isinstance(v.value, int) \
                    and not isinstance(v.value, bool):
                ctx = ctx.let(s.var.name, E.Const(int(v.value)))
            else:
                ctx = ctx.unknown({s.var.name})
        elif isinstance(s, L.For):
            yield from _walk_ctx(s.body, ctx.loop(s))
            ctx = ctx.unknown(L.assigned(s.body))
        elif isinstance(s, L.If):
            if isinstance(s.cond, L.IPred):
                yield from _walk_ctx(s.then, ctx.given(s.cond.p))
                yield from _walk_ctx(s.orelse, ctx.given(E.pnot(s.cond.p)))
            else:
                yield from _walk_ctx(s.then + s.orelse, ctx.approx("a guard on data"))
            ctx = ctx.unknown(L.assigned(s.then + s.orelse))
        elif isinstance(s, L.While):
            inner = ctx.unknown(L.assigned(s.pre + s.body)).approx("a while loop")
            yield from _walk_ctx(s.pre + s.body, inner)
            ctx = ctx.unknown(L.assigned(s.pre + s.body))
        elif isinstance(s, (L.Shuffle, L.LaneReduce)):
            ctx = ctx.unknown({s.dst.name})
        elif isinstance(s, L.WarpMma):
            yield from _walk_ctx(s.footprint(), ctx)


def _accesses(body: tuple, ctx: _Ctx, bufs: set[str]) -> list[tuple[str, E.Expr, bool, _Ctx]]:
    """Every access of ``body`` to a buffer named in ``bufs``: ``(buffer, index
    over the context's variables, whether it writes, context)`` (the guard of
    a guarded load or store among the context's facts)."""
    from ..lowering import loopir as L

    out = []

    def access(buf: str, index: Any, guard: Any, write: bool, c: _Ctx) -> None:
        if guard is not None:
            c = c.given(guard.p) if isinstance(guard, L.IPred) else c.approx("a guard on data")
        if isinstance(index, L.IExpr):
            e = c.ix(index.e)
        else:  # not an index expression: any element
            e, c = E.Var(f"{buf}?index"), c.approx("an index computed from data")
        out.append((buf, e, write, c))

    for s, c in _walk_ctx(body, ctx):
        for x in L.stmt_exprs(s):
            for y in L.subexprs(x):
                if isinstance(y, L.Load) and y.buf.name in bufs:
                    access(y.buf.name, y.index, y.guard, False, c)
        if isinstance(s, L.Store) and s.buf.name in bufs:
            access(s.buf.name, s.index, s.guard, True, c)
    return out


@dataclass(frozen=True)
class _Copy:
    """One bulk copy of a ring's producer: its permission, the context it is
    issued in, and the tile it writes, ``[at, at + size)`` over that
    context's variables."""

    bulk: Any
    ctx: _Ctx

    @property
    def at(self) -> E.Expr:
        return self.ctx.ix(self.bulk.at)

    @property
    def size(self) -> int:
        return self.bulk.layout.rows * self.bulk.layout.cols

    def renaming(self, keep: set[str], tag: str, step: tuple[str, str] | None = None
                 ) -> dict[str, str]:
        """Names for the variables of this copy's tile and facts: those in
        ``keep`` unchanged, ``step`` (``(name, new name)``) as given, every
        other one (the copy's own loop variables, unknown locals) tagged."""
        exprs: list[Any] = [self.at, *self.ctx.facts]
        names = {lf.name for x in exprs for lf in E.leaves(x) if isinstance(lf, E.Var)}
        ren = {v: v + tag for v in names - keep}
        if step is not None:
            ren[step[0]] = step[1]
        return ren

    def facts(self, ren: dict[str, str]) -> list[E.Pred]:
        return [E.rename(p, ren) for p in self.ctx.facts]

    def tile(self, ren: dict[str, str]) -> tuple[E.Expr, E.Expr]:
        """``[at, at + size)`` with the variables renamed."""
        at = E.rename(self.at, ren)
        return at, E.add(at, self.size)

    def holds(self, e: E.Expr, shared: set[str]) -> Fm.F:
        """``e`` lies in the tile of some instance of this copy whose facts
        hold: the variables outside ``shared`` (the copy's own) renamed and
        existentially bound."""
        ren = self.renaming(shared, "@copy")
        lo, hi = self.tile(ren)
        body = Fm.conj(*(Fm.atom(p) for p in self.facts(ren)), Fm.atom(lo.le(e)),
                       Fm.atom(e.lt(hi)))
        return Fm.exists(sorted(ren.values()), body)


def _produced(loop: Any, base: _Ctx) -> tuple[list[_Copy], list[str]]:
    """The bulk copies of ``loop``'s producer statements (``Roles.produce``),
    and what else those statements do (each a phrase; the producer of the
    protocol only issues copies, under index guards)."""
    from ..lowering import loopir as L
    from ..lowering.bulk_copy import standing

    copies: list[_Copy] = []
    other: list[str] = []

    def visit(body: tuple, ctx: _Ctx) -> None:
        for s in body:
            if isinstance(s, L.Comment):
                continue
            if standing(s):
                copies.append(_Copy(s.bulk, ctx))
            elif isinstance(s, L.If) and isinstance(s.cond, L.IPred):
                visit(s.then, ctx.given(s.cond.p))
                visit(s.orelse, ctx.given(E.pnot(s.cond.p)))
            elif isinstance(s, L.Assign) and isinstance(s.value, L.IExpr):
                ctx = ctx.let(s.var.name, s.value.e)
            else:
                other.append(f"a {type(s).__name__} statement" + (
                    f" (loop {s.var.name})" if isinstance(s, L.For) else ""))

    visit(loop.roles.produce(loop), base)
    return copies, other


def _parts_explain(parts: list[tuple[Fm.F, Any]], claim: Fm.Claim, lead: Any = None) -> Any:
    """A counterexample renderer: the text of every part of a conclusion (a
    formula and a function of the point's environment giving its lines) that
    fails at the point; ``lead`` (a function of the environment) is printed
    first."""

    def explain(pt: dict) -> list[str]:
        env = Fm.env_of(pt, claim.params)
        lines = list(lead(env)) if lead is not None else []
        for f, text in parts:
            try:
                ok = Fm.evaluate(f, env)
            except (Fm.Undecided, KeyError):
                ok = False
            if not ok:
                lines.extend(text(env))
        return lines

    return explain


def _val(e: E.Expr, env: dict) -> Any:
    """``e`` at the point ``env``, or its text when a value is missing."""
    try:
        return E.evaluate(e, env)
    except (KeyError, ZeroDivisionError):
        return E.to_str(e)


def _claim(hyps: list[E.Pred], concl: Fm.F, bound: tuple[str, ...], outer: set[str]
           ) -> Fm.Claim:
    """The claim that ``hyps`` imply ``concl`` for all values of their
    variables and symbols, assuming every symbol, and every variable in
    ``outer`` (defined outside the ring), ``>= 0``; the claim's variables
    are ``bound`` first, then any other free one."""
    hyp = Fm.conj(*(Fm.atom(p) for p in hyps))
    free = Fm.free_vars(hyp) | Fm.free_vars(concl)
    order = [v for v in bound if v in free] + sorted(free - set(bound))
    outside = [v for v in order if v in outer]
    hyp = Fm.conj(hyp, *(Fm.atom(E.Var(v).ge(0)) for v in outside))
    syms = sorted(Fm.syms(hyp) | Fm.syms(concl))
    return Fm.Claim(tuple(order), hyp, concl, Fm.conj(*(Fm.atom(E.Sym(s).ge(0)) for s in syms)))


def roles_obligations(kernel: Any) -> list[Obligation]:
    """The handshake obligations of every warp-specialized ring of ``kernel``
    (a ``for i in [lo, hi)`` with a :class:`~tilenest.lowering.loopir.Roles`
    permission ``S, T, lag, keep`` = ``stages, consumers, release_lag,
    release_keep``), undischarged. They are computed from the ring as it
    stands -- the permission's fields, the destination offsets ``at(i)`` of
    the producer's bulk copies (tile sizes ``Z = rows * cols``) and the
    indices of the consumers' accesses to those buffers (a warpgroup mma
    reads its whole operand blocks) -- with the loop's variables and the
    index locals' values in context, every variable defined outside the
    ring and every symbol ``>= 0`` (as ``tma.placement``). The barriers
    count steps with a counter ``n`` that runs on over every execution of
    the phase's rings: step ``n`` uses slot ``n mod S`` of the ``full`` and
    ``empty`` rings, in phase ``n // S``; between two executions the
    consumers complete and release every step and the producer waits for
    those releases. The tiles are the ring's own: ``at(i)`` of loop index
    ``i``.

    * ``roles.full`` (per consumer access to a buffer the producer copies
      into) -- for every step ``lo <= i < hi`` and every instance of the
      access in step ``i``'s consumer statements: the consumers wait for the
      ``full`` slot of step ``i`` before them (``wait_full``), the thread
      making it is a consumer (its thread loop variables ``< T``), the
      producer only issues bulk copies, and the element accessed lies in the
      tile ``[at(i), at(i) + Z)`` of a copy the producer issues at step
      ``i`` (its guards holding). So nothing a consumer reads is older or
      newer than what the ``full`` phase it waited for announces.
    * ``roles.versions`` (per pair of copies into one buffer) -- for all
      steps ``lo <= i < j < hi`` whose reads may still be in flight while the
      producer writes step ``j``: every earlier step when ``j - lo < S`` (no
      wait), else those after the step whose release the producer waited
      for, less the ``lag - keep`` steps whose mmas that release had seen
      complete (``i - (j - S) > lag - keep``): the tile written at ``j`` and
      the one written at ``i`` are disjoint.
    * ``roles.release`` (two) -- *completion*: at every consumer step ``i``
      with ``i - lag >= lo``, the step it releases, ``i - lag``, is at most
      ``i - keep`` (with at least one mma group per thread per step, waiting
      until at most ``keep`` groups are pending completes every step up to
      ``i - keep``), ``keep >= 0``, and every mma of the consumer runs at every
      step (its guards do not depend on ``i``); *progress*: at every producer
      step ``lo + S <= j < hi`` the release it waits for, made at consumer
      step ``j - S + lag``, comes from a step before ``j`` (``j - S + lag <=
      j - 1``), whose ``full`` wait needs only copies already issued, and
      the ring has a producer (``producers >= 1``): no cycle of waits.
    * ``roles.parity`` -- for every step counter ``n >= 0``: its ``full``
      slot ``n mod S`` and ``empty`` slot ``S + n mod S`` are distinct
      barriers of the kernel's ring barriers (``warp_roles.ROLE_BARRIERS``,
      ``>= 2 S`` of them), and the release of step ``n`` is made at
      consumer step ``n + lag >= n``, after that step's ``full`` wait. Then
      the phases of one barrier belong to the steps ``S`` apart that share
      its slot, and each wait for phase ``p`` finds ``p`` or ``p + 1``
      phases complete (the next phase needs a release or a copy that comes
      only after this wait): the wait on the parity of ``p`` is
      unambiguous."""
    from ..lowering import loopir as L
    from ..lowering.warp_roles import ROLE_BARRIERS

    bars = next((b for b in kernel.locals if b.name == ROLE_BARRIERS), None)
    nbars = int(bars.size.value) if bars is not None and isinstance(bars.size, E.Const) else 0
    out: list[Obligation] = []
    for ph in kernel.phases:
        outer = set(L.assigned(ph.body)) | {ph.pid.name}
        for s in L.walk(ph.body):
            if isinstance(s, L.For) and s.roles is not None:
                inside = set(L.assigned(s.body))
                out += _roles_loop(ph, s, (outer - inside) - {s.var.name}, nbars)
    return out


def _roles_loop(ph: Any, loop: Any, outer: set[str], nbars: int) -> list[Obligation]:
    """The ``roles.*`` obligations of one ring (:func:`roles_obligations`)."""
    from ..lowering import loopir as L

    r = loop.roles
    S, lag, keep = r.stages, r.release_lag, r.release_keep
    iv = loop.var.name
    i = E.Var(iv)
    base = _Ctx().loop(loop)
    copies, other = _produced(loop, base)
    ring = sorted({c.bulk.dst.name for c in copies})
    where = f"{ph.name}: ring {iv}"
    info = {iv: VarInfo(f"step {iv}")}
    out: list[Obligation] = []

    # roles.full ----------------------------------------------------------
    seen: set = set()
    for buf, e, write, c in _accesses(r.consume(loop), base, set(ring)):
        key = (buf, e, write, c.facts)
        if key in seen:
            continue
        seen.add(key)
        parts: list[tuple[Fm.F, Any]] = []
        parts.append((Fm.TRUE if r.wait_full else Fm.FALSE, lambda env: [(
            f"the consumers do not wait for the full slot of step {iv} = {_val(i, env)} "
            "before its statements: the copies may not have landed")]))
        if other:
            parts.append((Fm.FALSE, lambda env: [
                f"the producer runs {', '.join(other)}, not only bulk copies"]))
        for t in c.threads:
            parts.append((Fm.atom(E.Var(t).lt(r.consumers)), lambda env, t=t: [(
                f"thread {t} = {_val(E.Var(t), env)} runs a consumer statement but is not one "
                f"of the {r.consumers} consumers")]))
        mine = [cp for cp in copies if cp.bulk.dst.name == buf]
        inside = Fm.disj(*(cp.holds(e, set(base.vars) | outer) for cp in mine))
        parts.append((inside, lambda env, buf=buf, e=e, mine=mine, write=write: [
            f"at step {iv} = {_val(i, env)} the consumer {'writes' if write else 'reads'} "
            f"{buf}[{_val(e, env)}], outside the tiles the producer copies at that step ("
            + (", ".join(f"[{_val(cp.at, env)}, {_val(cp.at, env)} + {cp.size})"
                         for cp in mine) or "none") + ")"]))
        concl = Fm.conj(*(f for f, _ in parts))
        claim = _claim(list(c.facts), concl, c.vars, outer)
        ob = Obligation(ROLES_FULL, f"{where}: the consumers {'write' if write else 'read'} "
                        f"{buf}[{E.to_str(e)}] only in the tiles copied at the same step, after "
                        "its full wait", (), claim, info=info)
        ob.explain = _parts_explain(parts, claim)
        _mark(ob, c)
        out.append(ob)

    # roles.versions ------------------------------------------------------
    jv, iv2 = "step.j", "step.i"
    j, ii = E.Var(jv), E.Var(iv2)
    lo, hi = loop.lo, loop.hi
    window = [ii.ge(lo), ii.lt(j), j.lt(hi),
              E.por(E.add(j, E.mul(-1, lo)).lt(S),
                    E.add(E.add(ii, E.mul(-1, j)), S).gt(lag - keep))]
    for k, a in enumerate(copies):
        for b in copies[k:]:
            if a.bulk.dst.name != b.bulk.dst.name:
                continue
            for x, y in ((a, b), (b, a)) if a is not b else ((a, a),):
                rj = x.renaming(outer, "@j", (iv, jv))
                ri = y.renaming(outer, "@i", (iv, iv2))
                (at_j, end_j), (at_i, end_i) = x.tile(rj), y.tile(ri)
                hyps = window + x.facts(rj) + y.facts(ri)
                concl = Fm.disj(Fm.atom(end_j.le(at_i)), Fm.atom(end_i.le(at_j)))
                claim = _claim(hyps, concl, (jv, iv2), outer)

                def explain(pt: dict, x=x, y=y, at_j=at_j, at_i=at_i, claim=claim) -> list[str]:
                    env = Fm.env_of(pt, claim.params)
                    sj, si = _val(j, env), _val(ii, env)
                    return [(f"the producer writes {x.bulk.dst.name}[{_val(at_j, env)}, "
                             f"{_val(at_j, env)} + {x.size}) at step {sj} while the consumers "
                             f"may still read the tile of step {si}, [{_val(at_i, env)}, "
                             f"{_val(at_i, env)} + {y.size}) ({S} slots, release of step i "
                             f"at step i + {lag} after all but {keep} mma groups complete)")]

                ob = Obligation(ROLES_VERSIONS, f"{where}: the copy {x.bulk} at step j never "
                                f"overwrites the tile of a step i the consumers may still read "
                                f"({S} slots, lag {lag}, keep {keep})", (), claim,
                                explain=explain,
                                info={jv: VarInfo("producer step j"),
                                      iv2: VarInfo("consumer step i")})
                _mark(ob, x.ctx, y.ctx)
                out.append(ob)

    # roles.release -------------------------------------------------------
    steady, vague = [], []  # mmas that may skip steps; contexts known only roughly
    for s, c in _walk_ctx(r.consume(loop), base):
        if isinstance(s, L.WarpMma):
            extra = c.facts[len(base.facts):]
            by_step = any(i in E.leaves(p) for p in extra)
            unknown = any("?" in lf.name for p in extra for lf in E.leaves(p)
                          if isinstance(lf, E.Var))
            if by_step or unknown or c.inexact:
                steady.append(f"{s.a.buf.name} x {s.b.buf.name} (under "
                              + (" and ".join(E.pred_to_str(p) for p in extra) or
                                 "; ".join(c.inexact)) + ")")
                if not by_step:  # it may run at every step: not known to skip one
                    vague.append(c.approx("an mma under a guard not known at each step"))
    parts = [(Fm.atom(E.add(i, -lag).le(E.add(i, -keep))), lambda env: [(
        f"at step {iv} = {_val(i, env)} the consumers release step {_val(E.add(i, -lag), env)} "
        "while its mmas may still read it: only the steps up to "
        f"{_val(E.add(i, -keep), env)} are complete ({keep} newest mma groups kept in "
        "flight)")]),
        (Fm.atom(E.Const(keep).ge(0)), lambda env: [f"release_keep = {keep} < 0"])]
    if steady:
        parts.append((Fm.FALSE, lambda env: [
            "the mma " + "; ".join(steady) + " does not run at every step, so the newest "
            "mma groups may be older steps'"]))
    claim = _claim([i.ge(lo), i.lt(hi), E.add(i, -lag).ge(lo)],
                   Fm.conj(*(f for f, _ in parts)), (iv,), outer)
    ob = Obligation(ROLES_RELEASE, f"{where}: step i - {lag} is released only after its mma "
                    f"groups completed (all but {keep} complete at step i)", (), claim,
                    info=info)
    ob.explain = _parts_explain(parts, claim)
    _mark(ob, *vague)
    out.append(ob)

    parts = [(Fm.atom(E.add(E.add(j, -S), lag).le(E.add(j, -1))), lambda env: [(
        f"at step {_val(j, env)} the producer waits for the release of step "
        f"{_val(E.add(j, -S), env)}, which the consumers make at their step "
        f"{_val(E.add(E.add(j, -S), lag), env)}: after the full wait of a step not yet "
        "produced (a deadlock)")]),
        (Fm.atom(E.Const(r.producers).ge(1)), lambda env: ["the ring has no producer thread"])]
    claim = _claim([j.ge(E.add(lo, S)), j.lt(hi)], Fm.conj(*(f for f, _ in parts)), (jv,),
                   outer)
    ob = Obligation(ROLES_RELEASE, f"{where}: the release the producer waits for at step j "
                    f"(step j - {S}, made at consumer step j - {S} + {lag}) never waits for "
                    "step j itself", (), claim, info={jv: VarInfo("producer step j")})
    ob.explain = _parts_explain(parts, claim)
    out.append(ob)

    # roles.parity --------------------------------------------------------
    nv = "step.n"
    n = E.Var(nv)
    if S >= 1:
        slots = Fm.atom(E.add(E.mod(n, S), S).lt(nbars))
    else:
        slots = Fm.FALSE
    parts = [(slots, lambda env: [(
        f"step {_val(n, env)}'s empty slot {S} + {_val(n, env)} mod {S} is not one of the "
        f"{nbars} ring barriers: the rings of {S} slots need {2 * S}")]),
        (Fm.atom(E.add(n, lag).ge(n)), lambda env: [(
            f"the release of step {_val(n, env)} is made at step {_val(E.add(n, lag), env)}, "
            "before its full wait: a phase may complete twice between two waits")])]
    claim = _claim([n.ge(0)], Fm.conj(*(f for f, _ in parts)), (nv,), set())
    ob = Obligation(ROLES_PARITY, f"{where}: {2 * max(S, 0)} of {nbars} ring barriers, one per "
                    f"slot, each phase waited before the next can complete", (), claim,
                    info={nv: VarInfo("step counter n")})
    ob.explain = _parts_explain(parts, claim)
    out.append(ob)
    return out


def _mark(ob: Obligation, *ctxs: _Ctx) -> None:
    """Make ``ob`` unrefutable (a counterexample may not be an instance)
    when a context over-approximates its statements' instances, or its
    claim reads a local whose value is not known there."""
    why = [w for c in ctxs for w in c.inexact]
    why += [f"the value of {v.split('?')[0]} there" for v in
            (ob.claim.vars if ob.claim is not None else ()) if "?" in v]
    if why:
        ob.refutable = False
        ob.inexact_note = "; ".join(dict.fromkeys(why))
