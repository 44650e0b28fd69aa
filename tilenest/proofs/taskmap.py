"""Task maps: which worker runs which task at which step (the rectangular task
product of the calculus, ``internals/tile/calculus.md``).

A :class:`TaskMap` of rank ``r`` assigns to every *worker* coordinate ``w``
(in the box ``workers``) and every *step* coordinate ``s`` (in the box
``steps``) one *task* coordinate ``assign(w, s)`` in the box ``tasks``; all
three are ``r``-tuples, one component per axis. The two atoms are

* ``spatial(e_1..e_r)``: ``e`` distinct workers, one task each:
  ``workers = e``, ``steps = 1``, ``assign(w, s) = w``;
* ``repeat(e_1..e_r)``: one worker running ``e`` tasks in sequence:
  ``workers = 1``, ``steps = e``, ``assign(w, s) = s``;

and their **product** ``a * b`` (ranks must agree) is, per axis ``d``::

    workers_d = Wa_d * Wb_d        steps_d = Sa_d * Sb_d        tasks_d = Ta_d * Tb_d
    w_d = wa_d * Wb_d + wb_d       s_d = sa_d * Sb_d + sb_d
    assign(w, s)_d = assign_a(wa, sa)_d * Tb_d + assign_b(wb, sb)_d

i.e. a worker of the product is the pair of a worker of ``a`` and one of ``b``
(``wa = w // Wb``, ``wb = w % Wb``: row-major pairing), a step likewise, and
the task is ``a``'s task refined by ``b``'s. The product is associative
(both bracketings of ``a * b * c`` are the same function) but not
commutative. ``repeat(cdiv(n, W)) * spatial(W)`` is the map SIMT lowering
uses for a loop of ``n`` iterations: iteration ``l = r * W + t`` runs on
thread ``t`` at step ``r``.

:meth:`TaskMap.coverage` states that a map covers a (possibly ragged,
symbolic) domain ``[0, n_1) x .. x [0, n_r)`` exactly: every domain point is
the task of exactly one (worker, step) -- the tasks outside the domain being
masked::

    surjective:  forall x in domain: exists w in workers, s in steps: assign(w, s) = x
    injective:   forall (w, s) != (w', s') in workers x steps:
                     assign(w, s) = assign(w', s') in domain  =>  false

stated as one claim (the conjunction) with an explicit preimage as lemma.
A refutation names the domain point that is never covered, or the two
(worker, step) pairs that cover one point twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import TilenestError
from ..semantics import expr as E
from . import formula as Fm
from .model import VarInfo
from .obligation import Obligation

Coord = int | E.Expr

COVERAGE = "taskmap.coverage"


class TaskMapError(TilenestError):
    """A task map that cannot be formed (rank mismatch, bad extents)."""

    kind = "task map error"


# ---------------------------------------------------------------------------
# arithmetic on ints or index expressions


def _concrete(*xs: Any) -> bool:
    return all(isinstance(x, int) and not isinstance(x, bool) for x in xs)


def _as_int(x: Coord) -> Coord:
    """Constant expressions as Python ints (keeps concrete results concrete)."""
    return x.value if isinstance(x, E.Const) else x


def _mul(a: Coord, b: Coord) -> Coord:
    return a * b if _concrete(a, b) else _as_int(E.mul(a, b))


def _add(a: Coord, b: Coord) -> Coord:
    return a + b if _concrete(a, b) else _as_int(E.add(a, b))


def _div(a: Coord, b: Coord) -> Coord:
    return a // b if _concrete(a, b) else _as_int(E.floordiv(a, b))


def _mod(a: Coord, b: Coord) -> Coord:
    return a % b if _concrete(a, b) else _as_int(E.mod(a, b))


def _extent(x: Any) -> Coord:
    if isinstance(x, bool) or not isinstance(x, (int, E.Expr)):
        raise TaskMapError(f"a task-map extent must be an int or an index expression, "
                           f"got {x!r}", hint="use ints or tilenest.semantics.expr expressions")
    if isinstance(x, int) and x < 0:
        raise TaskMapError(f"a task-map extent must be non-negative, got {x}")
    return _as_int(x)


# ---------------------------------------------------------------------------
# the map


@dataclass(frozen=True)
class TaskMap:
    """A rectangular task map (see the module docstring). ``kind`` is
    ``spatial``, ``repeat`` or ``product`` (with ``parts = (a, b)``);
    ``extents`` are the atom's extents (for a product: its task shape)."""

    kind: str
    extents: tuple[Coord, ...]
    parts: tuple[TaskMap, ...] = ()

    @property
    def rank(self) -> int:
        return len(self.extents)

    @property
    def workers(self) -> tuple[Coord, ...]:
        """The worker shape (per axis)."""
        if self.kind == "spatial":
            return self.extents
        if self.kind == "repeat":
            return (1,) * self.rank
        a, b = self.parts
        return tuple(_mul(x, y) for x, y in zip(a.workers, b.workers, strict=True))

    @property
    def steps(self) -> tuple[Coord, ...]:
        """The step shape (per axis): the tasks each worker runs in sequence."""
        if self.kind == "repeat":
            return self.extents
        if self.kind == "spatial":
            return (1,) * self.rank
        a, b = self.parts
        return tuple(_mul(x, y) for x, y in zip(a.steps, b.steps, strict=True))

    @property
    def tasks(self) -> tuple[Coord, ...]:
        """The task shape: per axis, workers times steps."""
        return tuple(_mul(w, s) for w, s in zip(self.workers, self.steps, strict=True))

    def __mul__(self, other: TaskMap) -> TaskMap:
        if not isinstance(other, TaskMap):
            return NotImplemented
        if other.rank != self.rank:
            raise TaskMapError(
                f"the task product needs equal ranks, got {self.rank} ({self}) and "
                f"{other.rank} ({other})",
                hint="pad the lower-rank map with extents of 1 (spatial(1, ..) or repeat(1, ..))")
        ext = tuple(_mul(x, y) for x, y in zip(self.tasks, other.tasks, strict=True))
        return TaskMap("product", ext, (self, other))

    def assign(self, worker: Sequence[Coord], step: Sequence[Coord]) -> tuple[Coord, ...]:
        """The task coordinates of ``worker`` at ``step`` (ints in, ints out;
        index expressions in, index expressions out)."""
        w, s = tuple(worker), tuple(step)
        if len(w) != self.rank or len(s) != self.rank:
            raise TaskMapError(f"a rank-{self.rank} task map needs {self.rank} worker and "
                               f"step coordinates, got {len(w)} and {len(s)}")
        if self.kind == "spatial":
            return w
        if self.kind == "repeat":
            return s
        a, b = self.parts
        wa = tuple(_div(x, n) for x, n in zip(w, b.workers, strict=True))
        wb = tuple(_mod(x, n) for x, n in zip(w, b.workers, strict=True))
        sa = tuple(_div(x, n) for x, n in zip(s, b.steps, strict=True))
        sb = tuple(_mod(x, n) for x, n in zip(s, b.steps, strict=True))
        ta, tb = a.assign(wa, sa), b.assign(wb, sb)
        return tuple(_add(_mul(x, n), y) for x, y, n in zip(ta, tb, b.tasks, strict=True))

    def preimage(self, task: Sequence[Coord]) -> tuple[tuple[Coord, ...], tuple[Coord, ...]]:
        """``(worker, step)`` whose task is ``task`` (the inverse on the task box)."""
        x = tuple(task)
        if self.kind == "spatial":
            return x, (0,) * self.rank
        if self.kind == "repeat":
            return (0,) * self.rank, x
        a, b = self.parts
        xa = tuple(_div(v, n) for v, n in zip(x, b.tasks, strict=True))
        xb = tuple(_mod(v, n) for v, n in zip(x, b.tasks, strict=True))
        (wa, sa), (wb, sb) = a.preimage(xa), b.preimage(xb)
        w = tuple(_add(_mul(p, n), q) for p, q, n in zip(wa, wb, b.workers, strict=True))
        s = tuple(_add(_mul(p, n), q) for p, q, n in zip(sa, sb, b.steps, strict=True))
        return w, s

    def __str__(self) -> str:
        if self.kind == "product":
            return f"({self.parts[0]} * {self.parts[1]})"
        return f"{self.kind}({', '.join(_text(e) for e in self.extents)})"

    def coverage(self, domain_extents: Sequence[Coord], assume: Fm.F = Fm.TRUE) -> Obligation:
        """The obligation that this map covers ``[0, n_1) x .. x [0, n_r)``
        exactly (module docstring); ``assume`` constrains the symbols (each
        symbol is an extent, ``>= 0``, in any case)."""
        dom = tuple(_extent(x) for x in domain_extents)
        if len(dom) != self.rank:
            raise TaskMapError(f"a rank-{self.rank} task map cannot cover a rank-{len(dom)} "
                               "domain")
        r = self.rank
        xs = [E.Var(f"x{d}") for d in range(r)]
        w1, s1 = [E.Var(f"w{d}") for d in range(r)], [E.Var(f"s{d}") for d in range(r)]
        w2, s2 = [E.Var(f"w{d}'") for d in range(r)], [E.Var(f"s{d}'") for d in range(r)]
        wb, sb = [E.Var(f"wb{d}") for d in range(r)], [E.Var(f"sb{d}") for d in range(r)]
        W, S = self.workers, self.steps
        in_dom = Fm.in_box(xs, dom)
        surj = Fm.implies(in_dom, Fm.exists(
            [v.name for v in wb + sb],
            Fm.conj(Fm.in_box(wb, W), Fm.in_box(sb, S), Fm.eqs(self.assign(wb, sb), xs))))
        t1, t2 = self.assign(w1, s1), self.assign(w2, s2)
        inj = Fm.neg(Fm.conj(Fm.in_box(w1, W), Fm.in_box(s1, S), Fm.in_box(w2, W),
                             Fm.in_box(s2, S), Fm.differs(w1 + s1, w2 + s2), Fm.eqs(t1, t2),
                             Fm.in_box(t1, dom)))
        concl = Fm.conj(surj, inj)
        syms = sorted(Fm.syms(concl))
        base = Fm.conj(assume, *(Fm.atom(E.Sym(n).ge(0)) for n in syms))
        names = tuple(v.name for v in xs + w1 + s1 + w2 + s2)
        claim = Fm.Claim(names, Fm.TRUE, concl, base)
        pw, ps = self.preimage(xs)
        lemma_concl = Fm.conj(
            Fm.implies(in_dom, Fm.conj(Fm.in_box(pw, W), Fm.in_box(ps, S),
                                       Fm.eqs(self.assign(pw, ps), xs))), inj)
        lemma = Fm.Claim(names, Fm.TRUE, lemma_concl, base)
        info = {v.name: VarInfo(v.name) for v in xs + w1 + s1 + w2 + s2}
        dom_text = " x ".join(f"[0, {_text(n)})" for n in dom)

        def explain(pt: dict) -> list[str]:
            env = Fm.env_of(pt, syms)
            x = tuple(pt.get(v.name) for v in xs)
            if Fm.evaluate(in_dom, env) and not _safe(surj, env):
                return [f"domain point {x} is never covered by {self}"]
            a = (tuple(pt.get(v.name) for v in w1), tuple(pt.get(v.name) for v in s1))
            b = (tuple(pt.get(v.name) for v in w2), tuple(pt.get(v.name) for v in s2))
            t = tuple(E.evaluate(E.lift(e), env) for e in t1)
            return [(f"domain point {t} is covered twice: by worker {a[0]} at step {a[1]} and "
                    f"by worker {b[0]} at step {b[1]}")]

        return Obligation(
            COVERAGE, f"{self} covers {dom_text} exactly", (), claim, lemma=lemma, info=info,
            explain=explain, witness={"map": self, "domain": dom})


def _safe(f: Fm.F, env: dict) -> bool:
    try:
        return Fm.evaluate(f, env)
    except Fm.Undecided:
        return True


def _text(x: Coord) -> str:
    return str(x) if isinstance(x, int) else E.to_str(x)


def spatial(*extents: Coord) -> TaskMap:
    """``prod(extents)`` distinct workers, one task each (worker = task)."""
    return TaskMap("spatial", tuple(_extent(x) for x in extents))


def repeat(*extents: Coord) -> TaskMap:
    """One worker running ``prod(extents)`` tasks in sequence (step = task)."""
    return TaskMap("repeat", tuple(_extent(x) for x in extents))
