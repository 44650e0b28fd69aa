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
from dataclasses import dataclass
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
    from ..lowering import loopir as L

    return [s.hi for s in L.walk(ph.body) if isinstance(s, L.For) and s.kind == "thread"]


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

    * ``tma.phases`` -- the kernel's ``M`` completion barriers exceed the
      largest ``keep`` of its block barriers, so the copies of group ``g +
      M`` never signal barrier ``g mod M`` before every thread waited for
      group ``g``'s phase (a smaller ``M`` aliases two phases: a wait on the
      older one may pass on the newer one's completion, or never end);
    * ``tma.placement`` -- per bulk copy, for every value of the loop
      variables its destination offset ``at`` reads: the copy starts 1024
      bytes aligned (the 128-byte swizzle's atom, which the tensor cores'
      descriptors and the element layout both assume) and its tile lies
      inside the ring buffer.

    That no thread reads a tile before its copy completes, and no copy
    overwrites a version still being read, are the barrier proof's (the
    copies are the loop's asynchronous stores, with the same groups and
    lags: ``proofs/barriers.py``)."""
    from ..lowering import loopir as L
    from ..lowering.bulk_copy import BARRIERS, max_keep, standing

    bars = next((b for b in kernel.locals if b.name == BARRIERS), None)
    if bars is None:
        return []
    M, K = int(bars.size.value), max_keep(kernel)
    out = [Obligation(TMA_PHASES, f"{kernel.name}: {M} completion barriers > {K}, the largest "
                      "keep of a block barrier", (),
                      Fm.Claim((), Fm.TRUE, Fm.atom(E.Const(M).gt(K))),
                      explain=lambda pt: [f"group g + {M} signals the barrier of group g, which "
                                          f"a thread may wait for {K} barriers after its commit"])]
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
