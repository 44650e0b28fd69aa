"""The assertion IR: the small logic every obligation is stated in.

A :class:`Claim` is the sentence

    forall params, vars:  assumptions(params) and hyp(params, vars)  =>  concl(params, vars)

whose terms are the index expressions of :mod:`tilenest.semantics.expr`:
``Sym`` leaves are kernel parameters (symbolic extents), ``Var`` leaves are
coordinates, and ``Val`` leaves are data-dependent scalars (treated as further
universally quantified integers, see ``obligation.py``). Formulas are built from
predicates (:class:`Atom`), ``And``/``Or``/``Not`` and ``Exists``; ``Exists`` is
what coverage statements need (``every old point has a new preimage``).

A claim is decided through its **counterexample set**
``assumptions and hyp and not concl``: the claim holds iff that set is empty, and
any point of it is a counterexample. The two solver layers (``isl_engine.py``,
``z3_engine.py``) each translate this IR in exactly one place; this module also
evaluates a formula at a concrete point (:func:`evaluate`), which is how every
solver counterexample is re-checked before it is reported.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ..semantics import expr as E
from ..semantics.expr import Expr, Pred


class F:
    """Base of formulas."""

    __slots__ = ()

    def __and__(self, o: F) -> F:
        return conj(self, o)

    def __or__(self, o: F) -> F:
        return disj(self, o)

    def __invert__(self) -> F:
        return neg(self)

    def __str__(self) -> str:
        return to_text(self)


@dataclass(frozen=True)
class Atom(F):
    """A predicate of the expression layer (comparisons and their boolean forms)."""

    pred: Pred


@dataclass(frozen=True)
class And(F):
    items: tuple[F, ...]


@dataclass(frozen=True)
class Or(F):
    items: tuple[F, ...]


@dataclass(frozen=True)
class Not(F):
    item: F


@dataclass(frozen=True)
class Exists(F):
    """``exists vars: body`` (the variables are ``Var`` names bound here)."""

    vars: tuple[str, ...]
    body: F


TRUE = Atom(E.TRUE)
FALSE = Atom(E.FALSE)


def atom(p: Pred) -> F:
    return Atom(p)


def conj(*fs: F) -> F:
    items: list[F] = []
    for f in fs:
        if f == FALSE:
            return FALSE
        if f == TRUE:
            continue
        items.extend(f.items if isinstance(f, And) else (f,))
    items = list(dict.fromkeys(items))
    if not items:
        return TRUE
    return items[0] if len(items) == 1 else And(tuple(items))


def disj(*fs: F) -> F:
    items: list[F] = []
    for f in fs:
        if f == TRUE:
            return TRUE
        if f == FALSE:
            continue
        items.extend(f.items if isinstance(f, Or) else (f,))
    items = list(dict.fromkeys(items))
    if not items:
        return FALSE
    return items[0] if len(items) == 1 else Or(tuple(items))


def neg(f: F) -> F:
    if f == TRUE:
        return FALSE
    if f == FALSE:
        return TRUE
    if isinstance(f, Not):
        return f.item
    return Not(f)


def implies(a: F, b: F) -> F:
    return disj(neg(a), b)


def exists(vars_: Sequence[str], body: F) -> F:
    vs = tuple(v for v in vars_ if v in free_vars(body))
    return Exists(vs, body) if vs else body


def eqs(a: Sequence[E.IntLike], b: Sequence[E.IntLike]) -> F:
    """Componentwise equality of two tuples."""
    return conj(*(Atom(E.lift(x).eq(y)) for x, y in zip(a, b, strict=True)))


def differs(a: Sequence[E.IntLike], b: Sequence[E.IntLike]) -> F:
    """The tuples differ in some component (``FALSE`` for empty tuples)."""
    return disj(*(Atom(E.lift(x).ne(y)) for x, y in zip(a, b, strict=True)))


def lex_lt(a: Sequence[E.IntLike], b: Sequence[E.IntLike]) -> F:
    """``a`` precedes ``b`` lexicographically."""
    out: list[F] = []
    for k in range(len(a)):
        out.append(conj(eqs(a[:k], b[:k]), Atom(E.lift(a[k]).lt(b[k]))))
    return disj(*out)


def in_box(coords: Sequence[E.IntLike], extents: Sequence[E.IntLike]) -> F:
    """``0 <= c_d < e_d`` for every component."""
    return conj(*(conj(Atom(E.lift(c).ge(0)), Atom(E.lift(c).lt(e)))
                  for c, e in zip(coords, extents, strict=True)))


# ---------------------------------------------------------------------------
# traversal


def _leaves_f(f: F, bound: frozenset[str] = frozenset()) -> Iterable[tuple[Expr, frozenset]]:
    if isinstance(f, Atom):
        for lf in E.leaves(f.pred):
            yield lf, bound
    elif isinstance(f, (And, Or)):
        for g in f.items:
            yield from _leaves_f(g, bound)
    elif isinstance(f, Not):
        yield from _leaves_f(f.item, bound)
    elif isinstance(f, Exists):
        yield from _leaves_f(f.body, bound | frozenset(f.vars))


def free_vars(f: F) -> set[str]:
    """Names of the free ``Var`` leaves."""
    return {lf.name for lf, b in _leaves_f(f) if isinstance(lf, E.Var) and lf.name not in b}


def ordered_vars(*fs: F) -> tuple[str, ...]:
    """The free variables of ``fs``, each once: sorted within a formula, in
    order of the formulas (the variable order of a claim)."""
    out: list[str] = []
    for f in fs:
        for v in sorted(free_vars(f)):
            if v not in out:
                out.append(v)
    return tuple(out)


def syms(f: F) -> set[str]:
    return {lf.name for lf, _ in _leaves_f(f) if isinstance(lf, E.Sym)}


def vals(f: F) -> set[str]:
    """Names of data-dependent ``Val`` leaves."""
    return {lf.name for lf, _ in _leaves_f(f) if isinstance(lf, E.Val)}


def atoms(f: F) -> Iterable[Pred]:
    if isinstance(f, Atom):
        yield f.pred
    elif isinstance(f, (And, Or)):
        for g in f.items:
            yield from atoms(g)
    elif isinstance(f, Not):
        yield from atoms(f.item)
    elif isinstance(f, Exists):
        yield from atoms(f.body)


def is_affine(f: F) -> bool:
    """Every atom lies in the quasi-affine (Presburger) fragment (``Val`` leaves
    count as free integers, so they do not break affinity)."""
    def ok(p: Pred) -> bool:
        return E.is_quasi_affine(E.subst(p, {v: E.Var("%" + v.name) for v in E.leaves(p)
                                            if isinstance(v, E.Val)}))
    return all(ok(p) for p in atoms(f))


def non_affine_terms(f: F) -> list[str]:
    """Printed atoms outside the quasi-affine fragment (for ``unknown`` reasons)."""
    out = []
    for p in atoms(f):
        q = E.subst(p, {v: E.Var("%" + v.name) for v in E.leaves(p) if isinstance(v, E.Val)})
        if not E.is_quasi_affine(q):
            out.append(E.pred_to_str(p))
    return out


def subst(f: F, m: Mapping[Expr, E.IntLike]) -> F:
    """Substitute leaves (bound variables of ``Exists`` are never replaced)."""
    if not m:
        return f
    if isinstance(f, Atom):
        return Atom(E.subst(f.pred, m))
    if isinstance(f, And):
        return conj(*(subst(g, m) for g in f.items))
    if isinstance(f, Or):
        return disj(*(subst(g, m) for g in f.items))
    if isinstance(f, Not):
        return neg(subst(f.item, m))
    if isinstance(f, Exists):
        inner = {k: v for k, v in m.items() if not (isinstance(k, E.Var) and k.name in f.vars)}
        return Exists(f.vars, subst(f.body, inner))
    raise TypeError(f)


def rename(f: F, names: Mapping[str, str]) -> F:
    """Rename ``Var`` leaves (free and bound) by name."""
    if isinstance(f, Exists):
        return Exists(tuple(names.get(v, v) for v in f.vars), rename(f.body, names))
    if isinstance(f, Atom):
        return Atom(E.rename(f.pred, names))
    if isinstance(f, And):
        return conj(*(rename(g, names) for g in f.items))
    if isinstance(f, Or):
        return disj(*(rename(g, names) for g in f.items))
    if isinstance(f, Not):
        return neg(rename(f.item, names))
    raise TypeError(f)


# ---------------------------------------------------------------------------
# printing


def to_text(f: F, prec: int = 0) -> str:
    """Readable form: ``and``/``or``/``not``, ``exists v: ...``."""
    if isinstance(f, Atom):
        s = E.pred_to_str(f.pred)
        return f"({s})" if prec > 2 and isinstance(f.pred, (E.POr, E.PAnd)) else s
    if isinstance(f, And):
        s = " and ".join(to_text(g, 3) for g in f.items)
        return f"({s})" if prec > 2 else s
    if isinstance(f, Or):
        s = " or ".join(to_text(g, 2) for g in f.items)
        return f"({s})" if prec > 1 else s
    if isinstance(f, Not):
        return "not " + to_text(f.item, 4)
    if isinstance(f, Exists):
        s = f"exists {', '.join('$' + v for v in f.vars)}: {to_text(f.body, 0)}"
        return f"({s})" if prec > 0 else s
    raise TypeError(f)


# ---------------------------------------------------------------------------
# claims


@dataclass(frozen=True)
class Claim:
    """``forall params, vars: assume and hyp => concl``.

    ``vars`` lists the universally quantified coordinates in reporting order
    (every free ``Var`` of ``hyp``/``concl`` must be listed); ``assume`` is over
    parameters only (the program's assumptions and ``extent >= 0`` facts)."""

    vars: tuple[str, ...]
    hyp: F
    concl: F
    assume: F = TRUE

    def __post_init__(self) -> None:
        free = free_vars(self.hyp) | free_vars(self.concl)
        missing = free - set(self.vars)
        if missing:
            raise ValueError(f"claim has unlisted free variables {sorted(missing)}")

    @property
    def params(self) -> tuple[str, ...]:
        return tuple(sorted(syms(self.assume) | syms(self.hyp) | syms(self.concl)))

    @property
    def data(self) -> tuple[str, ...]:
        return tuple(sorted(vals(self.hyp) | vals(self.concl)))

    def counterexample_set(self) -> F:
        """The points refuting the claim: ``assume and hyp and not concl``."""
        return conj(self.assume, self.hyp, neg(self.concl))

    def text(self) -> str:
        qs = ", ".join(list(self.params) + ["$" + v for v in self.vars])
        body = f"{to_text(self.hyp, 1)}  =>  {to_text(self.concl, 1)}" \
            if self.hyp != TRUE else to_text(self.concl)
        pre = f"forall {qs}: " if qs else ""
        return pre + body


# ---------------------------------------------------------------------------
# concrete evaluation (re-checking counterexamples)

#: most points an ``Exists`` may enumerate when evaluated concretely
ENUM_LIMIT = 1 << 18


class Undecided(Exception):
    """A formula could not be evaluated concretely (unbounded ``Exists``)."""


def env_of(assignment: Mapping[str, int], params: Iterable[str]) -> dict[Expr, int]:
    """Environment for :func:`tilenest.semantics.expr.evaluate`: parameters as
    ``Sym``, ``%name`` entries as ``Val``, the rest as ``Var``."""
    ps = set(params)
    env: dict[Expr, int] = {}
    for k, v in assignment.items():
        if k.startswith("%"):
            env[E.Val(k[1:])] = int(v)
        elif k in ps:
            env[E.Sym(k)] = int(v)
        else:
            env[E.Var(k)] = int(v)
    return env


def evaluate(f: F, env: Mapping[Expr, int]) -> bool:
    """The truth of ``f`` at a point; ``Exists`` is decided by enumerating the
    box its body's own constraints give each bound variable (``Undecided`` when
    no finite box is found or it is too large)."""
    if isinstance(f, Atom):
        return bool(E.evaluate(f.pred, env))
    if isinstance(f, And):
        return all(evaluate(g, env) for g in f.items)
    if isinstance(f, Or):
        return any(evaluate(g, env) for g in f.items)
    if isinstance(f, Not):
        return not evaluate(f.item, env)
    if isinstance(f, Exists):
        budget = [ENUM_LIMIT]
        return _search(f.vars, f.body, dict(env), budget)
    raise TypeError(f)


def _search(vars_: Sequence[str], body: F, env: dict, budget: list[int]) -> bool:
    """Enumerate the bound variables one at a time (a later variable's range may
    depend on earlier ones) until ``body`` holds."""
    if not vars_:
        budget[0] -= 1
        if budget[0] < 0:
            raise Undecided("exists: enumeration budget exhausted")
        try:
            return evaluate(body, env)
        except (KeyError, ZeroDivisionError):
            return False
    v, rest = vars_[0], vars_[1:]
    lo, hi = _range_of(v, body, env)
    if hi - lo > ENUM_LIMIT:
        raise Undecided(f"exists over {hi - lo} values of ${v}")
    for x in range(lo, hi):
        env[E.Var(v)] = x
        if _search(rest, body, env, budget):
            return True
    env.pop(E.Var(v), None)
    return False


def _range_of(v: str, body: F, env: Mapping[Expr, int]) -> tuple[int, int]:
    """``[lo, hi)`` from conjuncts ``v >= e`` / ``v < e`` / ``v = e`` whose other
    side is evaluable in ``env`` (a quick interval search)."""
    lo: int | None = None
    hi: int | None = None
    conjuncts = body.items if isinstance(body, And) else (body,)
    x = E.Var(v)
    for c in conjuncts:
        if not isinstance(c, Atom):
            continue
        preds = c.pred.items if isinstance(c.pred, E.PAnd) else (c.pred,)
        for p in preds:
            if not isinstance(p, E.Cmp):
                continue
            for a, op, b in ((p.a, p.op, p.b), (p.b, _flip(p.op), p.a)):
                if a != x or x in E.leaves(b):
                    continue
                try:
                    val = int(E.evaluate(b, env))
                except (KeyError, ZeroDivisionError):
                    continue
                if op in (">=", "=="):
                    lo = val if lo is None else max(lo, val)
                if op == ">":
                    lo = val + 1 if lo is None else max(lo, val + 1)
                if op in ("<=", "=="):
                    hi = val + 1 if hi is None else min(hi, val + 1)
                if op == "<":
                    hi = val if hi is None else min(hi, val)
    if lo is None or hi is None:
        raise Undecided(f"no finite range for ${v}")
    return lo, hi


def _flip(op: str) -> str:
    return {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}[op]
