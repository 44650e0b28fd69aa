"""Integer index expressions and predicates over parameters and coordinates.

An :class:`Expr` denotes a function from an environment to the integers. Its
free leaves are of three kinds:

* :class:`Sym` -- a symbolic kernel parameter (a tensor extent such as ``N``),
  fixed for one call;
* :class:`Var` -- an index variable bound by a region (``$p``: a coordinate of a
  ``parallel``/``serial``/``pipeline``/``reduce`` domain) or by a map (``$u0``: a
  local coordinate of a tile);
* :class:`Val` -- a scalar SSA value of integer type (``%ids_3``): a
  data-dependent index, evaluable but opaque to proofs.

Arithmetic is exact over the integers: ``//`` and ``%`` are floor division and
the matching non-negative-for-positive-divisor remainder (Python semantics).
Expressions are kept in a canonical form -- sums are linear combinations of
non-additive atoms, sorted by their printed form, with constants folded -- so
structural equality coincides with equality of canonical forms. The affine and
quasi-affine fragment (sums, multiplication by constants, floor division and
modulo by positive constants) is what the proof layer translates exactly.

A :class:`Pred` is a boolean combination of comparisons of expressions; it
states membership in an :class:`~tilenest.semantics.space.IndexSet`.
"""

from __future__ import annotations

import itertools
import math

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterable, Mapping, Union

import numpy as np

IntLike = Union[int, "Expr"]


class Expr:
    """Base of all index expressions. Use the smart constructors (``+``, ``*``,
    ``//``, ``%``, :func:`minimum`...) rather than the node classes directly, so
    that results stay canonical."""

    __slots__ = ()
    prec: ClassVar[float] = 9

    # -- arithmetic -------------------------------------------------------
    def __add__(self, o: IntLike) -> "Expr":
        return add(self, o)

    def __radd__(self, o: IntLike) -> "Expr":
        return add(o, self)

    def __sub__(self, o: IntLike) -> "Expr":
        return add(self, mul(-1, o))

    def __rsub__(self, o: IntLike) -> "Expr":
        return add(o, mul(-1, self))

    def __neg__(self) -> "Expr":
        return mul(-1, self)

    def __mul__(self, o: IntLike) -> "Expr":
        return mul(self, o)

    def __rmul__(self, o: IntLike) -> "Expr":
        return mul(o, self)

    def __floordiv__(self, o: IntLike) -> "Expr":
        return floordiv(self, o)

    def __rfloordiv__(self, o: IntLike) -> "Expr":
        return floordiv(o, self)

    def __mod__(self, o: IntLike) -> "Expr":
        return mod(self, o)

    def __rmod__(self, o: IntLike) -> "Expr":
        return mod(o, self)

    def __xor__(self, o: IntLike) -> "Expr":
        return bitop("^", self, o)

    def __and__(self, o: IntLike) -> "Expr":
        return bitop("&", self, o)

    def __or__(self, o: IntLike) -> "Expr":
        return bitop("|", self, o)

    def __lshift__(self, o: IntLike) -> "Expr":
        return bitop("<<", self, o)

    def __rshift__(self, o: IntLike) -> "Expr":
        return bitop(">>", self, o)

    # -- comparisons build predicates (structural == stays equality) ------
    def lt(self, o: IntLike) -> "Pred":
        return cmp("<", self, o)

    def le(self, o: IntLike) -> "Pred":
        return cmp("<=", self, o)

    def gt(self, o: IntLike) -> "Pred":
        return cmp(">", self, o)

    def ge(self, o: IntLike) -> "Pred":
        return cmp(">=", self, o)

    def eq(self, o: IntLike) -> "Pred":
        return cmp("==", self, o)

    def ne(self, o: IntLike) -> "Pred":
        return cmp("!=", self, o)

    # -- inspection -------------------------------------------------------
    @property
    def children(self) -> tuple["Expr", ...]:
        return ()

    def rebuild(self, children: tuple["Expr", ...]) -> "Expr":
        return self

    def __str__(self) -> str:
        return to_str(self)

    def __repr__(self) -> str:
        return f"Expr({to_str(self)})"

    @property
    def is_const(self) -> bool:
        return isinstance(self, Const)


@dataclass(frozen=True, repr=False)
class Const(Expr):
    """An integer constant."""

    value: int
    prec = 9

    def __post_init__(self) -> None:
        if not isinstance(self.value, (int, np.integer)) or isinstance(self.value, bool):
            raise TypeError(f"Const needs an int, got {self.value!r}")
        object.__setattr__(self, "value", int(self.value))


@dataclass(frozen=True, repr=False)
class Sym(Expr):
    """A symbolic integer parameter of the kernel (e.g. a tensor extent)."""

    name: str


@dataclass(frozen=True, repr=False)
class Var(Expr):
    """An index variable bound by a region domain or a map's local coordinates."""

    name: str


@dataclass(frozen=True, repr=False)
class Val(Expr):
    """A scalar integer SSA value used as an index (data-dependent)."""

    name: str


LEAVES = (Const, Sym, Var, Val)


@dataclass(frozen=True, repr=False)
class Add(Expr):
    """A sum of at least two terms in canonical order (constant last)."""

    terms: tuple[Expr, ...]
    prec = 4

    @property
    def children(self) -> tuple[Expr, ...]:
        return self.terms

    def rebuild(self, children: tuple[Expr, ...]) -> Expr:
        out: Expr = Const(0)
        for c in children:
            out = add(out, c)
        return out


@dataclass(frozen=True, repr=False)
class Mul(Expr):
    """A product; a constant factor, if any, comes first."""

    factors: tuple[Expr, ...]
    prec = 5

    @property
    def children(self) -> tuple[Expr, ...]:
        return self.factors

    def rebuild(self, children: tuple[Expr, ...]) -> Expr:
        out: Expr = Const(1)
        for c in children:
            out = mul(out, c)
        return out


@dataclass(frozen=True, repr=False)
class FloorDiv(Expr):
    """``floor(a / b)``."""

    a: Expr
    b: Expr
    prec = 5

    @property
    def children(self) -> tuple[Expr, ...]:
        return (self.a, self.b)

    def rebuild(self, children: tuple[Expr, ...]) -> Expr:
        return floordiv(*children)


@dataclass(frozen=True, repr=False)
class Mod(Expr):
    """``a - b * floor(a / b)``."""

    a: Expr
    b: Expr
    prec = 5

    @property
    def children(self) -> tuple[Expr, ...]:
        return (self.a, self.b)

    def rebuild(self, children: tuple[Expr, ...]) -> Expr:
        return mod(*children)


@dataclass(frozen=True, repr=False)
class MinMax(Expr):
    """``min(a, b)`` or ``max(a, b)`` (``op`` is ``"min"`` or ``"max"``)."""

    op: str
    a: Expr
    b: Expr
    prec = 9

    @property
    def children(self) -> tuple[Expr, ...]:
        return (self.a, self.b)

    def rebuild(self, children: tuple[Expr, ...]) -> Expr:
        return minimum(*children) if self.op == "min" else maximum(*children)


#: Python precedence of the bitwise operators, lowest first.
_BIT_PREC = {"|": 1, "^": 2, "&": 3, "<<": 3.5, ">>": 3.5}


@dataclass(frozen=True, repr=False)
class BitOp(Expr):
    """A bitwise operation on two's-complement integers (swizzles, masks)."""

    op: str
    a: Expr
    b: Expr

    @property
    def prec(self) -> float:  # type: ignore[override]
        return _BIT_PREC[self.op]

    @property
    def children(self) -> tuple[Expr, ...]:
        return (self.a, self.b)

    def rebuild(self, children: tuple[Expr, ...]) -> Expr:
        return bitop(self.op, *children)


# ---------------------------------------------------------------------------
# smart constructors


def lift(x: IntLike) -> Expr:
    """``x`` as an Expr (ints become :class:`Const`)."""
    if isinstance(x, Expr):
        return x
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return Const(int(x))
    raise TypeError(f"not an integer index expression: {x!r}")


def _key(e: Expr) -> str:
    return to_str(e)


def _linear(e: Expr) -> tuple[dict[Expr, int], int]:
    """Decompose ``e`` as ``sum(coef * atom) + const`` over non-additive atoms."""
    if isinstance(e, Const):
        return {}, e.value
    if isinstance(e, Add):
        acc: dict[Expr, int] = {}
        k = 0
        for t in e.terms:
            d, c = _linear(t)
            k += c
            for a, v in d.items():
                acc[a] = acc.get(a, 0) + v
        return acc, k
    if isinstance(e, Mul) and isinstance(e.factors[0], Const):
        c = e.factors[0].value
        rest = e.factors[1] if len(e.factors) == 2 else Mul(e.factors[1:])
        d, k = _linear(rest)
        return {a: v * c for a, v in d.items()}, k * c
    return {e: 1}, 0


def least_magnitude(e: Expr, most: int = 64) -> int | None:
    """A lower bound of ``|e|`` over all values of its leaves, when ``e`` is
    a constant plus integer multiples of remainders by small positive
    constants (``x mod m``, each ranging over ``0 .. m - 1`` independently:
    a superset of the values it can take, so the bound is sound); None for
    any other expression or more than ``most`` combinations. Two accesses
    ``e`` elements apart, one in each of the two versions of a ping-pong
    buffer, give ``size * (1 - 2 (x mod 2))``: at least ``size`` apart."""
    d, k = _linear(e)
    coefs, moduli = [], []
    for a, c in d.items():
        if not (isinstance(a, Mod) and isinstance(a.b, Const) and a.b.value > 0):
            return None
        coefs.append(c)
        moduli.append(a.b.value)
    if math.prod(moduli) > most:
        return None
    return min(abs(k + sum(c * v for c, v in zip(coefs, vals, strict=True)))
               for vals in itertools.product(*(range(m) for m in moduli)))


def stride(e: Expr, x: Var) -> int | None:
    """The constant ``s`` with ``e(x + 1) = e(x) + s`` for every ``x`` when
    ``e`` is affine in ``x`` (0 when ``x`` does not occur), else None."""
    if x not in leaves(e):
        return 0
    d, _k = _linear(e)
    if any(x in leaves(t) for t in d if t != x):
        return None  # x inside a product, a division, a min/max...
    return d.get(x, 0)


def _build(d: Mapping[Expr, int], k: int) -> Expr:
    items = sorted(((a, v) for a, v in d.items() if v != 0), key=lambda av: _key(av[0]))
    terms: list[Expr] = []
    for a, v in items:
        terms.append(a if v == 1 else Mul((Const(v), a)))
    if k != 0 or not terms:
        terms.append(Const(k))
    return terms[0] if len(terms) == 1 else Add(tuple(terms))


def add(a: IntLike, b: IntLike) -> Expr:
    a, b = lift(a), lift(b)
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(a.value + b.value)
    da, ka = _linear(a)
    db, kb = _linear(b)
    for x, v in db.items():
        da[x] = da.get(x, 0) + v
    return _build(da, ka + kb)


def mul(a: IntLike, b: IntLike) -> Expr:
    a, b = lift(a), lift(b)
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(a.value * b.value)
    if isinstance(b, Const):
        a, b = b, a
    if isinstance(a, Const):
        if a.value == 0:
            return Const(0)
        if a.value == 1:
            return b
        d, k = _linear(b)
        return _build({x: v * a.value for x, v in d.items()}, k * a.value)
    # a genuine (non-affine) product: pull constant coefficients out
    da, ka = _linear(a)
    db, kb = _linear(b)
    if ka == 0 and len(da) == 1 and kb == 0 and len(db) == 1:
        (xa, ca), = da.items()
        (xb, cb), = db.items()
        fa = xa.factors if isinstance(xa, Mul) else (xa,)
        fb = xb.factors if isinstance(xb, Mul) else (xb,)
        prod = Mul(tuple(sorted(fa + fb, key=_key)))
        return _build({prod: ca * cb}, 0)
    # distribute over sums
    out: Expr = Const(ka * kb)
    for x, v in da.items():
        out = add(out, mul(v * kb, x))
        for y, w in db.items():
            out = add(out, mul(v * w, mul(x, y)))
    for y, w in db.items():
        out = add(out, mul(w * ka, y))
    return out


def floordiv(a: IntLike, b: IntLike) -> Expr:
    a, b = lift(a), lift(b)
    if isinstance(b, Const):
        c = b.value
        if c == 0:
            raise ZeroDivisionError("index expression divides by zero")
        if isinstance(a, Const):
            return Const(a.value // c)
        if c == 1:
            return a
        if c > 0:
            d, k = _linear(a)
            if all(v % c == 0 for v in d.values()):
                return _build({x: v // c for x, v in d.items()}, k // c)
            if isinstance(a, FloorDiv) and isinstance(a.b, Const) and a.b.value > 0:
                return floordiv(a.a, a.b.value * c)
    return FloorDiv(a, b)


def mod(a: IntLike, b: IntLike) -> Expr:
    a, b = lift(a), lift(b)
    if isinstance(b, Const):
        c = b.value
        if c == 0:
            raise ZeroDivisionError("index expression takes a remainder by zero")
        if isinstance(a, Const):
            return Const(a.value % c)
        if c in (1, -1):
            return Const(0)
        if c > 0:
            d, k = _linear(a)
            kept = {x: v for x, v in d.items() if v % c != 0}
            if not kept:
                return Const(k % c)
            if len(kept) != len(d) or k % c != k:
                return Mod(_build(kept, k % c), b)
            if isinstance(a, Mod) and a.b == b:
                return a
    return Mod(a, b)


def minimum(a: IntLike, b: IntLike) -> Expr:
    a, b = lift(a), lift(b)
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(min(a.value, b.value))
    if a == b:
        return a
    x, y = sorted((a, b), key=_key)
    return MinMax("min", x, y)


def maximum(a: IntLike, b: IntLike) -> Expr:
    a, b = lift(a), lift(b)
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(max(a.value, b.value))
    if a == b:
        return a
    x, y = sorted((a, b), key=_key)
    return MinMax("max", x, y)


_BITFN: dict[str, Callable[[int, int], int]] = {
    "^": lambda x, y: x ^ y,
    "&": lambda x, y: x & y,
    "|": lambda x, y: x | y,
    "<<": lambda x, y: x << y,
    ">>": lambda x, y: x >> y,
}


def bitop(op: str, a: IntLike, b: IntLike) -> Expr:
    a, b = lift(a), lift(b)
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(_BITFN[op](a.value, b.value))
    if op in ("^", "|", "<<", ">>") and isinstance(b, Const) and b.value == 0:
        return a
    if op == "&" and isinstance(b, Const) and b.value == 0:
        return Const(0)
    return BitOp(op, a, b)


def cdiv(a: IntLike, b: IntLike) -> Expr:
    """Ceiling division ``ceil(a / b)`` for positive ``b``."""
    return floordiv(add(a, add(b, -1)), b)


# ---------------------------------------------------------------------------
# predicates


class Pred:
    """Base of boolean conditions over index expressions."""

    __slots__ = ()
    prec: ClassVar[float] = 9

    def __and__(self, o: "Pred") -> "Pred":
        return pand(self, o)

    def __or__(self, o: "Pred") -> "Pred":
        return por(self, o)

    def __invert__(self) -> "Pred":
        return pnot(self)

    @property
    def children(self) -> tuple[Any, ...]:
        return ()

    def __str__(self) -> str:
        return pred_to_str(self)

    def __repr__(self) -> str:
        return f"Pred({pred_to_str(self)})"


@dataclass(frozen=True, repr=False)
class BoolConst(Pred):
    value: bool


TRUE = BoolConst(True)
FALSE = BoolConst(False)

_CMP: dict[str, Callable[[Any, Any], Any]] = {
    "<": lambda x, y: x < y,
    "<=": lambda x, y: x <= y,
    ">": lambda x, y: x > y,
    ">=": lambda x, y: x >= y,
    "==": lambda x, y: x == y,
    "!=": lambda x, y: x != y,
}


@dataclass(frozen=True, repr=False)
class Cmp(Pred):
    """``a op b`` for a comparison operator ``op``."""

    op: str
    a: Expr
    b: Expr
    prec = 3

    @property
    def children(self) -> tuple[Any, ...]:
        return (self.a, self.b)


@dataclass(frozen=True, repr=False)
class PAnd(Pred):
    items: tuple[Pred, ...]
    prec = 2

    @property
    def children(self) -> tuple[Any, ...]:
        return self.items


@dataclass(frozen=True, repr=False)
class POr(Pred):
    items: tuple[Pred, ...]
    prec = 1

    @property
    def children(self) -> tuple[Any, ...]:
        return self.items


@dataclass(frozen=True, repr=False)
class PNot(Pred):
    item: Pred
    prec = 2.5

    @property
    def children(self) -> tuple[Any, ...]:
        return (self.item,)


def cmp(op: str, a: IntLike, b: IntLike) -> Pred:
    a, b = lift(a), lift(b)
    if isinstance(a, Const) and isinstance(b, Const):
        return BoolConst(bool(_CMP[op](a.value, b.value)))
    return Cmp(op, a, b)


def pand(*ps: Pred) -> Pred:
    items: list[Pred] = []
    for p in ps:
        if p == FALSE:
            return FALSE
        if p == TRUE:
            continue
        items.extend(p.items if isinstance(p, PAnd) else (p,))
    uniq = tuple(dict.fromkeys(items))
    if not uniq:
        return TRUE
    return uniq[0] if len(uniq) == 1 else PAnd(uniq)


def por(*ps: Pred) -> Pred:
    items: list[Pred] = []
    for p in ps:
        if p == TRUE:
            return TRUE
        if p == FALSE:
            continue
        items.extend(p.items if isinstance(p, POr) else (p,))
    uniq = tuple(dict.fromkeys(items))
    if not uniq:
        return FALSE
    return uniq[0] if len(uniq) == 1 else POr(uniq)


def pnot(p: Pred) -> Pred:
    if isinstance(p, BoolConst):
        return BoolConst(not p.value)
    if isinstance(p, PNot):
        return p.item
    return PNot(p)


# ---------------------------------------------------------------------------
# traversal, substitution, evaluation


def leaves(x: Expr | Pred) -> set[Expr]:
    """The free Sym, Var and Val leaves of an expression or predicate."""
    out: set[Expr] = set()
    stack: list[Any] = [x]
    while stack:
        e = stack.pop()
        if isinstance(e, (Sym, Var, Val)):
            out.add(e)
        elif isinstance(e, (Expr, Pred)):
            stack.extend(e.children)
    return out


def subst(x: Any, m: Mapping[Expr, IntLike]) -> Any:
    """Replace leaves of ``x`` (an Expr or Pred) by the expressions in ``m``."""
    if not m:
        return x
    if isinstance(x, Expr):
        if isinstance(x, (Sym, Var, Val)):
            r = m.get(x)
            return x if r is None else lift(r)
        if isinstance(x, Const):
            return x
        return x.rebuild(tuple(subst(c, m) for c in x.children))
    if isinstance(x, Cmp):
        return cmp(x.op, subst(x.a, m), subst(x.b, m))
    if isinstance(x, PAnd):
        return pand(*(subst(p, m) for p in x.items))
    if isinstance(x, POr):
        return por(*(subst(p, m) for p in x.items))
    if isinstance(x, PNot):
        return pnot(subst(x.item, m))
    return x


def rename(x: Any, names: Mapping[str, str]) -> Any:
    """Rename Var leaves by name (a convenience over :func:`subst`)."""
    return subst(x, {Var(a): Var(b) for a, b in names.items()})


def _np_floordiv(a: Any, b: Any) -> Any:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if np.any(np.asarray(b) == 0):
            raise ZeroDivisionError("index expression divides by zero")
        return np.floor_divide(a, b)
    return a // b


def _np_mod(a: Any, b: Any) -> Any:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if np.any(np.asarray(b) == 0):
            raise ZeroDivisionError("index expression takes a remainder by zero")
        return np.mod(a, b)
    return a % b


def evaluate(x: Expr | Pred, env: Mapping[Expr, Any]) -> Any:
    """The value of ``x`` where every free leaf takes its value from ``env``.

    Values may be Python ints or numpy integer arrays (broadcast together), so a
    whole grid of coordinates evaluates in one call."""
    if isinstance(x, Const):
        return x.value
    if isinstance(x, (Sym, Var, Val)):
        try:
            return env[x]
        except KeyError:
            raise KeyError(f"no value for {to_str(x)}") from None
    if isinstance(x, Add):
        out = evaluate(x.terms[0], env)
        for t in x.terms[1:]:
            out = out + evaluate(t, env)
        return out
    if isinstance(x, Mul):
        out = evaluate(x.factors[0], env)
        for t in x.factors[1:]:
            out = out * evaluate(t, env)
        return out
    if isinstance(x, FloorDiv):
        return _np_floordiv(evaluate(x.a, env), evaluate(x.b, env))
    if isinstance(x, Mod):
        return _np_mod(evaluate(x.a, env), evaluate(x.b, env))
    if isinstance(x, MinMax):
        a, b = evaluate(x.a, env), evaluate(x.b, env)
        if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            return np.minimum(a, b) if x.op == "min" else np.maximum(a, b)
        return min(a, b) if x.op == "min" else max(a, b)
    if isinstance(x, BitOp):
        return _BITFN[x.op](evaluate(x.a, env), evaluate(x.b, env))
    if isinstance(x, BoolConst):
        return x.value
    if isinstance(x, Cmp):
        return _CMP[x.op](evaluate(x.a, env), evaluate(x.b, env))
    if isinstance(x, PAnd):
        out = evaluate(x.items[0], env)
        for p in x.items[1:]:
            out = np.logical_and(out, evaluate(p, env))
        return out
    if isinstance(x, POr):
        out = evaluate(x.items[0], env)
        for p in x.items[1:]:
            out = np.logical_or(out, evaluate(p, env))
        return out
    if isinstance(x, PNot):
        return np.logical_not(evaluate(x.item, env))
    raise TypeError(f"cannot evaluate {x!r}")


def is_quasi_affine(x: Expr | Pred) -> bool:
    """True when ``x`` lies in the Presburger fragment: sums, products with a
    constant, floor division/modulo by positive constants, min/max, and no
    data-dependent (:class:`Val`) leaves."""
    if isinstance(x, (Const, Sym, Var)):
        return True
    if isinstance(x, Val):
        return False
    if isinstance(x, Add):
        return all(is_quasi_affine(t) for t in x.terms)
    if isinstance(x, Mul):
        return (isinstance(x.factors[0], Const) and len(x.factors) == 2
                and is_quasi_affine(x.factors[1]))
    if isinstance(x, (FloorDiv, Mod)):
        return isinstance(x.b, Const) and x.b.value > 0 and is_quasi_affine(x.a)
    if isinstance(x, MinMax):
        return is_quasi_affine(x.a) and is_quasi_affine(x.b)
    if isinstance(x, BitOp):
        return False
    if isinstance(x, BoolConst):
        return True
    if isinstance(x, Cmp):
        return is_quasi_affine(x.a) and is_quasi_affine(x.b)
    if isinstance(x, (PAnd, POr, PNot)):
        return all(is_quasi_affine(c) for c in x.children)
    return False


# ---------------------------------------------------------------------------
# interval bounds (a cheap, sound over-approximation)

Interval = tuple[int | None, int | None]


def _iv_add(a: Interval, b: Interval) -> Interval:
    lo = None if a[0] is None or b[0] is None else a[0] + b[0]
    hi = None if a[1] is None or b[1] is None else a[1] + b[1]
    return lo, hi


def _iv_scale(a: Interval, c: int) -> Interval:
    lo = None if a[0] is None else a[0] * c
    hi = None if a[1] is None else a[1] * c
    return (lo, hi) if c >= 0 else (hi, lo)


def _iv_mul(a: Interval, b: Interval) -> Interval:
    for k, o in ((a, b), (b, a)):
        if k[0] is not None and k[0] == k[1]:
            return _iv_scale(o, k[0])
    if None not in a and None not in b:
        c = (a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1])  # type: ignore[operator]
        return min(c), max(c)
    if a[0] is not None and a[0] >= 0 and b[0] is not None and b[0] >= 0:
        hi = None if a[1] is None or b[1] is None else a[1] * b[1]
        return a[0] * b[0], hi
    return None, None


def _positive(iv: Interval) -> int | None:
    """The value of a one-point interval of a positive number, else None."""
    return iv[0] if iv[0] is not None and iv[0] == iv[1] and iv[0] > 0 else None


def decided(p: Pred, ranges: Mapping[Expr, Interval]) -> bool | None:
    """The value of index predicate ``p`` wherever its leaves lie in
    ``ranges``, when interval bounds (:func:`interval`) decide it, else None
    (a thread loop's tile guard ``r + t // 128 < 1`` with ``t < 128`` and
    ``r = 0`` is true)."""
    if isinstance(p, BoolConst):
        return p.value
    if isinstance(p, (PAnd, POr)):
        vals = [decided(q, ranges) for q in p.items]
        want = isinstance(p, POr)
        if want in vals:
            return want
        return None if None in vals else not want
    if not isinstance(p, Cmp):
        return None
    lo, hi = interval(add(p.a, mul(-1, p.b)), ranges)
    sure = {"<": (hi is not None and hi < 0, lo is not None and lo >= 0),
            "<=": (hi is not None and hi <= 0, lo is not None and lo > 0),
            ">": (lo is not None and lo > 0, hi is not None and hi <= 0),
            ">=": (lo is not None and lo >= 0, hi is not None and hi < 0),
            "==": (lo == hi == 0, (lo is not None and lo > 0) or (hi is not None and hi < 0)),
            "!=": ((lo is not None and lo > 0) or (hi is not None and hi < 0), lo == hi == 0),
            }.get(p.op)
    if sure is None:
        return None
    return True if sure[0] else (False if sure[1] else None)


def narrowed(x: Expr, ranges: Mapping[Expr, Interval]) -> Expr:
    """``x`` with every floor division and modulo by a positive constant
    ``c`` whose dividend lies, wherever ``x``'s leaves lie in ``ranges``
    (:func:`interval`), within one multiple ``[k c, (k + 1) c)`` replaced
    by what it equals there: ``k`` and ``a - k c``. The value is unchanged
    wherever the ranges hold (a thread loop's ``t // 128`` on a block of 128
    threads is 0, ``t % 128`` is ``t``)."""
    if isinstance(x, (Const, Sym, Var, Val)):
        return x
    kids = tuple(narrowed(c, ranges) for c in x.children)
    if isinstance(x, (FloorDiv, Mod)) and isinstance(kids[1], Const) and kids[1].value > 0:
        c = kids[1].value
        lo, hi = interval(kids[0], ranges)
        if lo is not None and hi is not None and lo // c == hi // c:
            k = lo // c
            return Const(k) if isinstance(x, FloorDiv) else add(kids[0], -k * c)
    return x if kids == x.children else x.rebuild(kids)


def interval(x: Expr, ranges: Mapping[Expr, Interval],
             check: Callable[[Interval], None] | None = None) -> Interval:
    """Bounds ``(lo, hi)`` (``None`` = unbounded) on the values of ``x`` when each
    leaf lies in ``ranges`` (leaves not listed are unbounded). Floor division
    and modulo are bounded when the divisor is one positive value (a constant,
    or a leaf pinned to one value). ``check``, when given, sees the interval
    of every subexpression and of every partial sum and product, in the order
    the terms and factors are listed (what code evaluating ``x`` computes)."""

    def iv(x: Expr) -> Interval:
        out = _interval(x)
        if check is not None:
            check(out)
        return out

    def _interval(x: Expr) -> Interval:
        if isinstance(x, Const):
            return x.value, x.value
        if isinstance(x, (Sym, Var, Val)):
            return ranges.get(x, (None, None))
        if isinstance(x, Add):
            out: Interval = (0, 0)
            for n, t in enumerate(x.terms):
                out = _iv_add(out, iv(t))
                if check is not None and 0 < n < len(x.terms) - 1:
                    check(out)
            return out
        if isinstance(x, Mul):
            out = (1, 1)
            for n, f in enumerate(x.factors):
                out = _iv_mul(out, iv(f))
                if check is not None and 0 < n < len(x.factors) - 1:
                    check(out)
            return out
        if isinstance(x, (FloorDiv, Mod)):
            a, c = iv(x.a), _positive(iv(x.b))
            if c is None:
                return None, None
            if isinstance(x, FloorDiv):
                return (None if a[0] is None else a[0] // c, None if a[1] is None else a[1] // c)
            if a[0] is not None and a[1] is not None and 0 <= a[0] and a[1] < c:
                return a
            return 0, c - 1
        if isinstance(x, MinMax):
            a, b = iv(x.a), iv(x.b)
            if x.op == "min":
                lo = None if a[0] is None or b[0] is None else min(a[0], b[0])
                hi = b[1] if a[1] is None else (a[1] if b[1] is None else min(a[1], b[1]))
                return lo, hi
            lo = b[0] if a[0] is None else (a[0] if b[0] is None else max(a[0], b[0]))
            hi = None if a[1] is None or b[1] is None else max(a[1], b[1])
            return lo, hi
        return None, None

    return _interval(x) if check is None else iv(x)


# ---------------------------------------------------------------------------
# printing (the parser in ``parse.py`` reads exactly this syntax)


def to_str(x: Expr) -> str:
    """Print an Expr: symbols bare (``N``), index variables ``$i``, SSA values
    ``%v``; operators with Python precedence; ``min(a, b)``/``max(a, b)``."""
    if isinstance(x, Const):
        return str(x.value)
    if isinstance(x, Sym):
        return x.name
    if isinstance(x, Var):
        return "$" + x.name
    if isinstance(x, Val):
        return "%" + x.name
    if isinstance(x, Add):
        parts: list[str] = []
        for i, t in enumerate(x.terms):
            neg = False
            if isinstance(t, Const) and t.value < 0:
                s, neg = str(-t.value), True
            elif isinstance(t, Mul) and isinstance(t.factors[0], Const) and t.factors[0].value < 0:
                rest = t.factors[1] if len(t.factors) == 2 else Mul(t.factors[1:])
                # a leading unary minus binds tighter than // and %: keep "-(a // b)"
                tight = i == 0 and isinstance(rest, (FloorDiv, Mod))
                s, neg = to_str(mul(-1, t)) if t.factors[0].value != -1 else _paren(
                    rest, 6 if tight else 4.5), True
            else:
                s = _paren(t, 4)
            if i == 0:
                parts.append(("-" + s) if neg else s)
            else:
                parts.append((" - " if neg else " + ") + s)
        return "".join(parts)
    if isinstance(x, Mul):
        return "*".join(_paren(f, 5.5) for f in x.factors)
    if isinstance(x, FloorDiv):
        return f"{_paren(x.a, 5)} // {_paren(x.b, 5.5)}"
    if isinstance(x, Mod):
        return f"{_paren(x.a, 5)} % {_paren(x.b, 5.5)}"
    if isinstance(x, MinMax):
        return f"{x.op}({to_str(x.a)}, {to_str(x.b)})"
    if isinstance(x, BitOp):
        p = _BIT_PREC[x.op]
        return f"{_paren(x.a, p)} {x.op} {_paren(x.b, p + 0.25)}"
    raise TypeError(repr(x))


def _paren(x: Expr, prec: float) -> str:
    s = to_str(x)
    p: float = x.prec
    if isinstance(x, Const) and x.value < 0:
        p = 4.5
    if isinstance(x, Mul) and isinstance(x.factors[0], Const) and x.factors[0].value < 0:
        p = 4.5
    return f"({s})" if p < prec else s


def pred_to_str(p: Pred) -> str:
    """Print a predicate: comparisons, ``and``, ``or``, ``not``, ``true``/``false``."""
    if isinstance(p, BoolConst):
        return "true" if p.value else "false"
    if isinstance(p, Cmp):
        return f"{to_str(p.a)} {p.op} {to_str(p.b)}"
    if isinstance(p, PAnd):
        return " and ".join(_pparen(q, 2) for q in p.items)
    if isinstance(p, POr):
        return " or ".join(_pparen(q, 1.5) for q in p.items)
    if isinstance(p, PNot):
        return "not " + _pparen(p.item, 3)
    raise TypeError(repr(p))


def _pparen(p: Pred, prec: float) -> str:
    s = pred_to_str(p)
    return f"({s})" if p.prec < prec else s


def conj(preds: Iterable[Pred]) -> Pred:
    return pand(*preds)
