"""Size paths, and sizes solved under the kernel's assumptions.

A *size path* is a regime of one symbolic extent under which compiled code
takes a distinct path. For a symbol ``N`` tiled by ``t`` (see
:func:`tilenest.validation.inputs.tile_sizes`):

* ``multi``  -- ``N >= 3t`` and ``N % t != 0``: a loop over tiles that runs
  several whole tiles and then a masked, ragged one;
* ``over``   -- ``t < N < 2t``: one whole tile and a tail (closest: ``t + 1``);
* ``under``  -- ``0 < N < t``: a single partial tile (closest: ``t - 1``);

and for every symbol ``zero`` (``N == 0``: nothing to do) and ``one``. The
``multi`` paths are *required*: a validation that compares no case on one of
them has not tested the kernel's main loop with its tail, and its report says
so (:func:`unreached`). The other paths are reached where the kernel admits
them.

What a kernel admits is the *size space*: its assumptions (``tn.assume``),
every tensor extent non-negative, and every symbol non-negative (at most the
user's ``limit`` when one is given). :class:`SizeSolver` finds points of that
space on a given path, near preferred values and away from points already
used, by asking Z3 (:func:`tilenest.proofs.z3_engine.decide`, which prefers
small models), so that assumptions such as ``E * 2 == D`` or ``HQ == 4 * HK``
do not collapse the sizes a random draw would give.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..semantics import expr as E
from ..semantics.ir import TileProgram
from ..semantics.types import TensorType

#: the largest extent the solver gives any symbol when no limit is set (the
#: element budget keeps tensors far smaller)
SOLVER_CAP = 1 << 16

#: seconds Z3 may spend on one query
SOLVER_TIMEOUT = 2.0


@dataclass(frozen=True)
class SizePath:
    """The regime ``kind`` of symbol ``sym`` for tile ``tile`` (0 for
    ``zero``/``one``); ``preferred`` is the size that realizes it most
    directly (three tiles and a third of a tile for ``multi``)."""

    sym: str
    kind: str
    tile: int = 0

    @property
    def required(self) -> bool:
        """Must a validation reach this path (module docstring)?"""
        return self.kind == "multi"

    @property
    def preferred(self) -> int:
        t = self.tile
        return {"multi": multi_tile_size(t), "over": t + 1, "under": t - 1,
                "zero": 0, "one": 1}[self.kind]

    def pred(self) -> E.Pred:
        """The path's condition on the symbol."""
        n, t = E.Sym(self.sym), self.tile
        if self.kind == "multi":
            return E.pand(E.cmp(">=", n, 3 * t), E.cmp("!=", E.mod(n, t), 0))
        if self.kind == "over":
            return E.pand(E.cmp(">", n, t), E.cmp("<", n, 2 * t))
        if self.kind == "under":
            return E.pand(E.cmp(">", n, 0), E.cmp("<", n, t))
        return E.cmp("==", n, 0 if self.kind == "zero" else 1)

    def window(self) -> E.Pred:
        """A narrower condition around :attr:`preferred`, tried first."""
        if self.kind != "multi":
            return E.TRUE
        n, t = E.Sym(self.sym), self.tile
        return E.cmp("<", n, 4 * t)

    def holds(self, syms: Mapping[str, int]) -> bool:
        """Does the binding ``syms`` take this path?"""
        return self.sym in syms and bool(E.evaluate(self.pred(), _env(syms)))

    def text(self) -> str:
        n, t = self.sym, self.tile
        return {"multi": f"{n} at three {t}-tiles and a ragged tail ({n} >= {3 * t}, "
                         f"{n} % {t} != 0)",
                "over": f"{n} at one {t}-tile and a tail ({t} < {n} < {2 * t})",
                "under": f"{n} inside one partial {t}-tile (0 < {n} < {t})",
                "zero": f"{n} = 0", "one": f"{n} = 1"}[self.kind]


def multi_tile_size(t: int) -> int:
    """Three whole tiles of ``t`` and a ragged tail ``0 < r < t``."""
    return 3 * t + max(1, t // 3)


def _env(syms: Mapping[str, int]) -> dict[E.Expr, int]:
    return {E.Sym(k): int(v) for k, v in syms.items()}


def size_paths(tiles: Mapping[str, set[int]], syms: Sequence[str]) -> list[SizePath]:
    """Every path of every symbol, most important first: each tiled symbol's
    ``multi`` path (largest tile first), each symbol's ``zero`` and ``one``,
    then each tile's ``over`` and ``under``."""
    out: list[SizePath] = []
    for s in syms:
        out += [SizePath(s, "multi", t) for t in sorted(tiles.get(s, ()), reverse=True)]
    for kind in ("zero", "one"):
        out += [SizePath(s, kind) for s in syms]
    for s in syms:
        for t in sorted(tiles.get(s, ()), reverse=True):
            out += [SizePath(s, "over", t), SizePath(s, "under", t)]
    return out


def elements(p: TileProgram, syms: Mapping[str, int]) -> int:
    """The number of elements of ``p``'s tensor arguments under ``syms``."""
    env = _env(syms)
    return sum(int(np.prod([int(E.evaluate(x, env)) for x in a.type.shape], dtype=np.int64))
               for a in p.args if isinstance(a.type, TensorType))


@dataclass(frozen=True)
class Unreached:
    """A required path no compared case took: ``cause`` is ``assumptions``
    (the size space has no point on it), ``limit`` (none within the user's
    size limit), ``budget`` (none within the element budget of a case),
    ``solver`` (Z3 could not decide) or ``cases`` (reachable, but no compared
    case took it: too few cases, or the reference skipped them); ``why`` says
    it in words."""

    path: SizePath
    cause: str
    why: str

    @property
    def blocking(self) -> bool:
        """Does it make a validation fail unless accepted? ``limit`` is the
        user's own choice and ``cases`` is listed only as a note."""
        return self.cause in ("assumptions", "budget", "solver")

    def text(self) -> str:
        return f"{self.path.text()}: {self.why}"


class SizeSolver:
    """Points of a program's size space (module docstring), found by Z3."""

    def __init__(self, p: TileProgram, limit: int | None = None):
        self.p = p
        self.syms = tuple(p.syms)
        self.cap = limit if limit is not None else SOLVER_CAP
        self.limit = limit
        shapes = [E.cmp(">=", x, 0) for a in p.args if isinstance(a.type, TensorType)
                  for x in a.type.shape if not isinstance(x, E.Const)]
        self.space = E.pand(*p.assumptions, *shapes,
                            *(E.cmp(">=", E.Sym(s), 0) for s in self.syms))
        #: Z3 could not decide a query on this space: :meth:`solve` gives up at once
        self.undecided = False

    def _capped(self) -> E.Pred:
        return E.pand(*(E.cmp("<=", E.Sym(s), self.cap) for s in self.syms))

    def _ask(self, pred: E.Pred) -> tuple[str, dict[str, int] | None, str]:
        """``("sat", point, "")``, ``("unsat", None, "")`` or ``("unknown",
        None, reason)`` for ``space & pred``."""
        from ..proofs import formula as Fm
        from ..proofs.z3_engine import decide

        ans = decide(Fm.atom(E.pand(self.space, pred)), self.syms, (), (), SOLVER_TIMEOUT)
        if ans.status != "sat" or ans.point is None:
            return ans.status, None, ans.reason
        return "sat", {s: int(ans.point[s]) for s in self.syms}, ""

    def solve(self, path: SizePath | None, prefer: Mapping[str, int],
              avoid: Sequence[Mapping[str, int]] = (), budget: int | None = None,
              fixed: Mapping[str, int] | None = None) -> dict[str, int] | None:
        """A point on ``path`` (any point when None) that agrees with ``fixed``,
        within the cap and the element ``budget``. Soft wishes, given up one by
        one when the space has no point satisfying them: the path's window,
        each other symbol within a factor of two of ``prefer``, no point of
        ``avoid``, no other symbol at 0."""
        fixed = dict(fixed or {})
        want = E.pand(path.pred() if path is not None else E.TRUE,
                      *(E.cmp("==", E.Sym(k), v) for k, v in fixed.items()))
        own = path.sym if path is not None else None
        others = [s for s in self.syms if s != own and s not in fixed]
        near = E.pand(path.window() if path is not None else E.TRUE,
                      *(E.pand(E.cmp(">=", E.Sym(s), prefer[s] // 2),
                               E.cmp("<=", E.Sym(s), 2 * prefer[s] + 1))
                        for s in others if s in prefer))
        fresh = E.pand(*(E.por(*(E.cmp("!=", E.Sym(k), v) for k, v in used.items()))
                         for used in avoid if used))
        nonzero = E.pand(*(E.cmp(">=", E.Sym(s), 1) for s in others))
        hard = E.pand(want, self._capped())
        if self.undecided:
            return None
        for soft in (E.pand(near, fresh, nonzero), E.pand(fresh, nonzero), nonzero, E.TRUE):
            status, point, _ = self._ask(E.pand(hard, soft))
            if status == "unknown":
                # Z3 times out on this space (nonlinear assumptions): stop asking,
                # so that generation is not slowed by every later case
                self.undecided = True
                return None
            if point is None:
                continue
            if budget is None or elements(self.p, point) <= budget:
                return point
            # too many elements: pull the other symbols down, then try the next wish list
            for bound in (16, 2):
                small = E.pand(*(E.cmp("<=", E.Sym(s), bound) for s in others))
                point = self._ask(E.pand(hard, soft, small))[1]
                if point is not None and elements(self.p, point) <= budget:
                    return point
        return None

    def diagnose(self, path: SizePath, budget: int) -> Unreached:
        """Why ``path`` may be missing from a validation's compared cases."""
        status, _, reason = self._ask(path.pred())
        if status == "unknown":
            return Unreached(path, "solver", f"Z3 could not decide whether the kernel's "
                                             f"assumptions admit it ({reason})")
        if status == "unsat":
            return Unreached(path, "assumptions", self._excluded(path))
        if self.limit is not None and self._ask(E.pand(path.pred(), self._capped()))[0] != "sat":
            return Unreached(path, "limit", f"every such size is above the limit {self.limit}")
        if self.solve(path, {}, budget=budget) is None:
            if self.undecided:
                return Unreached(path, "solver", "Z3 could not decide whether a case on it "
                                                 "fits the element budget")
            return Unreached(path, "budget", f"every such case holds more than {budget} "
                                             "elements")
        return Unreached(path, "cases", "no compared case took it (too few cases, or the "
                                        "reference skipped them)")

    def _excluded(self, path: SizePath) -> str:
        """Which part of a ``multi`` path the assumptions exclude, in words."""
        n, t = E.Sym(path.sym), path.tile
        if path.kind != "multi":
            return "the kernel's assumptions exclude it"
        many = self._ask(E.cmp(">=", n, 3 * t))[0] == "sat"
        ragged = self._ask(E.cmp("!=", E.mod(n, t), 0))[0] == "sat"
        if many and not ragged:
            return (f"the kernel's assumptions admit no ragged tail ({path.sym} % {t} != 0 "
                    "never holds)")
        if ragged and not many:
            return f"the kernel's assumptions keep {path.sym} below {3 * t}"
        return "the kernel's assumptions admit no such size"


def unreached(p: TileProgram, tiles: Mapping[str, set[int]], compared: Sequence[Mapping[str, int]],
              limit: int | None, budget: int) -> list[Unreached]:
    """The required paths (one per tiled symbol and tile) that no binding of
    ``compared`` takes, each with its cause."""
    missing = [q for q in size_paths(tiles, p.syms)
               if q.required and not any(q.holds(c) for c in compared)]
    if not missing:
        return []
    solver = SizeSolver(p, limit)
    return [solver.diagnose(q, budget) for q in missing]
