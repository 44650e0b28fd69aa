"""The ISL engine: the only place formulas are translated to isl.

A counterexample set (see :mod:`tilenest.proofs.formula`) in the quasi-affine
fragment is a Presburger set; isl decides its emptiness exactly. The set is
built over one flat tuple ``[params..., vars..., data...]`` (parameters are
ordinary dimensions here, so a sample point fixes them too), with ``floor(a/c)``,
``a mod c``, ``min``/``max``, ``exists``, ``not``, ``and``, ``or`` in isl's own
syntax. A counterexample is the lexicographic minimum of the set when it is
bounded below (smallest parameters first: the most readable witness), else any
sample point.

Budget: isl counts elementary operations; ``ops`` is set per query with
``set_max_operations``. Exceeding it (or any isl failure) is reported as
``unknown``, never as a verdict.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from ..semantics import expr as E
from . import formula as Fm

#: isl operations per second of budget (a conservative calibration on this machine)
OPS_PER_SECOND = 2_000_000
#: the least operation budget of one query
MIN_OPS = 10_000


class NonAffine(Exception):
    """A term outside the fragment isl represents."""


@dataclass
class Answer:
    """``status`` is ``empty`` (claim proved), ``point`` (counterexample in
    ``point``) or ``unknown`` (``reason``)."""

    status: str
    point: dict[str, int] | None = None
    reason: str = ""


class _Names:
    def __init__(self) -> None:
        self.map: dict[tuple[str, str], str] = {}
        self.count = 0

    def get(self, kind: str, name: str) -> str:
        key = (kind, name)
        if key not in self.map:
            self.map[key] = f"{kind[0]}{self.count}"
            self.count += 1
        return self.map[key]


def _expr(e: E.Expr, n: _Names) -> str:
    if isinstance(e, E.Const):
        return str(e.value) if e.value >= 0 else f"({e.value})"
    if isinstance(e, E.Sym):
        return n.get("sym", e.name)
    if isinstance(e, E.Var):
        return n.get("var", e.name)
    if isinstance(e, E.Val):
        return n.get("data", e.name)
    if isinstance(e, E.Add):
        return "(" + " + ".join(_expr(t, n) for t in e.terms) + ")"
    if isinstance(e, E.Mul):
        consts = [f for f in e.factors if isinstance(f, E.Const)]
        rest = [f for f in e.factors if not isinstance(f, E.Const)]
        if len(rest) > 1:
            raise NonAffine(E.to_str(e))
        c = 1
        for k in consts:
            c *= k.value
        if not rest:
            return str(c) if c >= 0 else f"({c})"
        return f"({c}*{_expr(rest[0], n)})"
    if isinstance(e, (E.FloorDiv, E.Mod)):
        if not (isinstance(e.b, E.Const) and e.b.value > 0):
            raise NonAffine(E.to_str(e))
        a = _expr(e.a, n)
        return f"floor({a}/{e.b.value})" if isinstance(e, E.FloorDiv) else f"({a} mod {e.b.value})"
    if isinstance(e, E.MinMax):
        return f"{e.op}({_expr(e.a, n)}, {_expr(e.b, n)})"
    raise NonAffine(E.to_str(e))


_OPS = {"<": "<", "<=": "<=", ">": ">", ">=": ">=", "==": "="}


def _pred(p: E.Pred, n: _Names) -> str:
    if isinstance(p, E.BoolConst):
        return "0 = 0" if p.value else "1 = 0"
    if isinstance(p, E.Cmp):
        a, b = _expr(p.a, n), _expr(p.b, n)
        if p.op == "!=":
            return f"({a} < {b} or {a} > {b})"
        return f"{a} {_OPS[p.op]} {b}"
    if isinstance(p, E.PAnd):
        return "(" + " and ".join(_pred(q, n) for q in p.items) + ")"
    if isinstance(p, E.POr):
        return "(" + " or ".join(_pred(q, n) for q in p.items) + ")"
    if isinstance(p, E.PNot):
        return f"(not {_pred(p.item, n)})"
    raise NonAffine(repr(p))


def _formula(f: Fm.F, n: _Names) -> str:
    if isinstance(f, Fm.Atom):
        return _pred(f.pred, n)
    if isinstance(f, Fm.And):
        return "(" + " and ".join(_formula(g, n) for g in f.items) + ")"
    if isinstance(f, Fm.Or):
        return "(" + " or ".join(_formula(g, n) for g in f.items) + ")"
    if isinstance(f, Fm.Not):
        return f"(not {_formula(f.item, n)})"
    if isinstance(f, Fm.Exists):
        # bound variables always get fresh names (a bound name may shadow a free one)
        saved = {v: n.map.pop(("var", v), None) for v in f.vars}
        vs = ", ".join(n.get("var", v) for v in f.vars)
        body = _formula(f.body, n)
        for v, old in saved.items():
            n.map.pop(("var", v), None)
            if old is not None:
                n.map[("var", v)] = old
        return f"(exists ({vs} : {body}))"
    raise TypeError(f)


def to_isl(f: Fm.F, params: tuple[str, ...], vars_: tuple[str, ...],
           data: tuple[str, ...]) -> tuple[str, list[tuple[str, str]]]:
    """The isl text of ``{ [params, vars, data] : f }`` and the tuple's
    ``(kind, name)`` order."""
    n = _Names()
    order = [("sym", p) for p in params] + [("var", v) for v in vars_] + \
        [("data", d) for d in data]
    for k, name in order:
        n.get(k, name)
    body = _formula(f, n)
    tup = ", ".join(n.get(k, name) for k, name in order)
    return f"{{ [{tup}] : {body} }}", order


_LOCAL = threading.local()


def _context(isl: Any) -> Any:
    """This thread's isl context (a context may not be shared between
    threads). One per thread, not one per question: a context that has
    sampled a point is never freed by islpy, about 2 KiB each, so a fresh one
    per question grew a long campaign's memory without bound."""
    ctx = getattr(_LOCAL, "ctx", None)
    if ctx is None:
        ctx = _LOCAL.ctx = isl.Context()
    return ctx


def decide(f: Fm.F, params: tuple[str, ...], vars_: tuple[str, ...], data: tuple[str, ...],
           timeout: float) -> Answer:
    """Decide emptiness of the counterexample set ``f``."""
    import islpy as isl

    try:
        text, order = to_isl(f, params, vars_, data)
    except NonAffine as e:
        return Answer("unknown", reason=f"non-affine term {e}")
    ctx = _context(isl)
    ctx.set_max_operations(max(MIN_OPS, int(timeout * OPS_PER_SECOND)))
    ctx.reset_operations()
    try:
        s = isl.Set.read_from_str(ctx, text)
        if s.is_empty():
            return Answer("empty")
        pt = _witness(s, isl)
    except isl.Error as e:
        msg = str(e)
        if "maximal number of operations" in msg:
            return Answer("unknown", reason=f"isl budget of {timeout:g}s exhausted")
        return Answer("unknown", reason=f"isl failed: {msg.splitlines()[0]}")
    point = {}
    for i, (k, name) in enumerate(order):
        v = pt.get_coordinate_val(isl.dim_type.set, i).to_python()
        point[("%" + name) if k == "data" else name] = int(v)
    return Answer("point", point)


def _witness(s: Any, isl: Any) -> Any:
    """A small point of non-empty ``s``: a sample of ``s`` clipped to the box
    ``[-b, b]`` in every coordinate, for the first of growing ``b`` that
    leaves a point, else any sample. Sampling a bounded set is cheap; the
    least point (``lexmin``, parametric integer programming) can take
    minutes on sets of a dozen coordinates with divisions, and isl's
    operation budget does not bound it."""
    n = s.dim(isl.dim_type.set)
    ctx = s.get_ctx()
    for bound in (4, 64, 4096, 1 << 20):
        box = isl.Set.universe(s.get_space())
        for i in range(n):
            box = box.lower_bound_val(isl.dim_type.set, i, isl.Val.int_from_si(ctx, -bound))
            box = box.upper_bound_val(isl.dim_type.set, i, isl.Val.int_from_si(ctx, bound))
        clipped = s.intersect(box)
        if not clipped.is_empty():
            return clipped.sample_point()
    return s.sample_point()
