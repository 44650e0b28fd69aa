"""Known facts about index variables, and range restriction of loops.

Guards (view bounds, domain predicates) are conjunctions of comparisons of
index expressions. A comparison ``a < b``, ``a <= b``, ``a > b`` or ``a >= b``
over the integers is *normalized* to one linear expression ``L`` with
``cmp <=> L >= 0`` (``a < b`` becomes ``b - a - 1``). A set of known facts
``L_f >= 0`` implies ``L_g >= 0`` when ``L_g - L_f`` is a non-negative constant
for some fact (a sound, cheap, incomplete check: it never claims an
implication that does not hold).

Range restriction: for a loop variable ``v`` over ``[0, T)``, every conjunct
whose normal form is ``c*v + rest`` with ``c = +-1`` and ``rest`` free of ``v``
and of deeper loop variables bounds ``v`` (``v >= -rest`` or ``v <= rest``).
Inside ``[max(0, lo...), min(T, hi...))`` those conjuncts hold, so guards that
they imply can be dropped there; outside, the guarded code runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..semantics import expr as E


def conjuncts(p: E.Pred) -> list[E.Pred]:
    """The top-level conjuncts of ``p`` (``true`` has none)."""
    if p == E.TRUE:
        return []
    if isinstance(p, E.PAnd):
        out: list[E.Pred] = []
        for q in p.items:
            out.extend(conjuncts(q))
        return out
    return [p]


def normalize(p: E.Pred) -> E.Expr | None:
    """``L`` with ``p <=> L >= 0`` over the integers, or None (==, !=, or/not)."""
    if not isinstance(p, E.Cmp):
        return None
    a, b = p.a, p.b
    if p.op == ">=":
        return a - b
    if p.op == ">":
        return a - b - 1
    if p.op == "<=":
        return b - a
    if p.op == "<":
        return b - a - 1
    return None


def _lin(e: E.Expr) -> tuple[dict[E.Expr, int], int]:
    """``e``'s linear form with zero coefficients dropped: two expressions
    differ by a constant exactly when their coefficient maps are equal."""
    d, k = E._linear(e)
    return {a: v for a, v in d.items() if v != 0}, k


@dataclass
class Facts:
    """A stack of known-true normalized conjuncts (``L >= 0``), each kept with
    its linear form so implication tests compare coefficient maps instead of
    building difference expressions."""

    items: list[E.Expr]
    forms: list[tuple[dict[E.Expr, int], int]]

    def __init__(self) -> None:
        self.items = []
        self.forms = []

    def implied(self, p: E.Pred) -> bool:
        """Whether ``p`` follows from the known facts (sound, incomplete): the
        goal ``L >= 0`` is implied when ``L - f`` or ``L - f - g`` is a
        non-negative constant for known facts ``f``, ``g``."""
        if p == E.TRUE:
            return True
        if isinstance(p, E.PAnd):
            return all(self.implied(q) for q in p.items)
        n = normalize(p)
        if n is None:
            return False
        if isinstance(n, E.Const):
            return n.value >= 0
        dn, kn = _lin(n)
        for df, kf in reversed(self.forms):
            if df == dn and kn - kf >= 0:
                return True
        # sums of two facts (e.g. i >= 0 and p >= 0 give i + p >= 0), over facts
        # whose atoms all occur in the goal
        atoms = set(dn)
        rel = [(df, kf) for df, kf in self.forms if df and set(df) <= atoms]
        for i, (df, kf) in enumerate(rel):
            for dg, kg in rel[i:]:
                if kn - kf - kg < 0:
                    continue
                s = dict(df)
                for a, v in dg.items():
                    s[a] = s.get(a, 0) + v
                if {a: v for a, v in s.items() if v != 0} == dn:
                    return True
        return False

    def push(self, preds: list[E.Pred]) -> int:
        """Add facts; returns the mark to :meth:`pop` back to."""
        mark = len(self.items)
        for p in preds:
            for q in conjuncts(p):
                n = normalize(q)
                if n is not None:
                    self.items.append(n)
                    self.forms.append(_lin(n))
        return mark

    def pop(self, mark: int) -> None:
        del self.items[mark:]
        del self.forms[mark:]


def residual(preds: list[E.Pred], facts: Facts) -> E.Pred:
    """The conjunction of the conjuncts of ``preds`` not implied by ``facts``."""
    keep = []
    for p in preds:
        for q in conjuncts(p):
            if not facts.implied(q):
                keep.append(q)
    return E.pand(*keep)


def var_bound(p: E.Pred, v: str, inner: set[str]) -> tuple[str, E.Expr] | None:
    """If ``p`` bounds loop variable ``v`` with unit coefficient and nothing
    deeper, ``('lo', e)`` for ``v >= e`` or ``('hi', e)`` for ``v < e``."""
    n = normalize(p)
    if n is None:
        return None
    d, k = E._linear(n)
    c = d.get(E.Var(v), 0)
    if c not in (1, -1):
        return None
    rest = E._build({a: x for a, x in d.items() if a != E.Var(v)}, k)
    for leaf in E.leaves(rest):
        if isinstance(leaf, E.Var) and (leaf.name == v or leaf.name in inner):
            return None
    if any(isinstance(a, (E.FloorDiv, E.Mod, E.MinMax, E.Mul)) and E.Var(v) in E.leaves(a)
           for a in d):
        return None
    if c == 1:  # v + rest >= 0  <=>  v >= -rest
        return "lo", -rest
    return "hi", rest + 1  # rest - v >= 0  <=>  v <= rest  <=>  v < rest + 1


def mentions(p: E.Pred | E.Expr, names: set[str]) -> bool:
    return any(isinstance(leaf, E.Var) and leaf.name in names for leaf in E.leaves(p))


def split_range(guards: list[E.Pred], v: str, extent: E.Expr, inner: set[str]
                ) -> tuple[E.Expr, E.Expr, list[E.Pred], list[E.Pred]]:
    """Restrict ``v in [0, extent)`` by the unit-coefficient conjuncts of ``guards``.

    Returns ``(lo, hi, used, outer)``: the main range ``[lo, hi)`` (``lo >= 0``,
    ``hi <= extent``; empty when ``lo >= hi``), the conjuncts that hold
    throughout it, and the conjuncts that do not mention ``v`` or any ``inner``
    variable (decidable once, outside the loop)."""
    lo: E.Expr = E.Const(0)
    hi: E.Expr = extent
    used: list[E.Pred] = []
    outer: list[E.Pred] = []
    for g in guards:
        for q in conjuncts(g):
            if not mentions(q, {v} | inner):
                outer.append(q)
                continue
            b = var_bound(q, v, inner)
            if b is None:
                continue
            if b[0] == "lo":
                lo = E.maximum(lo, b[1])
            else:
                hi = E.minimum(hi, b[1])
            used.append(q)
    return lo, hi, used, outer


def upper_bounds(preds: list[E.Pred], names: dict[str, object]) -> dict[object, E.Expr]:
    """For each variable ``v`` of ``names`` (variable name -> key), the least
    upper bound ``e`` that ``preds`` state for it alone (a unit-coefficient
    conjunct ``v < e`` with ``e`` free of every variable of ``names``): where
    ``v >= e`` the conjunction is false. Keys without such a conjunct are
    absent."""
    out: dict[object, E.Expr] = {}
    for v, key in names.items():
        inner = set(names) - {v}
        for g in preds:
            for q in conjuncts(g):
                b = var_bound(q, v, inner)
                if b is not None and b[0] == "hi":
                    out[key] = E.minimum(out[key], b[1]) if key in out else b[1]
    return out
