"""Laws of a custom float reducer over the reals, division included.

A float contract claims an algebra over the real numbers; its IEEE rounding is
what a tree policy's permission admits (``spec/reductions.md`` R-11). This
module decides that claim with Z3's nonlinear real arithmetic.

**Division.** A quotient ``a / b`` is a fresh real ``q`` with the cleared
denominator ``b != 0 => q * b = a``, and it is *defined* only where ``b != 0``.
Definedness propagates: an operation is defined when its operands are, an
``ite`` when its condition and the *selected* branch are (so a guarded quotient
``ite(n > 0, x / n, 0)`` is defined at ``n = 0``). A law holds at a point when
both sides are defined and equal; a merge that divides by zero at a state the
reduction can form is a counterexample (the same trees give NaN in floats).

**Reachable states.** A law need only hold on the states a reduction can
form: its identity ``e`` and the states reachable from contributions by
merging. Write ``Dom(s) = (s = e) or I(s)`` where ``I`` is an *invariant*,
inferred as a conjunction of bounds ``s_i >= c`` / ``s_i <= c``:

* candidates are the bounds every contribution meets (the region's body
  applied to the identity, as the interpreter computes contributions, spec
  R-6): a component that is the same constant ``c`` in every contribution
  gives ``>= c`` and ``<= c`` (Welford's count ``1``), any other the bounds
  ``>= v`` / ``<= v`` for ``v`` its identity value or 0 that hold for every
  input (a max of absolute values: ``>= 0``);
* a candidate false at a seed that is a known constant other than ``e`` is
  dropped; a seed that is not a known constant drops every candidate;
* the rest is made inductive (Houdini): while some ``a, b`` in ``Dom`` have a
  defined ``merge(a, b)`` outside ``Dom``, the candidates false there are
  dropped. The result holds at every contribution and seed and is closed
  under merge, so every partial state of every tree lies in ``Dom``.

No candidate (or a body the inference cannot read) gives ``I = true``: the laws
over all real states. **Exponentials.** ``exp`` is decided through its laws, not its values: an
argument that is piecewise linear in atoms (state components, inputs,
quotients) with small integer coefficients, ``sum c_i x_i + k``, becomes
``prod P_i^c_i * K_k`` in each piece (``ite`` and ``maximum`` give the pieces),
where ``P_i > 0`` stands for ``exp(x_i)`` with its inverse ``Q_i`` (``P_i Q_i =
1``) and ``K_k > 0`` for ``exp(k)``. Every fact used holds of the real
exponential, so a proof is sound; a counterexample found this way is
re-evaluated with the real ``exp`` and kept only if the law fails there too
(else the answer is *unknown*). Any other argument is a fresh positive real.
This decides the merge of online-softmax states ``(m, l, acc)``.

**Infinities.** An identity component may be an IEEE infinity (the running
maximum of an empty softmax state is ``-inf``). State components are finite
reals, so every operation on an infinity is decided statically as IEEE does
it: ``-inf + x = -inf``, ``exp(-inf) = 0``, ``maximum(-inf, x) = x``; a NaN
(``-inf - -inf``, ``0 * inf``) is *undefined*, like a division by zero. When
the identity is not a real state, ``Dom`` always includes it as a case.

The laws are then::

    associative  forall a, b, c in Dom: m(m(a, b), c) = m(a, m(b, c))
    commutative  forall a, b in Dom:    m(a, b) = m(b, a)
    identity     forall a in Dom:       m(e, a) = a = m(a, e)
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from ..semantics.ir import Block, Operation, TileProgram
from ..semantics.reducers import CustomReducer
from .z3_engine import Answer, limit

#: scalar ops with a meaning over the reals (names as in ``semantics/ops/values``)
_ARITH = ("add", "sub", "mul", "div", "maximum", "minimum")
_COMPARE = ("lt", "le", "gt", "ge", "eq", "ne")


class Undecidable(Exception):
    """The merge (or a body) uses something without a real meaning here."""


class Infinity:
    """An IEEE infinity in the place of a real term (module docstring)."""

    __slots__ = ("sign",)

    def __init__(self, sign: int) -> None:
        self.sign = sign

    def __repr__(self) -> str:
        return "inf" if self.sign > 0 else "-inf"


NEG_INF, POS_INF = Infinity(-1), Infinity(1)


def _inf(sign: int) -> Infinity:
    return POS_INF if sign > 0 else NEG_INF


def is_inf(t: Any) -> bool:
    return isinstance(t, Infinity)


class _Nonlinear(Exception):
    """An ``exp`` argument outside the piecewise linear forms."""


#: the largest |coefficient| an ``exp`` argument's atom may have, and the most
#: pieces, before the argument is taken as opaque
_MAX_COEF, _MAX_PIECES = 4, 64


@dataclass(frozen=True)
class Bound:
    """One conjunct of an invariant: ``s[index] >= value`` (``lower``) or ``<=``."""

    index: int
    value: Fraction
    lower: bool

    def text(self) -> str:
        v = self.value
        num = str(v.numerator) if v.denominator == 1 else f"{float(v)!r}"
        return f"s[{self.index}] {'>=' if self.lower else '<='} {num}"


class Reals:
    """Scalar ops over Z3 reals, each value a pair ``(term, defined)``."""

    def __init__(self) -> None:
        import z3

        self.z3 = z3
        self.side: list[Any] = []  # cleared denominators of every quotient made
        self.fresh = itertools.count()
        self.defs: dict[str, Any] = {}  # named merge results: name -> defining term
        self.atoms: dict[str, Any] = {}  # exp arguments' atoms by name
        self.powers: dict[str, tuple[Any, Any]] = {}  # atom -> (exp(atom), exp(-atom))
        self.consts: dict[Fraction, Any] = {}  # k -> exp(k)
        self.used_exp = False

    def const(self, v: Any) -> tuple[Any, Any]:
        z3 = self.z3
        if isinstance(v, bool):
            return z3.BoolVal(v), z3.BoolVal(True)
        f = float(v)
        if f != f:
            raise Undecidable(f"the constant {v} has no real counterpart")
        if f in (float("inf"), float("-inf")):
            return _inf(1 if f > 0 else -1), z3.BoolVal(True)
        return z3.RealVal(Fraction(f)), z3.BoolVal(True)

    def same(self, x: Any, y: Any) -> Any:
        """``x = y`` for terms that may be infinities."""
        if is_inf(x) or is_inf(y):
            return self.z3.BoolVal(is_inf(x) and is_inf(y) and x.sign == y.sign)
        return x == y

    def at_least(self, x: Any, v: Fraction, lower: bool) -> Any:
        """``x >= v`` (``lower``) or ``x <= v``, ``x`` possibly an infinity."""
        if is_inf(x):
            return self.z3.BoolVal((x.sign > 0) == lower)
        return x >= self.z3.RealVal(v) if lower else x <= self.z3.RealVal(v)

    def var(self, name: str, boolean: bool = False) -> tuple[Any, Any]:
        z3 = self.z3
        return (z3.Bool(name) if boolean else z3.Real(name)), z3.BoolVal(True)

    def apply(self, name: str, ins: Sequence[tuple[Any, Any]]) -> tuple[Any, Any]:
        """The op ``name`` on ``ins``; :class:`Undecidable` for any other op."""
        z3 = self.z3
        terms = [t for t, _ in ins]
        ok = z3.And([d for _, d in ins]) if ins else z3.BoolVal(True)
        if name == "ite":
            c, a, b = ins
            cond = z3.simplify(c[0])
            if z3.is_true(cond) or z3.is_false(cond):
                pick = a if z3.is_true(cond) else b
                return pick[0], z3.And(c[1], pick[1])
            if is_inf(a[0]) or is_inf(b[0]):
                if not (is_inf(a[0]) and is_inf(b[0]) and a[0].sign == b[0].sign):
                    raise Undecidable("a condition on the state chooses between an "
                                      "infinity and a real")
                return a[0], z3.And(c[1], z3.If(c[0], a[1], b[1]))
            return z3.If(c[0], a[0], b[0]), z3.And(c[1], z3.If(c[0], a[1], b[1]))
        if any(is_inf(t) for t in terms):
            return self._extended(name, terms, ok)
        if name == "exp":
            self.used_exp = True
            return self._exp(terms[0]), ok
        if name == "div":
            a, b = terms
            q = z3.Real(f"q!{next(self.fresh)}")
            self.side.append(z3.Implies(b != 0, q * b == a))
            return q, z3.And(ok, b != 0)
        table = {
            "add": lambda: terms[0] + terms[1], "sub": lambda: terms[0] - terms[1],
            "mul": lambda: terms[0] * terms[1], "neg": lambda: -terms[0],
            "abs": lambda: z3.If(terms[0] >= 0, terms[0], -terms[0]),
            "maximum": lambda: z3.If(terms[0] >= terms[1], terms[0], terms[1]),
            "minimum": lambda: z3.If(terms[0] <= terms[1], terms[0], terms[1]),
            "lt": lambda: terms[0] < terms[1], "le": lambda: terms[0] <= terms[1],
            "gt": lambda: terms[0] > terms[1], "ge": lambda: terms[0] >= terms[1],
            "eq": lambda: terms[0] == terms[1], "ne": lambda: terms[0] != terms[1],
            "and": lambda: z3.And(terms[0], terms[1]), "or": lambda: z3.Or(terms[0], terms[1]),
            "xor": lambda: z3.Xor(terms[0], terms[1]), "not": lambda: z3.Not(terms[0]),
        }
        if name not in table:
            raise Undecidable(f"op '{name}' has no meaning over the reals here")
        return table[name](), ok

    def _extended(self, name: str, terms: list[Any], ok: Any) -> tuple[Any, Any]:
        """``name`` with an infinite operand, decided as IEEE does (module
        docstring); a NaN result is undefined."""
        z3 = self.z3
        nan = (z3.RealVal(0), z3.BoolVal(False))

        def sign(t: Any) -> int:
            if is_inf(t):
                return t.sign
            t = z3.simplify(t)
            if not z3.is_rational_value(t):
                raise Undecidable(f"'{name}' of an infinity and a state: its sign is not known")
            v = Fraction(t.as_fraction())
            return (v > 0) - (v < 0)

        def rank(t: Any) -> int:
            return t.sign if is_inf(t) else 0

        if name in ("neg", "abs"):
            return _inf(-terms[0].sign if name == "neg" else 1), ok
        if name in ("add", "sub"):
            a, b = terms
            sb = -b.sign if (name == "sub" and is_inf(b)) else (b.sign if is_inf(b) else 0)
            if is_inf(a) and sb and a.sign != sb:
                return nan
            return _inf(a.sign if is_inf(a) else sb), ok
        if name == "mul":
            s_ = sign(terms[0]) * sign(terms[1])
            return (_inf(s_), ok) if s_ else nan
        if name == "div":
            a, b = terms
            if is_inf(a) and is_inf(b):
                return nan
            if is_inf(b):
                return z3.RealVal(0), ok
            s_ = a.sign * sign(b)
            return (_inf(s_), ok) if s_ else nan
        if name in ("maximum", "minimum"):
            a, b = terms
            hi = name == "maximum"
            for x, y in ((a, b), (b, a)):
                if is_inf(x):
                    return (x if (x.sign > 0) == hi else y), ok
        if name == "exp":
            return (z3.RealVal(0) if terms[0].sign < 0 else POS_INF), ok
        cmp = {"lt": lambda p, q: p < q, "le": lambda p, q: p <= q, "gt": lambda p, q: p > q,
               "ge": lambda p, q: p >= q, "eq": lambda p, q: p == q, "ne": lambda p, q: p != q}
        if name in cmp:
            return z3.BoolVal(cmp[name](rank(terms[0]), rank(terms[1]))), ok
        raise Undecidable(f"op '{name}' of an infinity has no meaning here")

    # -- exp through its laws -----------------------------------------------

    def _linear(self, e: Any) -> list[tuple[Any, dict[str, Fraction], Fraction]]:
        """``e`` as pieces ``(condition, {atom: coefficient}, constant)``."""
        z3 = self.z3
        if z3.is_rational_value(e):
            return [(z3.BoolVal(True), {}, Fraction(e.as_fraction()))]
        if z3.is_const(e) and e.decl().kind() == z3.Z3_OP_UNINTERPRETED:
            n = str(e)
            if n in self.defs:
                return self._linear(self.defs[n])
            self.atoms.setdefault(n, e)
            return [(z3.BoolVal(True), {n: Fraction(1)}, Fraction(0))]
        k = e.decl().kind()
        if k == z3.Z3_OP_ITE:
            c = e.arg(0)
            out = [(z3.And(c, cc), f, k0) for cc, f, k0 in self._linear(e.arg(1))]
            out += [(z3.And(z3.Not(c), cc), f, k0) for cc, f, k0 in self._linear(e.arg(2))]
        elif k in (z3.Z3_OP_ADD, z3.Z3_OP_SUB):
            out = self._linear(e.arg(0))
            sg = -1 if k == z3.Z3_OP_SUB else 1
            for i in range(1, e.num_args()):
                out = [(z3.And(c1, c2), {v: f1.get(v, 0) + sg * f2.get(v, 0)
                                         for v in set(f1) | set(f2)}, k1 + sg * k2)
                       for c1, f1, k1 in out for c2, f2, k2 in self._linear(e.arg(i))]
                if len(out) > _MAX_PIECES:
                    raise _Nonlinear
        elif k == z3.Z3_OP_UMINUS:
            out = [(c, {v: -x for v, x in f.items()}, -k0) for c, f, k0 in self._linear(e.arg(0))]
        elif k == z3.Z3_OP_MUL and e.num_args() == 2 and z3.is_rational_value(e.arg(0)):
            w = Fraction(e.arg(0).as_fraction())
            out = [(c, {v: w * x for v, x in f.items()}, w * k0)
                   for c, f, k0 in self._linear(e.arg(1))]
        else:
            raise _Nonlinear
        if len(out) > _MAX_PIECES:
            raise _Nonlinear
        return out

    def _exp_atom(self, name: str) -> tuple[Any, Any]:
        """``(exp(u), exp(-u))`` of atom ``u``, with facts of the real
        exponential: positive, inverse, above its tangent at 0 (``exp(u) >=
        1 + u``), and ordered and congruent with the other atoms'."""
        if name not in self.powers:
            z3 = self.z3
            u = self.atoms[name]
            p, q = z3.Real(f"exp({name})"), z3.Real(f"exp(-{name})")
            self.side += [p > 0, q > 0, p * q == 1, p >= 1 + u, q >= 1 - u]
            for other, (po, _) in self.powers.items():
                v = self.atoms[other]
                self.side += [z3.Implies(u == v, p == po), z3.Implies(u < v, p < po),
                              z3.Implies(v < u, po < p)]
            self.powers[name] = (p, q)
        return self.powers[name]

    def _exp_const(self, k: Fraction) -> Any:
        if k not in self.consts:
            z3 = self.z3
            v = z3.Real(f"exp!{next(self.fresh)}")
            self.side.append(v > 0 if k < 0 else (v > 1 if k > 0 else v == 1))
            if -k in self.consts:
                self.side.append(v * self.consts[-k] == 1)
            self.consts[k] = v
        return self.consts[k]

    def _exp(self, t: Any) -> Any:
        """``exp(t)`` as products of the atoms' exponentials per piece, or a
        fresh positive real when ``t`` is not piecewise linear."""
        z3 = self.z3
        try:
            pieces = self._linear(z3.simplify(t))
            if any(c.denominator != 1 or abs(c) > _MAX_COEF
                   for _, f, _ in pieces for c in f.values()):
                raise _Nonlinear
        except _Nonlinear:
            v = z3.Real(f"exp!{next(self.fresh)}")
            self.side.append(v > 0)
            return v
        vals = []
        for cond, f, k0 in pieces:
            term = z3.RealVal(1)
            for atom, c in sorted(f.items()):
                p, q = self._exp_atom(atom)
                for _ in range(abs(int(c))):
                    term = term * (p if c > 0 else q)
            if k0:
                term = term * self._exp_const(k0)
            vals.append((cond, z3.simplify(term)))
        out = vals[-1][1]
        for cond, term in reversed(vals[:-1]):
            out = z3.If(cond, term, out)
        return out


class Floats:
    """The merge on 60-digit floats with the real ``exp`` (``mpmath``), for
    checking a counterexample found with ``exp`` abstracted. NaN is undefined."""

    def __init__(self) -> None:
        import mpmath

        self.mp = mpmath.mp.clone()
        self.mp.dps = 60

    def const(self, v: Any) -> tuple[Any, bool]:
        return (v if isinstance(v, bool) else self.mp.mpf(float(v))), True

    def apply(self, name: str, ins: Sequence[tuple[Any, bool]]) -> tuple[Any, bool]:
        mp = self.mp
        t = [x for x, _ in ins]
        ok = all(d for _, d in ins)
        if name == "ite":
            pick = ins[1] if t[0] else ins[2]
            return pick[0], ok
        if name == "div" and t[1] == 0:
            return mp.mpf(0), False
        table = {
            "add": lambda: t[0] + t[1], "sub": lambda: t[0] - t[1], "mul": lambda: t[0] * t[1],
            "div": lambda: t[0] / t[1], "neg": lambda: -t[0], "abs": lambda: abs(t[0]),
            "maximum": lambda: max(t[0], t[1]), "minimum": lambda: min(t[0], t[1]),
            "exp": lambda: mp.exp(t[0]),
            "lt": lambda: t[0] < t[1], "le": lambda: t[0] <= t[1], "gt": lambda: t[0] > t[1],
            "ge": lambda: t[0] >= t[1], "eq": lambda: t[0] == t[1], "ne": lambda: t[0] != t[1],
            "and": lambda: t[0] and t[1], "or": lambda: t[0] or t[1],
            "xor": lambda: t[0] != t[1], "not": lambda: not t[0],
        }
        if name not in table:
            raise Undecidable(f"op '{name}' has no meaning over the reals here")
        v = table[name]()
        return v, ok and not (not isinstance(v, bool) and mp.isnan(v))


def run_block(alg: Reals, block: Block, args: Sequence[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """A scalar region (a reducer's merge) on real terms: its yielded values."""
    env = {a.name: v for a, v in zip(block.args, args, strict=True)}
    for op in block.ops:
        if op.name == "yield":
            return [env[o.name] for o in op.operands]
        if op.name == "const":
            out = alg.const(op.attrs["value"])
        elif op.name in ("cast", "broadcast") and len(op.operands) == 1 and _float_or_same(op):
            out = env[op.operands[0].name]
        else:
            out = alg.apply(op.name, [env[o.name] for o in op.operands])
        env[op.results[0].name] = out
    raise Undecidable("a merge region without a yield")


def _float_or_same(op: Operation) -> bool:
    """A cast between float types (or a broadcast) is the identity on reals."""
    src = getattr(op.operands[0].type, "dtype", None)
    dst = getattr(op.results[0].type, "dtype", None)
    if op.name == "broadcast":
        return True
    return src is not None and dst is not None and (src == dst or (src.is_float and dst.is_float))


def merge_fn(alg: Reals, r: CustomReducer, named: bool = False) -> Any:
    """``merge`` on real terms; ``named``: each result is a fresh variable
    defined by an equation in ``alg.side`` (nested merges then stay small
    polynomials instead of substituted terms, which nonlinear arithmetic
    decides far more steadily)."""

    def m(a: list, b: list) -> list:
        out = run_block(alg, r.merge, list(a) + list(b))
        if not named:
            return out
        z3 = alg.z3
        res = []
        for t, d in out:
            k = next(alg.fresh)
            if is_inf(t):  # an infinity is a known value, not a term to name
                res.append((t, d))
                continue
            v = z3.Bool(f"m!{k}") if z3.is_bool(t) else z3.Real(f"m!{k}")
            dv = z3.Bool(f"d!{k}")
            alg.side += [v == t, dv == d]
            alg.defs[str(v)] = t
            res.append((v, dv))
        return res

    return m


# ---------------------------------------------------------------------------
# contributions and seeds of the reduce regions under a contract


def _reads(op: Operation) -> set[str]:
    out = {o.name for o in op.operands}
    for region in op.regions:
        for inner in region.walk():
            out |= {o.name for o in inner.operands}
    return out


def contributions(r: CustomReducer, op: Operation) -> tuple[Reals, list[list[tuple[Any, Any]]]] | None:
    """For each group of states of ``op`` under ``r``: every contribution's
    components as ``(term, defined)`` over Z3 reals (the body applied to the
    identity, every value that reads no state an arbitrary real). ``None``
    when the body reads a state through an op without a real meaning here."""
    name = f"@{r.name}"
    contracts = list(op.attrs["contracts"])
    body: Block = op.regions[0]
    k = len(r.state)
    groups: list[list[int]] = []
    i = 0
    while i < len(contracts):
        if contracts[i] == name:
            groups.append(list(range(i, i + k)))
            i += k
        else:
            i += 1
    alg = Reals()
    out: list[list[tuple[Any, Any]]] = []
    try:
        for idx in groups:
            env: dict[str, tuple[Any, Any]] = {}
            state: set[str] = set()
            for j, a in enumerate(body.args):
                if j in idx:
                    env[a.name] = alg.const(r.identity[idx.index(j)])
                    state.add(a.name)
                else:
                    env[a.name] = _leaf(alg, a)
            for inner in body.ops:
                if inner.name == "yield":
                    break
                if inner.name == "const":
                    env[inner.results[0].name] = alg.const(inner.attrs["value"])
                    continue
                if not (_reads(inner) & state):
                    for res in inner.results:
                        env[res.name] = _leaf(alg, res)
                    continue
                if inner.regions:
                    raise Undecidable(f"'{inner.name}' reads a state")
                for res in inner.results:
                    state.add(res.name)
                if inner.name in ("cast", "broadcast") and _float_or_same(inner):
                    env[inner.results[0].name] = env[inner.operands[0].name]
                else:
                    env[inner.results[0].name] = alg.apply(
                        inner.name, [env[o.name] for o in inner.operands])
            y = body.terminator
            if y is None:
                return None
            out.append([tuple(x if is_inf(x) else alg.z3.simplify(x)
                              for x in env[y.operands[j].name]) for j in idx])
    except (Undecidable, KeyError):
        return None
    return alg, out


def contribution_bounds(r: CustomReducer, op: Operation) -> list[set[Bound]] | None:
    """For each group of states of ``op`` under ``r``: the bounds every
    contribution meets -- a component that is one constant ``c`` gives
    ``>= c`` and ``<= c`` (Welford's count 1); any other gives those of
    ``>= v`` / ``<= v`` for ``v`` its identity value or 0 that hold for every
    input (``|x| >= 0``, ``max(e, x) >= e``). ``None`` as for
    :func:`contributions`."""
    got = contributions(r, op)
    if got is None:
        return None
    alg, groups = got
    z3 = alg.z3
    out: list[set[Bound]] = []
    for comps in groups:
        bounds: set[Bound] = set()
        for c, (t, d) in enumerate(comps):
            if is_inf(t):
                continue
            if z3.is_true(d) and z3.is_rational_value(t):
                v = Fraction(t.as_fraction())
                bounds |= {Bound(c, v, True), Bound(c, v, False)}
                continue
            for v in {Fraction(0)} | _finite_values([r.identity[c]]):
                for lower in (True, False):
                    s = z3.Solver()
                    limit(s, 0.5)
                    bad = t < z3.RealVal(v) if lower else t > z3.RealVal(v)
                    s.add(*alg.side, d, bad)
                    if s.check() == z3.unsat:
                        bounds.add(Bound(c, v, lower))
        out.append(bounds)
    return out


def _finite_values(vals: Sequence[Any]) -> set[Fraction]:
    return {Fraction(float(v)) for v in vals if abs(float(v)) != float("inf")}


def identity_is_real(r: CustomReducer) -> bool:
    """Whether every identity component is a finite real (not an infinity)."""
    return all(abs(float(e)) != float("inf") for e in r.identity)


def _leaf(alg: Reals, v: Any) -> tuple[Any, Any]:
    dt = getattr(v.type, "dtype", None)
    if dt is not None and dt.is_bool:
        return alg.var(f"x!{next(alg.fresh)}", boolean=True)
    if dt is not None and dt.is_float:
        return alg.var(f"x!{next(alg.fresh)}")
    raise Undecidable(f"a {dt} value in the body")


def seed_constants(p: TileProgram, op: Operation, r: CustomReducer) -> list[list[Fraction] | None]:
    """Per group of ``op``'s states under ``r``: the seed as constants
    (``const``, or a broadcast of one), or ``None`` where it is not known."""
    defs = {res.name: o for o in p.walk() for res in o.results}
    name = f"@{r.name}"
    k = len(r.state)
    vals: list[Fraction | None] = []
    for c, v in zip(op.attrs["contracts"], op.operands, strict=True):
        if c != name:
            continue
        d = defs.get(v.name)
        while d is not None and d.name in ("broadcast", "cast") and len(d.operands) == 1:
            d = defs.get(d.operands[0].name)
        val = d.attrs.get("value") if d is not None and d.name == "const" else None
        try:
            ok = val is not None and not isinstance(val, bool) and abs(float(val)) != float("inf")
            vals.append(Fraction(float(val)) if ok and float(val) == float(val) else None)
        except (TypeError, ValueError):
            vals.append(None)
    groups = [vals[i:i + k] for i in range(0, len(vals), k)]
    return [None if any(x is None for x in g) else list(g) for g in groups]  # type: ignore[misc]


def candidates(r: CustomReducer, uses: Sequence[tuple[TileProgram, Operation]]) -> list[Bound]:
    """The candidate bounds of ``r`` over its reduce regions ``uses``: constant
    components of every contribution, kept where every seed allows them."""
    common: set[Bound] | None = None
    seeds: list[list[Fraction]] = []
    for p, op in uses:
        cs = contribution_bounds(r, op)
        if cs is None:
            return []
        for c in cs:
            common = set(c) if common is None else common & c
        for s in seed_constants(p, op, r):
            if s is None:
                return []
            seeds.append(s)
    if not common:
        return []
    ident = ([Fraction(float(e)) for e in r.identity] if identity_is_real(r)
             else [None] * len(r.identity))
    return [b for b in sorted(common, key=lambda b: (b.index, b.value, not b.lower))
            if all(s == ident or (s[b.index] >= b.value if b.lower else s[b.index] <= b.value)
                   for s in seeds)]


# ---------------------------------------------------------------------------
# the invariant and the laws


def _state(alg: Reals, name: str, k: int) -> list[tuple[Any, Any]]:
    return [alg.var(f"{name}{i}") for i in range(k)]


def _in_inv(alg: Reals, s: Sequence[Any], inv: Sequence[Bound]) -> Any:
    return alg.z3.And([alg.at_least(s[b.index], b.value, b.lower) for b in inv])


def _in_dom(alg: Reals, s: Sequence[Any], ident: Sequence[Any], inv: Sequence[Bound]) -> Any:
    """``s`` is the identity or meets ``inv``; every real state when there is
    no invariant (an infinite component is then the identity's own)."""
    z3 = alg.z3
    is_e = z3.And([alg.same(x, e) for x, e in zip(s, ident, strict=True)])
    real = z3.And([z3.BoolVal(not is_inf(x)) for x in s])
    return z3.Or(is_e, z3.And(real, _in_inv(alg, s, inv)))


def _identity(alg: Reals, r: CustomReducer) -> list[Any]:
    return [alg.const(e)[0] for e in r.identity]


def invariant(r: CustomReducer, cands: Sequence[Bound], timeout: float) -> list[Bound]:
    """The largest inductive subset of ``cands`` (Houdini): ``Dom`` closed under
    the merge wherever the merge is defined. An undecided step drops all."""
    inv = list(cands)
    k = len(r.state)
    while inv:
        alg = Reals()
        z3 = alg.z3
        e = _identity(alg, r)
        a, b = _state(alg, "a", k), _state(alg, "b", k)
        out = merge_fn(alg, r)(a, b)
        s = z3.Solver()
        limit(s, timeout)
        s.add(*alg.side, _in_dom(alg, [t for t, _ in a], e, inv),
              _in_dom(alg, [t for t, _ in b], e, inv))
        s.add(z3.And([d for _, d in out]))
        s.add(z3.Not(_in_dom(alg, [t for t, _ in out], e, inv)))
        got = s.check()
        if got == z3.unsat:
            return inv
        if got != z3.sat:
            return []
        m = s.model()
        vals = [t if is_inf(t) else m.eval(t, model_completion=True) for t, _ in out]
        keep = [bd for bd in inv
                if z3.is_true(z3.simplify(alg.at_least(vals[bd.index], bd.value, bd.lower)))]
        if len(keep) == len(inv):
            return []  # cannot happen for a genuine model; stay on the safe side
        inv = keep
    return []


def decide_law(law: str, r: CustomReducer, inv: Sequence[Bound], timeout: float) -> Answer:
    """``law`` (``assoc``, ``comm`` or ``ident``) of ``r`` on ``Dom`` (see the
    module docstring): ``unsat`` proved, ``sat`` with the states, both sides and
    whether the merge divided by zero, or ``unknown``.

    ``Dom`` is split by cases: each state is the identity (its components then
    constants) or satisfies the invariant. The cases with identities are small
    and go first; the budget left is the last case's."""
    names = {"assoc": ("a", "b", "c"), "comm": ("a", "b"), "ident": ("a",)}[law]
    cases = (list(itertools.product((True, False), repeat=len(names)))
             if inv or not identity_is_real(r) else [(False,) * len(names)])
    cases.sort(key=lambda c: -sum(c))  # most identities first
    left_s = timeout  # the budget not yet given out
    reasons: list[str] = []
    for i, ids in enumerate(cases):
        share = left_s if i == len(cases) - 1 else max(0.05, left_s / (len(cases) - i) / 2)
        left_s = max(0.0, left_s - share)
        a = _decide_case(law, r, inv, dict(zip(names, ids, strict=True)), share)
        if a.status == "sat":
            return a
        if a.status == "unknown":
            reasons.append(a.reason)
    if reasons:
        return Answer("unknown", reason=reasons[-1])
    return Answer("unsat")


def law_sides(law: str, m: Any, xs: dict[str, list[Any]], e: list[Any]) -> tuple[list, list]:
    """Both sides of ``law`` (``assoc``, ``comm`` or ``ident``) for merge ``m``
    on the states ``xs`` (``a``, ``b``, ``c``) and identity ``e``, in any
    algebra: the identity law's sides are ``m(e, a) + m(a, e)`` and ``a + a``."""
    if law == "assoc":
        a, b, c = xs["a"], xs["b"], xs["c"]
        return m(m(a, b), c), m(a, m(b, c))
    if law == "comm":
        return m(xs["a"], xs["b"]), m(xs["b"], xs["a"])
    a = xs["a"]
    return m(e, a) + m(a, e), list(a) + list(a)


def _decide_case(law: str, r: CustomReducer, inv: Sequence[Bound], is_ident: dict[str, bool],
                 timeout: float) -> Answer:
    """One case of :func:`decide_law`: the states marked in ``is_ident`` are
    the identity, the others satisfy ``inv``."""
    alg = Reals()
    z3 = alg.z3
    k = len(r.state)
    m = merge_fn(alg, r, named=True)
    try:
        e = [alg.const(x) for x in r.identity]
        xs = {n: (list(e) if is_ident[n] else _state(alg, n, k)) for n in is_ident}
        left, right = law_sides(law, m, xs, e)
    except Undecidable as err:
        return Answer("unknown", reason=str(err))
    dl = z3.And([d for _, d in left])
    dr = z3.And([d for _, d in right])
    s = z3.Solver()
    limit(s, timeout)
    s.add(*alg.side)
    for n, v in xs.items():
        if not is_ident[n]:
            s.add(_in_inv(alg, [t for t, _ in v], inv))
    s.add(z3.Or(z3.Not(dl), z3.Not(dr),
                z3.Or([z3.Not(alg.same(lt, rt)) for (lt, _), (rt, _) in zip(left, right,
                                                                           strict=True)])))
    got = s.check()
    if got == z3.unsat:
        return Answer("unsat")
    if got != z3.sat:
        return Answer("unknown", reason=f"z3: {s.reason_unknown()}")
    mod = s.model()

    def num(t: Any) -> Any:
        if is_inf(t):
            return repr(t)
        v = mod.eval(t, model_completion=True)
        if z3.is_rational_value(v):
            f = Fraction(v.as_fraction())
            return int(f) if f.denominator == 1 else float(f)
        return float(v.approx(12).as_fraction()) if z3.is_algebraic_value(v) else str(v)

    def side(vals: list, defined: Any) -> Any:
        if not z3.is_true(mod.eval(defined, model_completion=True)):
            return "undefined (a division by zero or a NaN)"
        return tuple(num(t) for t, _ in vals)

    point: dict[str, Any] = {n: tuple(num(t) for t, _ in v) for n, v in xs.items()}
    point["lhs"] = side(left, dl)
    point["rhs"] = side(right, dr)
    if alg.used_exp:
        return _with_real_exp(law, r, inv, point)
    return Answer("sat", point)


def _with_real_exp(law: str, r: CustomReducer, inv: Sequence[Bound],
                   point: dict[str, Any]) -> Answer:
    """A counterexample to ``law`` found with ``exp`` abstracted, checked with
    the real ``exp`` at 60 digits. If it does not hold there, states near it in
    ``Dom`` (the same identity cases, the invariant's bounds kept; a fixed
    pseudo-random sequence) are tried; the first that breaks the law is the
    answer, with its sides evaluated. None: *unknown*."""
    import random

    fl = Floats()
    mp = fl.mp
    names = {"assoc": "abc", "comm": "ab", "ident": "a"}[law]
    k = len(r.state)
    ident = [float(e) for e in r.identity]

    def m(a: list, b: list) -> list:
        return run_block(fl, r.merge, list(a) + list(b))  # type: ignore[arg-type]

    def sides(xs: dict[str, list[Any]]) -> tuple[Any, Any]:
        st = {n: [(mp.mpf(v), True) for v in vs] for n, vs in xs.items()}
        return law_sides(law, m, st, [fl.const(x) for x in r.identity])

    def broken(left: list, right: list) -> bool:
        if not all(d for _, d in left + right):
            return True
        scale = 1 + max(abs(v) for v, _ in left + right if not mp.isinf(v)) if any(
            not mp.isinf(v) for v, _ in left + right) else 1
        return any(not (x == y or abs(x - y) <= mp.mpf(10) ** -40 * scale)
                   for (x, _), (y, _) in zip(left, right, strict=True))

    def show(vals: list) -> Any:
        if not all(d for _, d in vals):
            return "undefined (a division by zero or a NaN)"
        return tuple(_num_of(float(v)) for v, _ in vals)

    base = {n: [float(v) for v in point[n]] for n in names}
    is_e = {n: base[n] == ident for n in names}
    rng = random.Random(len(names) * 7919 + k)
    tries = [base]
    for i in range(256):
        spread = [1, 4, 30][i % 3]
        xs = {}
        for n in names:
            if is_e[n]:
                xs[n] = list(ident)
                continue
            vs = [float(rng.randint(-spread, spread)) / rng.choice((1, 2, 4)) for _ in range(k)]
            for b in inv:
                lo = float(b.value)
                vs[b.index] = lo + abs(vs[b.index]) if b.lower else lo - abs(vs[b.index])
            for b in inv:  # both bounds on one component: that constant
                if any(o.index == b.index and o.lower != b.lower for o in inv):
                    vs[b.index] = float(b.value)
            xs[n] = vs
        tries.append(xs)
    for xs in tries:
        try:
            left, right = sides(xs)
        except (ValueError, ZeroDivisionError, OverflowError):
            continue
        if broken(left, right):
            pt = {n: tuple(_num_of(v) for v in xs[n]) for n in names}
            return Answer("sat", {**pt, "lhs": show(left), "rhs": show(right)})
    return Answer("unknown", reason="no counterexample with the real exp was found near the "
                  "one found with exp abstracted")


def _num_of(v: float) -> Any:
    if v != v or v in (float("inf"), float("-inf")):
        return repr(v)
    return int(v) if v == int(v) else v


# ---------------------------------------------------------------------------
# obligations, with answers kept per reducer


_LAWS = (("assoc", "reduction.law.associative", "merge is associative",
          "forall a, b, c in Dom: m(m(a, b), c) = m(a, m(b, c))"),
         ("comm", "reduction.law.commutative", "merge is commutative",
          "forall a, b in Dom: m(a, b) = m(b, a)"),
         ("ident", "reduction.law.identity", "the identity {e} is two-sided",
          "forall a in Dom: m(e, a) = a = m(a, e)"))

#: answers of this process by (what, reducer algebra, ..., budget); unknown ones too
_MEMO: dict[tuple, Any] = {}


def algebra_key(r: CustomReducer) -> str:
    """The reducer's algebra as text: state dtypes, identity and merge ops
    (names and values, not source locations), so that the same merge written
    in another file or kernel shares its answers."""
    ops = [f"{[x.name for x in o.results]}={o.name}({[x.name for x in o.operands]})"
           f"{o.attrs.get('value')!r}:{[str(getattr(x.type, 'dtype', x.type)) for x in o.results]}"
           for o in r.merge.ops]
    args = [a.name for a in r.merge.args]
    return repr(([str(d) for d in r.state], [repr(e) for e in r.identity], args, ops))


def _remember(parts: list[Any], timeout: float, compute: Any, definite: Any) -> Any:
    """``compute()`` once per process and budget; a ``definite`` answer is kept
    on disk too (the proofs store), keyed by ``parts`` and the z3 version."""
    from .obligation import PROOFS, _engine_versions

    memo = tuple(map(repr, parts))
    if memo in _MEMO:
        return _MEMO[memo]
    if (*memo, timeout) in _MEMO:  # undecided with this budget before
        return _MEMO[(*memo, timeout)]
    key = None
    if PROOFS.folder() is not None:
        from ..diskcache import key_of

        key = key_of(["reducer-law", *map(repr, parts), *_engine_versions()])
        got = PROOFS.get(key)
        if got is not None:
            _MEMO[memo] = got[0]["value"]
            return got[0]["value"]
    value = compute()
    _MEMO[memo if definite(value) else (*memo, timeout)] = value
    if key is not None and definite(value):
        PROOFS.put(key, {"value": value}, {})
    return value


def _inv_of(stored: list) -> list[Bound]:
    return [Bound(i, Fraction(n, d), lo) for i, n, d, lo in stored]


def domain_text(r: CustomReducer, inv: Sequence[Bound]) -> str:
    if not inv:
        return ("for every real state" if identity_is_real(r)
                else f"for the identity {_show(tuple(r.identity))} and every real state")
    return (f"for the identity and the states with {' and '.join(b.text() for b in inv)}")


def real_law_obligations(p: TileProgram, r: CustomReducer, uses: Sequence[Operation],
                         need_comm: bool, sites: tuple) -> list[Any]:
    """The laws of float reducer ``r`` over the reals, required, on the states
    the regions ``uses`` can form (``Dom``, module docstring)."""
    import z3

    from .obligation import PROVED, REFUTED, UNKNOWN, Obligation

    try:
        cands = candidates(r, [(p, op) for op in uses])
    except z3.Z3Exception:
        cands = []
    alg = algebra_key(r)
    c = f"@{r.name}"

    def inv(timeout: float) -> list[Bound]:
        def compute() -> list:
            try:
                found = invariant(r, cands, timeout)
            except (Undecidable, z3.Z3Exception):
                found = []
            return [[b.index, b.value.numerator, b.value.denominator, b.lower] for b in found]

        return _inv_of(_remember(["invariant", alg, cands], timeout, compute,
                                 lambda v: bool(v) or not cands))

    out: list[Any] = []
    for law, kind, what, formula in _LAWS:
        if law == "comm" and not need_comm:
            continue
        title = f"{c} on reals: " + what.format(e=list(r.identity))
        ob = Obligation(kind, title, sites, formula_text=formula)

        def decide(o: Any, timeout: float, law: str = law, title: str = title) -> None:
            bounds = inv(timeout)
            dom = domain_text(r, bounds)
            o.title = f"{title}, {dom}"

            def compute() -> dict:
                try:
                    a = decide_law(law, r, bounds, timeout)
                except z3.Z3Exception as err:
                    a = Answer("unknown", reason=f"z3: {err}")
                return {"status": a.status, "point": a.point, "reason": a.reason}

            a = _remember(["law", law, alg, bounds], timeout, compute,
                          lambda v: v["status"] != "unknown")
            if a["status"] == "unsat":
                o.set(PROVED, "z3 (reals)")
            elif a["status"] == "sat":
                pt = a["point"]
                o.set(REFUTED, "z3 (reals)", "", pt)
                o.details = [", ".join(f"{k} = {_show(v)}" for k, v in pt.items())]
                if "undefined" in (str(pt.get("lhs")) + str(pt.get("rhs"))):
                    o.details.append("the merge divides by zero or makes a NaN at these states")
                    if not identity_is_real(r):
                        o.details.append("an infinite component is the identity's: guard the "
                                         "merge where it meets one (tn.ite on that component), "
                                         "as -inf - -inf and 0 * inf are NaN")
                o.details.append(f"(the law is stated {dom})")
            else:
                o.set(UNKNOWN, "z3 (reals)", a["reason"] or "z3: no answer")

        ob.decider = decide
        out.append(ob)
    return out


def _show(v: Any) -> str:
    if isinstance(v, (tuple, list)):
        return _show(v[0]) if len(v) == 1 else "(" + ", ".join(_show(x) for x in v) + ")"
    return repr(v) if isinstance(v, float) else str(v)
