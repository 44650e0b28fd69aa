"""The Z3 engine: the only place formulas and scalar laws are translated to Z3.

Two kinds of query go through here:

* **index claims** outside the quasi-affine fragment (products of parameters,
  symbolic divisors, bit operations): the counterexample set of a
  :class:`~tilenest.proofs.formula.Claim` over mathematical integers. ``//`` and
  ``%`` keep the floor semantics of :mod:`tilenest.semantics.expr` (Z3's integer
  division is Euclidean; both agree for positive divisors and the translation
  adjusts negative ones); bit operations go through 64-bit vectors.
* **algebraic laws** of scalar operations in a dtype: integers and bools as
  bit-vectors of their width (two's-complement wrap-around is exact), floats in
  Z3's IEEE theory with round-to-nearest-even, where ``==`` is Z3's structural
  equality (all NaNs equal, ``+0 != -0``): "bitwise equal up to NaN payload".
  Laws may also be asked over the reals, the algebra a float contract claims.

Every query carries a budget given in seconds and spent in Z3's resource
units (:func:`limit`): a verdict does not depend on how busy the machine is.
``unknown`` (budget spent, incomplete nonlinear arithmetic) is returned as
such.
"""

from __future__ import annotations

import itertools
import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..semantics import expr as E
from ..semantics.dtypes import DType
from . import formula as Fm


@dataclass
class Answer:
    """``status`` is ``unsat`` (claim proved), ``sat`` (counterexample in
    ``point``) or ``unknown`` (``reason``)."""

    status: str
    point: dict[str, Any] | None = None
    reason: str = ""


def _z3() -> Any:
    import z3

    return z3


#: Z3 resource units (``rlimit``) per second of a query's budget: about what
#: Z3 spends in a second on a 2020s x86-64 core (5e6 measured on floating-point
#: and integer queries). Counting units instead of seconds makes a verdict
#: the same on an idle and a busy machine.
UNITS_PER_SECOND = 5_000_000
#: the wall-clock cap of a query, in multiples of its budget: a safety net
#: against a query whose unit count stalls, far above any load seen
WALL_FACTOR = 30


def limit(solver: Any, seconds: float) -> None:
    """Give ``solver``'s next check a budget of ``seconds`` (in resource
    units, :data:`UNITS_PER_SECOND`), capped at ``WALL_FACTOR`` times that in
    wall-clock time."""
    solver.set("rlimit", max(1, int(seconds * UNITS_PER_SECOND)))
    solver.set("timeout", max(1, int(seconds * 1000 * WALL_FACTOR)))


# ---------------------------------------------------------------------------
# index claims


class _Int:
    def __init__(self, z3: Any):
        self.z3 = z3
        self.vars: dict[tuple[str, str], Any] = {}

    def leaf(self, kind: str, name: str) -> Any:
        key = (kind, name)
        if key not in self.vars:
            self.vars[key] = self.z3.Int(f"{kind}:{name}")
        return self.vars[key]

    def expr(self, e: E.Expr, bound: dict[str, Any]) -> Any:
        z3 = self.z3
        if isinstance(e, E.Const):
            return z3.IntVal(e.value)
        if isinstance(e, E.Sym):
            return self.leaf("sym", e.name)
        if isinstance(e, E.Var):
            return bound[e.name] if e.name in bound else self.leaf("var", e.name)
        if isinstance(e, E.Val):
            return self.leaf("data", e.name)
        if isinstance(e, E.Add):
            return z3.Sum([self.expr(t, bound) for t in e.terms])
        if isinstance(e, E.Mul):
            out = self.expr(e.factors[0], bound)
            for f in e.factors[1:]:
                out = out * self.expr(f, bound)
            return out
        if isinstance(e, (E.FloorDiv, E.Mod)):
            a, b = self.expr(e.a, bound), self.expr(e.b, bound)
            if isinstance(e.b, E.Const) and e.b.value > 0:
                q = a / b
            else:
                q = z3.If(b > 0, a / b, (-a) / (-b))
            return q if isinstance(e, E.FloorDiv) else a - b * q
        if isinstance(e, E.MinMax):
            a, b = self.expr(e.a, bound), self.expr(e.b, bound)
            return z3.If(a <= b, a, b) if e.op == "min" else z3.If(a >= b, a, b)
        if isinstance(e, E.BitOp):
            a = z3.Int2BV(self.expr(e.a, bound), 64)
            b = z3.Int2BV(self.expr(e.b, bound), 64)
            fn: dict[str, Callable[[Any, Any], Any]] = {
                "^": lambda x, y: x ^ y, "&": lambda x, y: x & y, "|": lambda x, y: x | y,
                "<<": lambda x, y: x << y, ">>": lambda x, y: z3.LShR(x, y)}
            return z3.BV2Int(fn[e.op](a, b), is_signed=True)
        raise TypeError(e)

    def pred(self, p: E.Pred, bound: dict[str, Any]) -> Any:
        z3 = self.z3
        if isinstance(p, E.BoolConst):
            return z3.BoolVal(p.value)
        if isinstance(p, E.Cmp):
            a, b = self.expr(p.a, bound), self.expr(p.b, bound)
            return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b, "==": a == b,
                    "!=": a != b}[p.op]
        if isinstance(p, E.PAnd):
            return z3.And([self.pred(q, bound) for q in p.items])
        if isinstance(p, E.POr):
            return z3.Or([self.pred(q, bound) for q in p.items])
        if isinstance(p, E.PNot):
            return z3.Not(self.pred(p.item, bound))
        raise TypeError(p)

    def formula(self, f: Fm.F, bound: dict[str, Any]) -> Any:
        z3 = self.z3
        if isinstance(f, Fm.Atom):
            return self.pred(f.pred, bound)
        if isinstance(f, Fm.And):
            return z3.And([self.formula(g, bound) for g in f.items])
        if isinstance(f, Fm.Or):
            return z3.Or([self.formula(g, bound) for g in f.items])
        if isinstance(f, Fm.Not):
            return z3.Not(self.formula(f.item, bound))
        if isinstance(f, Fm.Exists):
            inner = dict(bound)
            qs = []
            for v in f.vars:
                inner[v] = z3.Int(f"bound:{v}:{len(inner)}")
                qs.append(inner[v])
            return z3.Exists(qs, self.formula(f.body, inner))
        raise TypeError(f)


def decide(f: Fm.F, params: Sequence[str], vars_: Sequence[str], data: Sequence[str],
           timeout: float) -> Answer:
    """Satisfiability of the counterexample set ``f`` over the integers."""
    z3 = _z3()
    tr = _Int(z3)
    try:
        goal = tr.formula(f, {})
    except (TypeError, z3.Z3Exception) as e:
        return Answer("unknown", reason=f"not translatable to Z3: {e}")
    s = z3.Solver()
    s.add(goal)
    # prefer a small counterexample: try inside a box first, each box given a
    # quarter of the budget not yet given out, the whole query the rest
    leaves = [tr.leaf("sym", p) for p in params] + [tr.leaf("var", v) for v in vars_] + \
        [tr.leaf("data", d) for d in data]
    left = timeout
    r = z3.unknown
    for bound in (4, 16, 64):
        s.push()
        s.add(*[z3.And(x >= -bound, x <= bound) for x in leaves])
        limit(s, left / 4)
        left -= left / 4
        r = s.check()
        if r == z3.sat:
            break
        s.pop()
    if r != z3.sat:
        limit(s, left)
        r = s.check()
    if r == z3.unsat:
        return Answer("unsat")
    if r == z3.unknown:
        return Answer("unknown", reason=f"z3: {s.reason_unknown()}")
    m = s.model()
    point: dict[str, Any] = {}
    for p in params:
        point[p] = m.eval(tr.leaf("sym", p), model_completion=True).as_long()
    for v in vars_:
        point[v] = m.eval(tr.leaf("var", v), model_completion=True).as_long()
    for d in data:
        point["%" + d] = m.eval(tr.leaf("data", d), model_completion=True).as_long()
    return Answer("sat", point)


# ---------------------------------------------------------------------------
# scalar algebra (reducer laws)


class Scalar:
    """Z3 terms for the scalar ops of one dtype (``real=True``: exact reals)."""

    def __init__(self, dt: DType, real: bool = False):
        self.z3 = z3 = _z3()
        self.dt = dt
        self.real = real
        if real:
            self.sort = z3.RealSort()
        elif dt.is_float:
            self.sort = {16: z3.Float16(), 32: z3.Float32(), 64: z3.Float64()}.get(dt.bits)
            if dt.name == "bf16":
                self.sort = z3.FPSort(8, 8)
        elif dt.is_bool:
            self.sort = z3.BoolSort()
        else:
            self.sort = z3.BitVecSort(dt.bits)
        self.rm = z3.RNE()

    def var(self, name: str) -> Any:
        return self.z3.Const(name, self.sort)

    def const(self, v: Any) -> Any:
        z3, dt = self.z3, self.dt
        if self.real:
            if isinstance(v, float) and not math.isfinite(v):
                raise ValueError(f"{v} has no real counterpart")
            return z3.RealVal(v)
        if dt.is_float:
            return z3.FPVal(float(v), self.sort)
        if dt.is_bool:
            return z3.BoolVal(bool(v))
        return z3.BitVecVal(int(v) & ((1 << dt.bits) - 1), dt.bits)

    def op(self, name: str, a: Any, b: Any | None = None) -> Any:
        """The binary op ``name`` (the interpreter's elementwise op names)."""
        z3, dt = self.z3, self.dt
        if self.real:
            table = {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b,
                     "maximum": lambda: z3.If(a >= b, a, b),
                     "minimum": lambda: z3.If(a <= b, a, b), "neg": lambda: -a}
        elif dt.is_float:
            def extreme(is_max: bool) -> Any:
                pick = z3.fpGT(a, b) if is_max else z3.fpLT(a, b)
                zeros = z3.And(z3.fpEQ(a, b), (z3.Not(z3.fpIsNegative(a)) if is_max
                                               else z3.fpIsNegative(a)))
                nan = z3.fpNaN(self.sort)
                return z3.If(z3.Or(z3.fpIsNaN(a), z3.fpIsNaN(b)), nan,
                             z3.If(z3.Or(pick, zeros), a, b))
            table = {"add": lambda: z3.fpAdd(self.rm, a, b), "sub": lambda: z3.fpSub(self.rm, a, b),
                     "mul": lambda: z3.fpMul(self.rm, a, b), "div": lambda: z3.fpDiv(self.rm, a, b),
                     "maximum": lambda: extreme(True), "minimum": lambda: extreme(False),
                     "neg": lambda: z3.fpNeg(a), "abs": lambda: z3.fpAbs(a)}
        elif dt.is_bool:
            table = {"and": lambda: z3.And(a, b), "or": lambda: z3.Or(a, b),
                     "xor": lambda: z3.Xor(a, b), "maximum": lambda: z3.Or(a, b),
                     "minimum": lambda: z3.And(a, b), "add": lambda: z3.Or(a, b),
                     "mul": lambda: z3.And(a, b), "not": lambda: z3.Not(a)}
        else:
            gt = (lambda x, y: x > y) if dt.is_signed else z3.UGT
            lt = (lambda x, y: x < y) if dt.is_signed else z3.ULT
            table = {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b,
                     "and": lambda: a & b, "or": lambda: a | b, "xor": lambda: a ^ b,
                     "maximum": lambda: z3.If(gt(a, b), a, b),
                     "minimum": lambda: z3.If(lt(a, b), a, b), "neg": lambda: -a,
                     "bitnot": lambda: ~a}
        if name not in table:
            raise KeyError(f"no Z3 semantics for '{name}' on {dt}")
        return table[name]()

    def ite(self, c: Any, a: Any, b: Any) -> Any:
        return self.z3.If(c, a, b)

    def compare(self, name: str, a: Any, b: Any) -> Any:
        z3, dt = self.z3, self.dt
        if dt.is_float and not self.real:
            return {"lt": z3.fpLT, "le": z3.fpLEQ, "gt": z3.fpGT, "ge": z3.fpGEQ,
                    "eq": z3.fpEQ, "ne": lambda x, y: z3.Not(z3.fpEQ(x, y))}[name](a, b)
        if not self.real and not dt.is_bool and not dt.is_signed:
            return {"lt": z3.ULT, "le": z3.ULE, "gt": z3.UGT, "ge": z3.UGE,
                    "eq": lambda x, y: x == y, "ne": lambda x, y: x != y}[name](a, b)
        return {"lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b, "eq": a == b,
                "ne": a != b}[name]

    def value(self, term: Any) -> Any:
        """A model value as a Python number (floats exactly, via their bits)."""
        z3, dt = self.z3, self.dt
        if self.real:
            return float(term.as_fraction()) if hasattr(term, "as_fraction") else str(term)
        if dt.is_float:
            if z3.is_fp_value(term) and term.isNaN():
                return math.nan
            bits = z3.simplify(z3.fpToIEEEBV(term)).as_long()
            if dt.bits == 32:
                return struct.unpack("<f", struct.pack("<I", bits))[0]
            if dt.bits == 64:
                return struct.unpack("<d", struct.pack("<Q", bits))[0]
            return bits
        if dt.is_bool:
            return bool(z3.is_true(term))
        v = term.as_long()
        if dt.is_signed and v >= 1 << (dt.bits - 1):
            v -= 1 << dt.bits
        return v


def _law_probes(alg: Scalar) -> list[float]:
    """Values at which float laws typically break, scaled to the format:
    ``big = 2^(emax//2 + 1)``, whose square overflows, its negation
    (cancellation), 1, a small power of two, and two inexact values."""
    ebits = alg.sort.ebits()
    emax = (1 << (ebits - 1)) - 1
    big = 2.0 ** (emax // 2 + 1)
    return [big, -big, 1.0, 1.0 / big, 3.0, 0.1]


def _probe_law(alg: Scalar, xs: dict[str, list[Any]], goal: Any, left: Sequence[Any],
               right: Sequence[Any], limit: int = 512) -> dict[str, Any] | None:
    """A counterexample of a float law among fixed points, or ``None``.

    The law is evaluated exactly (Z3's simplifier folds IEEE operations on
    constants) at each combination of :func:`_law_probes` values (one value
    per state, shared by its components), at most ``limit`` of them in a
    fixed order: the same search on every run and machine, so the common
    refutations (float addition and multiplication are not associative) never
    depend on the solver's time. A point found is a genuine counterexample;
    none found decides nothing."""
    z3 = alg.z3
    vals = [alg.const(v) for v in _law_probes(alg)]
    names = list(xs)
    for combo in itertools.islice(itertools.product(vals, repeat=len(names)), limit):
        pairs = [(x, v) for n, v in zip(names, combo, strict=True) for x in xs[n]]
        if z3.is_true(z3.simplify(z3.substitute(goal, *pairs))):
            point = {n: tuple(alg.value(v) for _ in xs[n])
                     for n, v in zip(names, combo, strict=True)}
            point["lhs"] = tuple(alg.value(z3.simplify(z3.substitute(t, *pairs))) for t in left)
            point["rhs"] = tuple(alg.value(z3.simplify(z3.substitute(t, *pairs))) for t in right)
            return point
    return None


def prove_law(alg: Scalar, names: Sequence[str], lhs: Callable[..., Sequence[Any]],
              rhs: Callable[..., Sequence[Any]], width: int, timeout: float,
              expect: bool | None = None) -> Answer:
    """Decide ``forall xs: lhs(xs) == rhs(xs)`` where each name stands for a
    state of ``width`` components; a counterexample maps names to tuples.
    ``expect`` orders the float portfolio (an expected law is tried unboxed
    first); it never changes a verdict. A float law not expected to hold is
    first evaluated at fixed points (:func:`_probe_law`), then searched by
    the solver."""
    z3 = alg.z3
    xs = {n: [alg.var(f"{n}{i}") for i in range(width)] for n in names}
    try:
        left, right = lhs(**xs), rhs(**xs)
    except (KeyError, ValueError) as e:
        return Answer("unknown", reason=str(e))
    goal = z3.Or([a != b for a, b in zip(left, right, strict=True)])
    left_s = timeout  # the budget not yet given out
    fp = alg.dt.is_float and not alg.real
    if fp and not expect:  # a law expected to hold would pass every probe
        point = _probe_law(alg, xs, goal, left, right)
        if point is not None:
            return Answer("sat", point)
    decided = False
    r = z3.unknown
    if fp:
        # float-law counterexamples have heavy-tailed search times: a portfolio
        # of short restarts (seeds, magnitude boxes) finds them quickly; any
        # point found is a genuine counterexample, while "unsat" inside a box
        # proves nothing, so the full query follows
        boxes = [None, (1e-6, 1e6), (1.0, 1e8)] if expect else [(1e-6, 1e6), None, (1.0, 1e8)]
        for k in range(12):
            if left_s < timeout / 2:
                break
            s = z3.Solver()
            share = min(0.3, left_s / 4)
            limit(s, share)
            left_s -= share
            s.set("random_seed", k)
            s.add(goal)
            box = boxes[k % 3]
            if box is not None:
                lo, hi = z3.FPVal(box[0], alg.sort), z3.FPVal(box[1], alg.sort)
                for v in xs.values():
                    for x in v:
                        s.add(z3.fpGT(z3.fpAbs(x), lo), z3.fpLT(z3.fpAbs(x), hi))
            r = s.check()
            if r == z3.sat or (r == z3.unsat and box is None):
                decided = True  # a boxed "unsat" never decides
                break
    if not decided:
        s = z3.Solver()
        limit(s, left_s)
        s.add(goal)
        r = s.check()
    if r == z3.unsat:
        return Answer("unsat")
    if r == z3.unknown:
        return Answer("unknown", reason=f"z3: {s.reason_unknown()}")
    m = s.model()
    point = {n: tuple(alg.value(m.eval(x, model_completion=True)) for x in v)
             for n, v in xs.items()}
    point["lhs"] = tuple(alg.value(m.eval(t, model_completion=True)) for t in left)
    point["rhs"] = tuple(alg.value(m.eval(t, model_completion=True)) for t in right)
    return Answer("sat", point)
