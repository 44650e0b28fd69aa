"""Interval shadows: the admitted set of a value, bounded rigorously.

When the oracle runs, a tile value whose admitted set is not a single point
carries, besides its canonical value, a *shadow*: three arrays ``(lo, hi, nan)``
that say, per element, which values an admitted execution can produce for it::

    admitted(e) = {x not NaN : lo[e] <= x <= hi[e]}  U  ({NaN} if nan[e])

``lo`` and ``hi`` are float64 and never NaN; ``lo > hi`` is an empty range
(:data:`EMPTY`: ``+inf, -inf``). So an element is

* a *point* when ``lo == hi`` (with the same sign bit) and not ``nan``: that
  value, bit for bit (the canonical value; its zero sign included). A zero
  whose sign an interval rule does not know is ``[-0.0, +0.0]``: both zeros,
  not a point (:func:`either_zero`);
* *NaN alone* when the range is empty and ``nan``: every admitted execution gives a
  NaN (any NaN: sign and payload are not part of the contract, numerics.py);
* a range, with NaN admitted besides or not;
* *unbounded* when the range is ``[-inf, +inf]`` and ``nan``: every value.

A value without a shadow is *exact*: every element is a point (or NaN alone) at
its canonical value. Inexactness enters only where the calculus grants
freedom -- floating-point reductions under a tree policy (:func:`tree_envelope`,
spec R-8), reassociating ``mma``, and the declared ulp bound of a
transcendental (:func:`within_ulp`, spec V-14) -- and then propagates: each
lifted op maps input sets to a set containing all results (ranges rounded
outward to the op's dtype; NaN operands give what the op gives on NaN, e.g.
NaN for arithmetic, false for comparisons; NaN produced from non-NaN operands,
``inf - inf``, ``0 * inf``, is admitted where the ranges allow it). An element
whose operands are all points or NaN alone is computed exactly: it is the
canonical value again (or its ulp ball). Where the interval rules cannot bound
a result, the element is unbounded (:func:`settle`).

Rounding model, per float format with precision ``p``, unit roundoff
``u = 2**-p``, smallest subnormal ``eta`` and overflow threshold ``Omega``
(the least magnitude that rounds to infinity): an operation whose exact
result ``z`` has ``|z| < Omega`` returns ``fl(z) = z (1 + d) + e`` with
``|d| <= u``, ``|e| <= eta / 2`` and ``d * e = 0``. For a sum of two floats
``e = 0`` exactly (a sum of multiples of ``eta`` that lands below the normal
range is itself representable); for a product or quotient the absolute term
is real (gradual underflow).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from ..semantics import numerics as N
from ..semantics.dtypes import DType, f64

_F64 = np.float64
_F32 = np.float32

#: (unit roundoff, smallest positive subnormal) per float dtype
ROUNDOFF = {
    "f16": (2.0 ** -11, 2.0 ** -24),
    "bf16": (2.0 ** -8, 2.0 ** -133),
    "f32": (2.0 ** -24, 2.0 ** -149),
    "f64": (2.0 ** -53, 2.0 ** -1074),
}


#: (precision p incl. the hidden bit, least normal exponent, greatest exponent)
FORMAT = {"f16": (11, -14, 15), "bf16": (8, -126, 127), "f32": (24, -126, 127),
          "f64": (53, -1022, 1023)}


#: the empty range (a NaN-only element has it, with ``nan`` set)
EMPTY = (np.inf, -np.inf)

Parts = tuple  # (lo, hi, nan): the shadow of a value (module docstring)


def as_f64(a: Any) -> np.ndarray:
    """Values widened exactly to float64 (16-bit floats through f32, bool as 0/1)."""
    a = np.asarray(a)
    if a.dtype.itemsize == 2 and a.dtype.kind not in "iub":
        a = a.astype(_F32)
    return a.astype(_F64)


def point_of(v: Any) -> Parts:
    """The shadow of exact values: each one alone (a NaN as NaN alone)."""
    f = as_f64(v)
    n = np.isnan(f)
    return np.where(n, np.inf, f), np.where(n, -np.inf, f), n


def full_of(shape: Any) -> Parts:
    """The unbounded shadow: every value, NaN included."""
    return np.full(shape, -np.inf), np.full(shape, np.inf), np.ones(shape, dtype=bool)


def settle(lo: Any, hi: Any, nan: Any) -> Parts:
    """The canonical form of a shadow computed by interval rules: an element with
    a NaN bound (a rule that could not bound it: ``log`` over negative values,
    ``0 * inf`` at a corner, a divisor range containing 0) admits every value."""
    lo = np.asarray(lo, dtype=_F64)
    hi = np.asarray(hi, dtype=_F64)
    nan = np.asarray(nan, dtype=bool)
    shape = np.broadcast_shapes(lo.shape, hi.shape, nan.shape)
    lo, hi, nan = (x if x.shape == shape else np.broadcast_to(x, shape) for x in (lo, hi, nan))
    bad = np.isnan(lo) | np.isnan(hi)
    if not np.any(bad):
        return lo, hi, nan
    return np.where(bad, -np.inf, lo), np.where(bad, np.inf, hi), nan | bad


def empty_range(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return lo > hi


def singleton(p: Parts) -> np.ndarray:
    """Elements whose admitted set is one value (a point, zero sign included) or
    NaN alone; ``[-0.0, +0.0]`` is both zeros, not a point."""
    lo, hi, nan = p
    return ((lo == hi) & (np.signbit(lo) == np.signbit(hi)) & ~nan) | ((lo > hi) & nan)


def either_zero(lo: Any, hi: Any, keep: Any = False) -> tuple[np.ndarray, np.ndarray]:
    """A computed range ``[0, 0]`` as ``[-0.0, +0.0]`` (except where ``keep``): an
    interval rule does not know the sign of a zero result, so both are admitted."""
    z = (lo == 0) & (hi == 0) & ~np.asarray(keep, dtype=bool)
    return np.where(z, -0.0, lo), np.where(z, 0.0, hi)


def nan_only(p: Parts) -> np.ndarray:
    lo, hi, nan = p
    return (lo > hi) & nan


def join(p: Parts, mask: Any, vlo: Any, vhi: Any | None = None) -> Parts:
    """``p`` with the range ``[vlo, vhi]`` (default: the value ``vlo``) added where
    ``mask``; the empty range is the identity of this hull."""
    lo, hi, nan = p
    vhi = vlo if vhi is None else vhi
    return np.where(mask, low(lo, vlo), lo), np.where(mask, high(hi, vhi), hi), nan


def low(a: Any, b: Any) -> np.ndarray:
    """The lesser of two lower bounds, ``-0.0`` below ``+0.0`` (so a hull keeps
    both zeros)."""
    a, b = np.asarray(a, dtype=_F64), np.asarray(b, dtype=_F64)
    return np.where((b < a) | ((b == a) & np.signbit(b)), b, a)


def high(a: Any, b: Any) -> np.ndarray:
    """The greater of two upper bounds, ``+0.0`` above ``-0.0``."""
    a, b = np.asarray(a, dtype=_F64), np.asarray(b, dtype=_F64)
    return np.where((b > a) | ((b == a) & ~np.signbit(b)), b, a)


def hull3(a: Parts, b: Parts) -> Parts:
    """The smallest shadow containing both."""
    return low(a[0], b[0]), high(a[1], b[1]), a[2] | b[2]


def _placeholder(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A range to evaluate interval rules on, 0 where the range is empty (the result
    is made empty there afterwards)."""
    e = lo > hi
    return np.where(e, 0.0, lo), np.where(e, 0.0, hi), e


def max_finite(dt: DType) -> float:
    p, _, emax = FORMAT[dt.name]
    return (2.0 - 2.0 ** (1 - p)) * 2.0 ** emax


def overflow_threshold(dt: DType) -> float:
    """``Omega``: exact results of magnitude ``>= Omega`` round to infinity. For
    f64 it is not a float64 value; the greatest finite f64 stands in for it (a
    smaller threshold only makes overflow tests more conservative)."""
    p, _, emax = FORMAT[dt.name]
    return max_finite(dt) if dt.name == "f64" else (2.0 - 2.0 ** -p) * 2.0 ** emax


def ulp(y: Any, dt: DType) -> np.ndarray:
    """``ulp_dt(y)``: the spacing of ``dt`` in the binade of ``|y|``,
    ``2**(max(e, emin) - p + 1)`` with ``2**e <= |y| < 2**(e+1)`` (the subnormal
    spacing for ``|y|`` below the least normal, also for 0). NaN for non-finite y."""
    p, emin, _ = FORMAT[dt.name]
    y = np.abs(np.asarray(y, dtype=_F64))
    with np.errstate(all="ignore"):
        _, e = np.frexp(np.where(np.isfinite(y), y, 1.0))
        r = np.ldexp(1.0, np.maximum(e - 1, emin) - p + 1)
    return np.where(np.isfinite(y), r, np.nan)


def round_in(lo: np.ndarray, hi: np.ndarray, dt: DType) -> tuple[np.ndarray, np.ndarray]:
    """``[lo, hi]`` shrunk to its least and greatest values representable in ``dt``
    (as float64); ``lo > hi`` afterwards when no value of ``dt`` lies inside."""
    lo = np.asarray(lo, dtype=_F64)
    hi = np.asarray(hi, dtype=_F64)
    if dt.name == "f64":
        return lo, hi
    t = dt.np
    with np.errstate(all="ignore"):
        cl = lo.astype(t)
        ch = hi.astype(t)
        cl = np.where(cl.astype(_F64) < lo, _next(cl, True), cl)
        ch = np.where(ch.astype(_F64) > hi, _next(ch, False), ch)
    return cl.astype(_F64), ch.astype(_F64)


def within_ulp(y: np.ndarray, canonical: np.ndarray, dt: DType, k: float,
               declared: bool = False) -> Parts:
    """The admitted set of a function with a ``k``-ulp bound whose operands are
    exact (spec V-14): the values ``t`` of ``dt`` with ``|t - y| <= k ulp_dt(y)``,
    ``y`` the unrounded float64 value. Where the canonical (rounded) result is NaN,
    infinite or zero, the contract is bitwise: the canonical value alone (a NaN:
    NaN alone). A ``declared`` bound (the op's ``ulp`` attribute) measures
    every finite ``y`` by distance alone, an infinity standing for every
    value from ``+-2^(emax+1)`` on: zero is admitted where it is within the
    bound, an infinity where ``y`` is within it of that power or beyond; only
    a NaN or infinite ``y`` stays bitwise."""
    cf = as_f64(canonical)
    y = np.asarray(y, dtype=_F64)
    point = ~np.isfinite(y) if declared else ~np.isfinite(cf) | (cf == 0) | ~np.isfinite(y)
    with np.errstate(all="ignore"):
        w = k * ulp(np.where(point, 0.0, y), dt)
        lo, hi = round_in(y - w, y + w, dt)
        if declared and dt.name != "f64":
            top = 2.0 ** (FORMAT[dt.name][2] + 1)
            lo = np.where(y - w <= -top, -np.inf, lo)
            hi = np.where(y + w >= top, np.inf, hi)
    plo, phi, pnan = point_of(cf)
    # the canonical value is admitted by construction (it is y rounded once)
    lo, hi = np.where(point, plo, np.fmin(lo, cf)), np.where(point, phi, np.fmax(hi, cf))
    return lo, hi, pnan & point


def widen_ulp(lo: np.ndarray, hi: np.ndarray, dt: DType, k: float
              ) -> tuple[np.ndarray, np.ndarray]:
    """An interval of float64 function values ``[lo, hi]`` (each endpoint the
    float64 evaluation at an extreme operand) widened so that it contains every
    value admitted within ``k`` ulp of any ``y`` in it: first by one float64 step
    each way (float64 evaluations need not be monotone to the last bit), then by
    ``k * ulp_dt(m)`` with ``m = max(|lo|, |hi|)``, which bounds ``ulp_dt(y)`` for
    every y inside. The caller rounds outward to ``dt``."""
    if not k:
        return lo, hi
    with np.errstate(all="ignore"):
        lo = np.nextafter(lo, -np.inf)
        hi = np.nextafter(hi, np.inf)
        w = k * ulp(np.where(np.isfinite(lo) & np.isfinite(hi), np.fmax(np.abs(lo), np.abs(hi)),
                             0.0), dt)
        w = np.where(np.isnan(w), 0.0, w)
        return lo - w, hi + w


#: the significant bits an ``mma`` with FP8 operands keeps in its sums when it
#: may reassociate (spec/values.md V-24): the tensor cores add FP8 products
#: into a narrower accumulator than f32 (on an H200, a product 2^-14 next to
#: 1 is lost, 2^-13 kept, and 31 terms 2^-16 after a 1 are all lost:
#: ``benchmarks/fp8_accumulation.py``), so each addition is admitted as
#: rounded faithfully to this many bits
FP8_MMA_BITS = 14


def gamma(n: Any, dt: DType, unit: float | None = None) -> Any:
    """``n*u / (1 - n*u)`` (inf when ``n*u >= 1``), ``u`` the unit roundoff
    of ``dt`` unless ``unit`` gives another."""
    u = ROUNDOFF[dt.name][0] if unit is None else unit
    n = np.asarray(n, dtype=_F64)
    d = 1.0 - n * u
    return np.where(d > 0, n * u / np.where(d > 0, d, 1.0), np.inf)


def eta(dt: DType) -> float:
    return ROUNDOFF[dt.name][1]


def _next(x: np.ndarray, up: bool) -> np.ndarray:
    """The neighbour of each value of ``x`` (a float array of its dtype) toward +-inf."""
    if x.dtype == np.dtype(ml_dtypes.bfloat16):
        b = x.view(np.uint16).astype(np.int32)
        neg = (b & 0x8000) != 0
        mag = b & 0x7FFF
        zero = mag == 0
        step_away = np.where(up, ~neg, neg)
        nb = np.where(zero, np.where(up, 0x0001, 0x8001),
                      np.where(step_away, b + 1, b - 1))
        nb = np.where(np.isinf(x.astype(np.float32)) & step_away, b, nb)
        return nb.astype(np.uint16).view(ml_dtypes.bfloat16)
    return np.nextafter(x, np.array(np.inf if up else -np.inf, dtype=x.dtype))


def round_out(lo: np.ndarray, hi: np.ndarray, dt: DType) -> tuple[np.ndarray, np.ndarray]:
    """``[lo, hi]`` widened to values representable in ``dt`` (as float64)."""
    lo = np.asarray(lo, dtype=_F64)
    hi = np.asarray(hi, dtype=_F64)
    if not dt.is_float:
        return np.floor(lo), np.ceil(hi)
    if dt.name == "f64":
        return (np.nextafter(lo, -np.inf), np.nextafter(hi, np.inf))
    t = dt.np
    with np.errstate(all="ignore"):
        cl = lo.astype(t)
        ch = hi.astype(t)
        cl = np.where(cl.astype(_F64) > lo, _next(cl, False), cl)
        ch = np.where(ch.astype(_F64) < hi, _next(ch, True), ch)
    return cl.astype(_F64), ch.astype(_F64)


def widen(lo: np.ndarray, hi: np.ndarray, err: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    with np.errstate(all="ignore"):
        return lo - err, hi + err


def magnitude(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return np.maximum(np.abs(lo), np.abs(hi))


def product(a: Parts, b: Parts) -> Parts:
    """The shadow of the exact (unrounded, float64) product ``a * b``: the corner
    products of the ranges, NaN where an operand admits NaN or the ranges meet
    ``0 * inf``; NaN alone where an operand is. (A zero range keeps the corners'
    sign: the caller treats the product as one value only when both operands
    are exact, where that sign is the product's.)"""
    al, ah, ea = _placeholder(a[0], a[1])
    bl, bh, eb = _placeholder(b[0], b[1])
    with np.errstate(all="ignore"):
        lo, hi = _corners(np.multiply, al, ah, bl, bh)
    empty = ea | eb
    a_zero, b_zero = ~ea & (al <= 0) & (ah >= 0), ~eb & (bl <= 0) & (bh >= 0)
    a_inf = ~ea & (np.isinf(al) | np.isinf(ah))
    b_inf = ~eb & (np.isinf(bl) | np.isinf(bh))
    made = (a_zero & b_inf) | (b_zero & a_inf)
    return settle(np.where(empty, np.inf, lo), np.where(empty, -np.inf, hi),
                  np.asarray(a[2], dtype=bool) | np.asarray(b[2], dtype=bool) | made)


_INC = {"exp": np.exp, "exp2": np.exp2, "log": np.log, "log2": np.log2, "log1p": np.log1p,
        "expm1": np.expm1, "sqrt": np.sqrt, "tanh": np.tanh, "floor": np.floor,
        "ceil": np.ceil, "trunc": np.trunc, "round": np.round,
        "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x))}


def _erf(x: np.ndarray) -> np.ndarray:
    import math

    return np.vectorize(math.erf, otypes=[_F64])(x) if np.size(x) else np.asarray(x, _F64)


#: the value of each predicate on a NaN operand (``signbit``: either, the sign of a
#: NaN is not part of the contract)
_ON_NAN = {"isnan": (1.0, 1.0), "isinf": (0.0, 0.0), "isfinite": (0.0, 0.0),
           "signbit": (0.0, 1.0)}


def unary(name: str, x: Parts, dt: DType, ulp: float) -> Parts:
    """The shadow of ``f(x)`` (rounded in ``dt``, within ``ulp`` ulp when declared)
    over the admitted set ``x``: the image of its range, plus ``f(NaN)`` where NaN
    is admitted (NaN itself for every float function; the predicates' value)."""
    lo, hi, nan = x
    pl, ph, empty = _placeholder(lo, hi)
    rlo, rhi = _unary_range(name, pl, ph, dt, ulp)
    rlo, rhi = np.where(empty, np.inf, rlo), np.where(empty, -np.inf, rhi)
    if name in _ON_NAN:
        v = _ON_NAN[name]
        rlo, rhi, _ = join((rlo, rhi, nan), nan, *v)
        return settle(rlo, rhi, np.zeros_like(nan))
    if not dt.is_float:
        return settle(rlo, rhi, np.zeros_like(nan))
    return settle(*either_zero(rlo, rhi), nan)


def _unary_range(name: str, lo: np.ndarray, hi: np.ndarray, dt: DType, ulp: float
                 ) -> tuple[np.ndarray, np.ndarray]:
    """An interval containing ``f(x)`` (as rounded in ``dt``) for all x in [lo, hi]
    (NaN bounds: not bounded)."""
    with np.errstate(all="ignore"):
        if name in _INC or name == "erf":
            f = _erf if name == "erf" else _INC[name]
            rlo, rhi = f(lo), f(hi)
        elif name == "rsqrt":  # rsqrt(-0.0) = -inf: a range reaching 0 may hold -0.0
            rlo = np.where(lo == 0, -np.inf, 1.0 / np.sqrt(np.where(hi == 0, 0.0, hi)))
            rhi = 1.0 / np.sqrt(np.where(lo == 0, 0.0, lo))
        elif name == "neg":
            rlo, rhi = -hi, -lo
        elif name == "abs":
            rlo = np.where(lo >= 0, lo, np.where(hi <= 0, -hi, 0.0))
            rhi = np.maximum(np.abs(lo), np.abs(hi))
            rhi = np.where(np.isnan(lo) | np.isnan(hi), np.nan, rhi)
        elif name in ("sin", "cos"):
            rlo, rhi = np.full_like(lo, -1.0), np.full_like(hi, 1.0)
            rlo = np.where(np.isnan(lo) | np.isnan(hi) | np.isinf(lo) | np.isinf(hi), np.nan, rlo)
            rhi = np.where(np.isnan(rlo), np.nan, rhi)
        elif name == "not":
            rlo, rhi = 1.0 - hi, 1.0 - lo
        elif name == "isnan":
            rlo, rhi = np.zeros_like(lo), np.zeros_like(hi)
        elif name in ("isinf", "isfinite"):
            inf = np.isinf(lo) & (lo == hi)
            fin = np.isfinite(lo) & np.isfinite(hi)
            rlo = np.where(inf if name == "isinf" else fin, 1.0, 0.0)
            rhi = np.where(fin if name == "isinf" else inf, 0.0, 1.0)
        elif name == "signbit":  # the bounds do not say the sign of a zero
            rlo, rhi = np.where(hi < 0, 1.0, 0.0), np.where(lo > 0, 0.0, 1.0)
        else:
            return np.full_like(lo, np.nan), np.full_like(hi, np.nan)
        if dt.is_float and ulp:
            rlo, rhi = widen_ulp(rlo, rhi, dt, ulp)
    return round_out(rlo, rhi, dt) if name not in ("not", "isnan", "isinf", "isfinite",
                                                   "signbit") else (rlo, rhi)


def _corners(f: Any, alo, ahi, blo, bhi) -> tuple[np.ndarray, np.ndarray]:
    c = [f(alo, blo), f(alo, bhi), f(ahi, blo), f(ahi, bhi)]
    lo = np.minimum(np.minimum(c[0], c[1]), np.minimum(c[2], c[3]))
    hi = np.maximum(np.maximum(c[0], c[1]), np.maximum(c[2], c[3]))
    return lo, hi


#: binary float ops whose result is NaN when an operand is NaN (numerics.py)
_NAN_ABSORBS = ("add", "sub", "mul", "div", "rem", "floordiv", "mod", "maximum", "minimum",
                "atan2")


def binary(name: str, a: Parts, b: Parts, dt: DType) -> Parts:
    """The shadow of ``a op b`` over the admitted sets ``a`` and ``b``.

    The ranges give :func:`_binary_range` (empty when either is), plus NaN where
    the ranges reach ``inf - inf``, ``0 * inf`` and the like. A NaN operand gives
    NaN for arithmetic (``maximum``/``minimum`` too: NaN absorbs, V-12), false for
    a comparison (true for ``ne``), and NaN or 1 for ``pow`` (``pow(NaN, 0) =
    pow(1, NaN) = 1``)."""
    alo, ahi, anan = a
    blo, bhi, bnan = b
    al, ah, ea = _placeholder(alo, ahi)
    bl, bh, eb = _placeholder(blo, bhi)
    with np.errstate(all="ignore"):
        rlo, rhi = _binary_range(name, al, ah, bl, bh, dt)
    empty = ea | eb
    rlo, rhi = np.where(empty, np.inf, rlo), np.where(empty, -np.inf, rhi)
    anan, bnan = np.asarray(anan, dtype=bool), np.asarray(bnan, dtype=bool)
    some_nan = anan | bnan
    if name in ("lt", "le", "gt", "ge", "eq", "ne"):
        v = 1.0 if name == "ne" else 0.0
        rlo, rhi, _ = join((rlo, rhi, some_nan), some_nan, v)
        return settle(rlo, rhi, np.zeros(np.shape(rlo), dtype=bool))
    if not dt.is_float:
        return settle(rlo, rhi, np.zeros(np.shape(rlo), dtype=bool))
    a_inf_p, a_inf_m = ~ea & (ahi == np.inf), ~ea & (alo == -np.inf)
    b_inf_p, b_inf_m = ~eb & (bhi == np.inf), ~eb & (blo == -np.inf)
    a_zero = ~ea & (alo <= 0) & (ahi >= 0)
    b_zero = ~eb & (blo <= 0) & (bhi >= 0)
    if name == "add":
        made = (a_inf_p & b_inf_m) | (a_inf_m & b_inf_p)
    elif name == "sub":
        made = (a_inf_p & b_inf_p) | (a_inf_m & b_inf_m)
    elif name == "mul":
        made = (a_zero & (b_inf_p | b_inf_m)) | (b_zero & (a_inf_p | a_inf_m))
    elif name == "div":
        made = (a_zero & b_zero) | ((a_inf_p | a_inf_m) & (b_inf_p | b_inf_m))
    else:  # other rules leave a NaN bound where they cannot exclude NaN
        made = np.zeros(np.shape(rlo), dtype=bool)
    nan = some_nan | made
    if name == "pow":
        one = (anan & b_zero) | (bnan & ~ea & (alo <= 1) & (ahi >= 1))
        rlo, rhi, _ = join((rlo, rhi, nan), one, 1.0)
    return settle(*either_zero(rlo, rhi), nan)


def _binary_range(name: str, alo, ahi, blo, bhi, dt: DType) -> tuple[np.ndarray, np.ndarray]:
    """An interval containing ``a op b`` (rounded in ``dt``) for a, b in their intervals.
    Comparisons give ``[0, 0]``/``[1, 1]`` when decided and ``[0, 1]`` otherwise.
    ``pow`` and ``atan2`` are bounded from the corners of the operand box where that
    is sound (below) and widened by their declared ulp bound."""
    with np.errstate(all="ignore"):
        if name in ("pow", "atan2") and dt.is_float:
            lo, hi = _pow_atan2(name, alo, ahi, blo, bhi)
            lo, hi = widen_ulp(lo, hi, dt, N.ulp_bound(name, dt))
            return round_out(lo, hi, dt)
        if name == "add":
            r = alo + blo, ahi + bhi
        elif name == "sub":
            r = alo - bhi, ahi - blo
        elif name == "mul":
            r = _corners(np.multiply, alo, ahi, blo, bhi)
        elif name == "div":
            lo, hi = _corners(np.divide, alo, ahi, blo, bhi)
            zero = (blo <= 0) & (bhi >= 0)
            r = np.where(zero, np.nan, lo), np.where(zero, np.nan, hi)
        elif name == "maximum":
            r = np.maximum(alo, blo), np.maximum(ahi, bhi)
        elif name == "minimum":
            r = np.minimum(alo, blo), np.minimum(ahi, bhi)
        elif name in ("lt", "le", "gt", "ge", "eq", "ne"):
            return _compare(name, alo, ahi, blo, bhi)
        elif name in ("and", "or") and dt.is_bool:
            f = np.minimum if name == "and" else np.maximum
            return f(alo, blo), f(ahi, bhi)
        else:
            n = np.broadcast_shapes(np.shape(alo), np.shape(blo))
            return np.full(n, np.nan), np.full(n, np.nan)
        if not dt.is_float:
            return r
        return round_out(r[0], r[1], dt)


def _pow_atan2(name: str, alo, ahi, blo, bhi) -> tuple[np.ndarray, np.ndarray]:
    """Float64 bounds of ``pow(a, b)`` / ``atan2(a, b)`` over the box.

    ``pow`` for ``a > 0`` is ``exp(b ln a)``, monotone in ``b ln a``, which is
    bilinear in ``(ln a, b)``: its extremes over the box are at corners. Where
    ``a`` may be ``<= 0`` (sign flips, NaN, poles) the result is unbounded.
    ``atan2(a, b)`` is the angle of the point ``(b, a)``; on a box that avoids the
    ray ``a = 0, b <= 0`` (origin and branch cut) the angle is continuous and
    monotone along every edge, so its extremes are at corners; otherwise every
    angle in ``[-pi, pi]`` may occur."""
    shape = np.broadcast_shapes(*(np.shape(v) for v in (alo, ahi, blo, bhi)))
    if name == "pow":
        lo, hi = _corners(np.power, alo, ahi, blo, bhi)
        bad = ~(alo > 0)
    else:
        lo, hi = _corners(np.arctan2, alo, ahi, blo, bhi)
        cut = (alo <= 0) & (ahi >= 0) & (blo <= 0)
        lo, hi = np.where(cut, -np.pi, lo), np.where(cut, np.pi, hi)
        bad = np.isnan(alo) | np.isnan(ahi) | np.isnan(blo) | np.isnan(bhi)
    lo = np.broadcast_to(np.where(bad, np.nan, lo), shape)
    hi = np.broadcast_to(np.where(bad, np.nan, hi), shape)
    return lo, hi


def _compare(name: str, alo, ahi, blo, bhi) -> tuple[np.ndarray, np.ndarray]:
    if name in ("gt", "ge"):
        return _compare({"gt": "lt", "ge": "le"}[name], blo, bhi, alo, ahi)
    unknown = np.isnan(alo) | np.isnan(ahi) | np.isnan(blo) | np.isnan(bhi)
    if name == "lt":
        true, false = ahi < blo, alo >= bhi
    elif name == "le":
        true, false = ahi <= blo, alo > bhi
    elif name == "eq":
        true = (alo == ahi) & (blo == bhi) & (alo == blo)
        false = (ahi < blo) | (bhi < alo)
    else:  # ne
        false = (alo == ahi) & (blo == bhi) & (alo == blo)
        true = (ahi < blo) | (bhi < alo)
    lo = np.where(true & ~unknown, 1.0, 0.0)
    hi = np.where(false & ~unknown, 0.0, 1.0)
    return lo, hi


def cast(x: Parts, src: DType, dst: DType, overflow: str | None = None) -> Parts:
    """The shadow of ``cast(x)``: the converted range, and where NaN is admitted
    what NaN converts to (NaN for a float, 0 for an integer, true for bool).
    Into FP8 (``overflow`` its policy): rounding to nearest even is monotone, so
    the range's ends converted bound every converted value; an end that
    overflows to NaN (f8e4m3fn, ``nonfinite``) admits NaN and is held at the
    largest finite value."""
    lo, hi, nan = x
    pl, ph, empty = _placeholder(lo, hi)
    if dst.is_fp8:
        ends = [N.cast(np.asarray(e, dtype=_F64), f64, dst, overflow).astype(_F64)
                for e in (pl, ph)]
        over = [np.isnan(r) & ~np.isnan(e) for r, e in zip(ends, (pl, ph))]
        top = N.FP8_MAX[dst.name]
        rlo, rhi = np.where(over[0], -top, ends[0]), np.where(over[1], top, ends[1])
        rlo, rhi = np.where(empty, np.inf, rlo), np.where(empty, -np.inf, rhi)
        nan = np.asarray(nan, dtype=bool) if src.is_float else np.zeros_like(nan, dtype=bool)
        return settle(*either_zero(rlo, rhi), nan | over[0] | over[1])
    rlo, rhi = _cast_range(pl, ph, src, dst)
    rlo, rhi = np.where(empty, np.inf, rlo), np.where(empty, -np.inf, rhi)
    nan = np.asarray(nan, dtype=bool)
    if dst.is_float:
        return settle(*either_zero(rlo, rhi), nan if src.is_float else np.zeros_like(nan))
    rlo, rhi, _ = join((rlo, rhi, nan), nan, 1.0 if dst.is_bool else 0.0)
    return settle(rlo, rhi, np.zeros_like(nan))


def select(c: Parts, a: Parts, b: Parts) -> Parts:
    """The shadow of ``ite(c, a, b)``: the chosen operand's where ``c`` is decided,
    else the hull of both."""
    decided = c[0] == c[1]
    pick_a = c[0] > 0
    h = hull3(a, b)
    return settle(*(np.where(decided, np.where(pick_a, x, y), z) for x, y, z in zip(a, b, h)))


def _cast_range(lo: np.ndarray, hi: np.ndarray, src: DType, dst: DType
                ) -> tuple[np.ndarray, np.ndarray]:
    with np.errstate(all="ignore"):
        if dst.is_bool:
            maybe_zero = (lo <= 0) & (hi >= 0)
            sure_zero = (lo == 0) & (hi == 0)
            return np.where(maybe_zero, 0.0, 1.0), np.where(sure_zero, 0.0, 1.0)
        if dst.is_float:
            return round_out(lo, hi, dst)
        info = np.iinfo(dst.np)
        rlo = np.clip(np.trunc(lo), info.min, info.max)
        rhi = np.clip(np.trunc(hi), info.min, info.max)
        nan = np.isnan(lo) | np.isnan(hi)
        return np.where(nan, np.nan, rlo), np.where(nan, np.nan, rhi)


# ---------------------------------------------------------------------------
# Tree reductions (spec R-8)

_U64 = 2.0 ** -53


def _gamma64(n: int) -> float:
    """``gamma_n`` of float64: bounds the float64 error of an n-step evaluation of
    an envelope itself (sums and products computed here in float64)."""
    return n * _U64 / (1.0 - n * _U64)


def _leaf_parts(lo: Any, hi: Any, nan: Any, point: Any, canon: Any
                ) -> tuple[np.ndarray, ...]:
    """Leaves in one form: ``(lo, hi, point, canon, sure_nan, may_nan)``. A point
    leaf has ``lo == hi == canon``; a NaN-alone leaf is a point whose canonical
    value is NaN, with the placeholder range ``[0, 0]`` (the result is NaN in every
    tree, so its range is never read); ``may_nan`` marks the other leaves that
    admit NaN besides their range."""
    lo = np.asarray(lo, dtype=_F64)
    hi = np.asarray(hi, dtype=_F64)
    nan = np.asarray(nan, dtype=bool)
    point = np.asarray(point, dtype=bool)
    canon = np.asarray(canon, dtype=_F64)
    alone = (nan & (lo > hi)) | (point & np.isnan(canon))
    point = point | alone
    canon = np.where(alone, np.nan, canon)
    lo = np.where(alone, 0.0, np.where(point, canon, lo))
    hi = np.where(alone, 0.0, np.where(point, canon, hi))
    return lo, hi, point, canon, alone, nan & ~point


def tree_envelope(contract: str, dt: DType, lo: np.ndarray, hi: np.ndarray, nan: np.ndarray,
                  point: np.ndarray, canon: np.ndarray) -> tuple[np.ndarray, ...]:
    """The admitted set of every value a float ``add``/``mul``/``max``/``min`` tree
    can produce.

    The leaves (the seed and every lifted contribution; identity leaves change no
    value: ``x + -0.0 = x``, ``x * 1 = x``, ``max(x, -inf) = x`` exactly) lie along
    axis 0: leaf ``i`` takes any value of its shadow ``(lo_i, hi_i, nan_i)``, or
    exactly ``canon_i`` where ``point_i``. Every binary tree over every
    permutation of the leaves is covered (so ``ordered_tree`` too). Returns the
    shadow ``(lo, hi, nan)`` and ``point`` over the remaining axes: ``point`` marks
    results that are the same in every tree (the canonical value, bit for bit; a
    NaN as NaN alone). A leaf that admits NaN makes the result admit NaN; a leaf
    that is NaN alone makes it NaN alone. The rules, derived from
    ``fl(z) = z (1 + d) + e`` (module docstring), are stated in
    spec/reductions.md R-8."""
    lo, hi, point, canon, sure_leaf, may_leaf = _leaf_parts(lo, hi, nan, point, canon)
    with np.errstate(all="ignore"):
        if contract in ("max", "min"):
            f = np.max if contract == "max" else np.min
            rlo, rhi = f(lo, axis=0), f(hi, axis=0)
            sure_nan = np.any(sure_leaf, axis=0)  # V-12: NaN absorbs
            rlo, rhi = np.where(sure_nan, np.inf, rlo), np.where(sure_nan, -np.inf, rhi)
            pt = sure_nan | np.all(point, axis=0)  # exact laws, one result
            return (*either_zero(rlo, rhi, pt), sure_nan | np.any(may_leaf, axis=0), pt)
        if contract == "add":
            acc = SumLeaves()
            acc.add_many(lo, hi, may_leaf | sure_leaf, point, canon, dt)
            return acc.envelope(dt)
        if contract == "mul":
            return _product_envelope(dt, lo, hi, point, canon, sure_leaf, may_leaf)
    raise ValueError(f"no floating-point envelope for contract '{contract}'")


class SumLeaves:
    """The leaves of a floating-point sum, accumulated one leaf (array) at a time:
    the few sums and flags the envelope needs, so that a sum over many leaves
    (an ``mma`` contraction) never stacks them. :meth:`envelope` gives the bounds."""

    def __init__(self) -> None:
        self.n = 0
        self.stats: dict[str, np.ndarray] = {}

    def add(self, lo: Any, hi: Any, nan: Any, point: Any, canon: Any, dt: DType) -> None:
        """One leaf: any value of the shadow ``(lo, hi, nan)``, or exactly ``canon``
        where ``point``."""
        new = self._stats(lo, hi, nan, point, canon, dt)
        self.n += 1
        if not self.stats:
            self.stats = new
            return
        st = self.stats
        with np.errstate(all="ignore"):
            for key in ("lo", "hi", "A", "up", "dn"):
                st[key] = st[key] + new[key]
            for key in ("may_pinf", "may_minf", "sure_pinf", "sure_minf", "nan", "may_nan"):
                st[key] = st[key] | new[key]
            st["zero"] = st["zero"] & new["zero"]

    def add_many(self, lo: Any, hi: Any, nan: Any, point: Any, canon: Any, dt: DType) -> None:
        """The leaves along axis 0 of the arrays, added in that order: the same
        float64 sums, rounded step by step, as :meth:`add` called on each in turn
        (numpy's ``accumulate`` is sequential)."""
        new = self._stats(lo, hi, nan, point, canon, dt)
        k = np.shape(new["lo"])[0]
        if k == 0:
            return
        if self.stats:  # the leaves so far count as one more leaf in front
            def joined(old: np.ndarray, v: np.ndarray) -> np.ndarray:
                rest = np.broadcast_shapes(np.shape(old), np.shape(v)[1:])
                return np.concatenate([np.broadcast_to(old, rest)[None],
                                       np.broadcast_to(v, (k,) + rest)])

            new = {key: joined(self.stats[key], v) for key, v in new.items()}
        with np.errstate(all="ignore"):
            self.stats = {key: np.add.accumulate(v, axis=0)[-1] for key, v in new.items()
                          if key in ("lo", "hi", "A", "up", "dn")}
        for key in ("may_pinf", "may_minf", "sure_pinf", "sure_minf", "nan", "may_nan"):
            self.stats[key] = np.any(new[key], axis=0)
        self.stats["zero"] = np.all(new["zero"], axis=0)
        self.n += k

    @staticmethod
    def _stats(lo: Any, hi: Any, nan: Any, point: Any, canon: Any, dt: DType
               ) -> dict[str, np.ndarray]:
        """A leaf's (or leaves') contribution to each running statistic."""
        big = max_finite(dt)
        lo, hi, point, canon, sure_leaf, may_leaf = _leaf_parts(lo, hi, nan, point, canon)
        with np.errstate(all="ignore"):
            return {
                "lo": lo, "hi": hi,
                "A": np.minimum(np.fmax(np.abs(lo), np.abs(hi)), big),  # finite realizations
                "up": np.clip(hi, 0.0, big), "dn": np.clip(-lo, 0.0, big),
                "may_pinf": hi == np.inf, "may_minf": lo == -np.inf,
                "sure_pinf": lo == np.inf, "sure_minf": hi == -np.inf,
                "nan": sure_leaf, "may_nan": may_leaf,
                "zero": point & (canon == 0),
            }

    def envelope(self, dt: DType, rounds: int | None = None, absolute: Any = 0.0,
                 unit: float | None = None) -> tuple[np.ndarray, ...]:
        """``(lo, hi, nan, point)`` of every tree over the leaves (as
        :func:`tree_envelope`).

        Each leaf passes through at most ``rounds`` roundings (default ``n - 1``:
        the additions of a tree) and the result carries an absolute error of at
        most ``absolute`` besides (0 for a sum of floats; the products' underflow
        for ``mma``). Without overflow every partial is ``sum_S x_i (1 + theta_i)``
        (+ its share of ``absolute``) with ``|theta_i| <= gamma_rounds``, so
        ``|y - sum x| <= gamma_rounds * A + absolute``, ``A = sum |x_i|``. A partial
        can reach ``+inf`` only if ``Up + that >= Omega`` with ``Up`` the sum of
        the positive parts (or a leaf may be ``+inf``); likewise ``-inf``; NaN
        needs both (or a leaf that admits NaN). ``unit``: the unit roundoff of
        the roundings when it is not ``dt``'s (a narrower accumulator)."""
        st, n = self.stats, self.n
        k = n - 1 if rounds is None else rounds
        omega = overflow_threshold(dt)
        with np.errstate(all="ignore"):
            A = st["A"]
            err = gamma(k, dt, unit) * A + 2.0 * _gamma64(n + 1) * A + absolute * (1.0 + 1e-12)
            pos = (st["up"] + err >= omega) | st["may_pinf"]
            neg = (st["dn"] + err >= omega) | st["may_minf"]
            sure_nan = st["nan"] | (st["sure_pinf"] & st["sure_minf"])
            rlo, rhi = round_out(np.where(neg, -np.inf, st["lo"] - err),
                                 np.where(pos, np.inf, st["hi"] + err), dt)
            # one sign of infinity is certain and the other impossible: that infinity
            only_p = st["sure_pinf"] & ~neg
            only_m = st["sure_minf"] & ~pos
            rlo = np.where(only_p, np.inf, np.where(only_m, -np.inf, rlo))
            rhi = np.where(only_p, np.inf, np.where(only_m, -np.inf, rhi))
            # both infinities reachable: inf - inf, and every value
            free = pos & neg & ~sure_nan
            rlo = np.where(free, -np.inf, np.where(sure_nan, np.inf, rlo))
            rhi = np.where(free, np.inf, np.where(sure_nan, -np.inf, rhi))
            # all leaves zero: an exact zero, -0.0 iff every leaf is -0.0 (a partial
            # is -0.0 only from two -0.0 operands; exact cancellation gives +0.0)
            zero = st["zero"] & ~sure_nan
            rlo = np.where(zero, st["lo"], rlo)
            rhi = np.where(zero, st["hi"], rhi)
            nan = sure_nan | free | st["may_nan"]
        pt = sure_nan | ((only_p | only_m) & ~st["may_nan"]) | zero
        return (*either_zero(rlo, rhi, pt), nan, pt)


def _product_envelope(dt, lo, hi, point, canon, nan_leaf, may_leaf):
    """Product of ``n`` leaves, ``k = n - 1`` multiplications. By induction over the
    tree, a subtree over ``m`` leaves computes ``P (1 + theta) + eps`` with
    ``|theta| <= gamma_{m-1}`` and ``|eps| <= (m - 1) (1 + gamma_{m-1}) (eta/2) G``,
    ``G = prod max(1, |x_i|)``: an absolute error made at a node is multiplied by
    the other factors, whose product is at most ``G``. When even the smallest
    partial product stays normal (``(1 - gamma_k) g >= lambda``, ``g = prod
    min(1, |x_i|)``, ``lambda`` the least normal) no node underflows and
    ``eps = 0``. Every partial is below ``(1 + gamma_k) G + E`` in magnitude (so
    no overflow if that is below ``Omega``) and above ``(1 - gamma_k) g - E`` (so
    no underflow to zero if that exceeds ``eta/2``); NaN needs an infinity and a
    zero (or a leaf that admits NaN). The sign is the product of the signs in
    every tree. Returns ``(lo, hi, nan, point)`` as :func:`tree_envelope`."""
    n = lo.shape[0]
    k = n - 1
    p, emin, _ = FORMAT[dt.name]
    half_eta = eta(dt) / 2.0
    lam = 2.0 ** emin
    omega = overflow_threshold(dt)
    g_k = float(gamma(k, dt))
    slack = 2.0 * _gamma64(2 * n + 2)
    m_hi = np.fmax(np.abs(lo), np.abs(hi))
    has0 = (lo <= 0) & (hi >= 0)
    m_lo = np.where(has0, 0.0, np.fmin(np.abs(lo), np.abs(hi)))
    G = np.prod(np.maximum(1.0, m_hi), axis=0)
    g = np.prod(np.minimum(1.0, m_lo), axis=0)
    underflow = g * (1.0 - g_k - slack) < lam
    E = np.where(underflow, (k * (1.0 + g_k) * half_eta + (n + 1) * 2.0 ** -1074) * G
                 * (1.0 + slack), 0.0)
    inf_possible = np.any(np.isinf(m_hi), axis=0) | ((1.0 + g_k + slack) * G + E >= omega)
    zero_possible = np.any(has0, axis=0) | (g * (1.0 - g_k - slack) - E <= half_eta)
    sure_inf = np.any(point & np.isinf(canon), axis=0)
    sure_zero = np.any(point & (canon == 0), axis=0)
    sure_nan = np.any(nan_leaf, axis=0) | (sure_inf & sure_zero)
    known = point | (lo > 0) | (hi < 0)
    negative = np.where(point, np.signbit(canon), hi < 0)
    sign_known = np.all(known, axis=0)
    sign_neg = (np.sum(negative, axis=0) % 2) == 1
    plo, phi = lo[0], hi[0]
    for i in range(1, n):
        plo, phi = _corners(np.multiply, plo, phi, lo[i], hi[i])
    rel = g_k + slack
    rlo = plo - rel * np.abs(plo) - E
    rhi = phi + rel * np.abs(phi) + E
    pos_only = sign_known & ~sign_neg
    neg_only = sign_known & sign_neg
    rlo = np.where(pos_only, np.maximum(rlo, 0.0), rlo)
    rhi = np.where(neg_only, np.minimum(rhi, 0.0), rhi)
    rhi = np.where(inf_possible & ~neg_only, np.inf, rhi)
    rlo = np.where(inf_possible & ~pos_only, -np.inf, rlo)
    rlo, rhi = round_out(rlo, rhi, dt)
    # a certain infinity without a possible zero, or a certain zero without a
    # possible infinity, fixes the magnitude; the sign rule fixes the rest
    e_min = eta(dt)
    may_nan = np.any(may_leaf, axis=0)
    only_inf = sure_inf & ~zero_possible & ~sure_nan
    only_zero = sure_zero & ~inf_possible & ~sure_nan
    rlo = np.where(only_inf, np.where(pos_only, np.inf, -np.inf), rlo)
    rhi = np.where(only_inf, np.where(neg_only, -np.inf, np.inf), rhi)
    rlo = np.where(only_zero, np.where(sign_known, 0.0, -e_min), rlo)
    rhi = np.where(only_zero, np.where(sign_known, 0.0, e_min), rhi)
    # an infinity and a zero both reachable: inf * 0, and every value
    free = inf_possible & zero_possible & ~sure_nan & ~only_inf & ~only_zero
    rlo = np.where(free, -np.inf, np.where(sure_nan, np.inf, rlo))
    rhi = np.where(free, np.inf, np.where(sure_nan, -np.inf, rhi))
    pt = sure_nan | ((only_inf | only_zero) & sign_known & ~may_nan)
    return (*either_zero(rlo, rhi, pt), sure_nan | free | may_nan, pt)
