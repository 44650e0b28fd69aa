"""GPU resource obligations of a loop-IR kernel in SIMT form, with the launch
preconditions a runtime checks per call.

* ``shared.capacity``: the ``shared`` buffers of one block fit::

      forall syms >= 0:  sum_b roundup(size_b * itemsize_b, align)  <=  limit

* ``binding.limit`` (threads): per phase, the threads per block ``W`` (the
  widest thread loop) satisfy ``1 <= W <= max_threads and W % 32 == 0``;
* ``binding.limit`` (grid): per phase, ``prod(extents) <= 2**31 - 1`` programs
  for all symbol values;
* ``binding.registers``: per phase, with ``regs`` the registers per thread
  that ``ptxas`` reports for the phase's entry, ``roundup(regs, unit) * W <=
  65536`` (``unit = 1`` by default; the hardware allocates per warp in units
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

from ..errors import TilenestError
from ..semantics import expr as E
from . import formula as Fm
from .obligation import PROVED, REFUTED, Obligation

SHARED = "shared.capacity"
LIMIT = "binding.limit"
REGISTERS = "binding.registers"

#: shared memory per block on sm_90 (227 KiB of opt-in dynamic shared memory)
SHARED_LIMIT = 232448
MAX_THREADS = 1024
MAX_GRID = 2**31 - 1
REGISTERS_PER_BLOCK = 65536
WARP = 32


class LaunchError(TilenestError):
    """A call's sizes violate a kernel's launch precondition."""

    kind = "launch error"


@dataclass(frozen=True)
class Precondition:
    """``pred`` over the kernel symbols: the launch is within the resources
    exactly when it holds; ``what`` says which resource (for the error)."""

    pred: E.Pred
    what: str

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
            raise LaunchError(f"{self.what}: {E.pred_to_str(self.pred)} fails for {vals}",
                              hint="use smaller sizes, or a schedule with smaller blocks/tiles")

    def __str__(self) -> str:
        return E.pred_to_str(self.pred)


def launch_precondition(obs: Iterable[Obligation]) -> Precondition:
    """The conjunction of the preconditions of the (discharged) resource
    obligations ``obs`` that are not proved: what a runtime must check per call."""
    preds, whats = [], []
    for o in obs:
        pc = o.witness.get("precondition") if isinstance(o.witness, dict) else None
        if pc is not None and o.status != PROVED and not pc.trivial:
            preds.append(pc.pred)
            whats.append(pc.what)
    return Precondition(E.pand(*preds) if preds else E.TRUE, "; ".join(whats) or "no limit")


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


def shared_bytes(kernel: Any, align: int = 16) -> E.Expr:
    """Bytes of ``shared`` memory of one block: each buffer rounded up to ``align``."""
    total: E.Expr = E.Const(0)
    for b in list(kernel.locals) + list(kernel.globals):
        if b.space == "shared":
            total = E.add(total, _roundup(E.mul(b.size, b.dtype.itemsize), align))
    return total


def shared_capacity(kernel: Any, limit_bytes: int = SHARED_LIMIT,
                    align: int = 16) -> Obligation:
    """``shared.capacity``: the block's shared buffers fit in ``limit_bytes``
    for all symbol values (module docstring); the precondition is
    ``shared_bytes(kernel) <= limit_bytes``."""
    total = shared_bytes(kernel, align)
    bufs = [b for b in kernel.locals if b.space == "shared"]

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


def thread_limits(kernel: Any, max_threads: int = MAX_THREADS,
                  max_grid: int = MAX_GRID) -> list[Obligation]:
    """``binding.limit`` per phase: threads per block and grid size (module
    docstring). A phase without thread loops (one thread per block) has
    no thread obligation."""
    out = []
    for ph in kernel.phases:
        ws = list(dict.fromkeys(_threads_of(ph)))
        for w in ws:
            ok = E.pand(w.ge(1), w.le(max_threads), E.mod(w, WARP).eq(0))
            out.append(_symbolic(
                LIMIT, f"{ph.name}: {E.to_str(w)} threads per block (1..{max_threads}, a "
                f"multiple of {WARP})", ok, f"{ph.name}: threads per block",
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
