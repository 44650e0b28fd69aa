"""Interval shadows: the admitted set of a value, bounded rigorously.

When the oracle runs, a tile value whose admitted set is not a single point
carries, besides its canonical value, float64 bounds ``lo <= v <= hi`` that
contain every value an admitted execution can produce for it (``NaN`` in a
bound means "not bounded": any value, NaN included, is admitted). A value
without bounds is *exact*: every admitted execution produces its canonical
bits. Inexactness enters only where the calculus grants freedom --
floating-point reductions under a tree policy and reassociating ``mma`` -- and
then propagates: each lifted op maps input intervals to an interval containing
all results, rounded outward to the op's dtype (and widened by the documented
ulp bound of a transcendental).

Rounding bounds (``u`` = unit roundoff of the dtype, ``eta`` = its smallest
subnormal): any evaluation order of ``s = x_1 + ... + x_n`` satisfies
``|fl(s) - s| <= gamma(n-1) * sum|x_i| + (n-1) * eta`` with
``gamma(k) = k*u / (1 - k*u)``; a product of ``n`` factors satisfies
``|fl(p) - p| <= gamma(n-1) * |p| + (n-1) * eta``-like bounds, used with the
magnitude of the interval.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from ..semantics.dtypes import DType

_F64 = np.float64

#: (unit roundoff, smallest positive subnormal) per float dtype
ROUNDOFF = {
    "f16": (2.0 ** -11, 2.0 ** -24),
    "bf16": (2.0 ** -8, 2.0 ** -133),
    "f32": (2.0 ** -24, 2.0 ** -149),
    "f64": (2.0 ** -53, 2.0 ** -1074),
}


def gamma(n: Any, dt: DType) -> Any:
    """``n*u / (1 - n*u)`` (inf when ``n*u >= 1``)."""
    u, _ = ROUNDOFF[dt.name]
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


def bounds_of(v: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(lo, hi)`` of a runtime value (its canonical value when exact)."""
    if v.lo is not None:
        return v.lo, v.hi
    a = np.asarray(v.a)
    f = a.astype(_F64) if a.dtype != np.bool_ else a.astype(_F64)
    return f, f


def magnitude(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return np.maximum(np.abs(lo), np.abs(hi))


def hull(a: tuple, b: tuple) -> tuple[np.ndarray, np.ndarray]:
    """The smallest interval containing both (NaN = unbounded propagates)."""
    return np.minimum(a[0], b[0]), np.maximum(a[1], b[1])


_INC = {"exp": np.exp, "exp2": np.exp2, "log": np.log, "log2": np.log2, "log1p": np.log1p,
        "expm1": np.expm1, "sqrt": np.sqrt, "tanh": np.tanh, "floor": np.floor,
        "ceil": np.ceil, "trunc": np.trunc, "round": np.round,
        "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x))}


def _erf(x: np.ndarray) -> np.ndarray:
    import math

    return np.vectorize(math.erf, otypes=[_F64])(x) if np.size(x) else np.asarray(x, _F64)


def unary(name: str, lo: np.ndarray, hi: np.ndarray, dt: DType, ulp: float
          ) -> tuple[np.ndarray, np.ndarray]:
    """An interval containing ``f(x)`` (as rounded in ``dt``) for all x in [lo, hi]."""
    with np.errstate(all="ignore"):
        if name in _INC or name == "erf":
            f = _erf if name == "erf" else _INC[name]
            rlo, rhi = f(lo), f(hi)
        elif name == "rsqrt":
            rlo, rhi = 1.0 / np.sqrt(hi), 1.0 / np.sqrt(lo)
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
        elif name in ("isnan", "isinf", "isfinite", "signbit"):
            rlo, rhi = np.zeros_like(lo), np.ones_like(hi)
        else:
            return np.full_like(lo, np.nan), np.full_like(hi, np.nan)
        if dt.is_float and ulp:
            u, e = ROUNDOFF[dt.name]
            rlo = rlo - ulp * 2 * u * np.abs(rlo) - ulp * e
            rhi = rhi + ulp * 2 * u * np.abs(rhi) + ulp * e
    return round_out(rlo, rhi, dt) if name not in ("not", "isnan", "isinf", "isfinite",
                                                   "signbit") else (rlo, rhi)


def _corners(f: Any, alo, ahi, blo, bhi) -> tuple[np.ndarray, np.ndarray]:
    c = [f(alo, blo), f(alo, bhi), f(ahi, blo), f(ahi, bhi)]
    lo = np.minimum(np.minimum(c[0], c[1]), np.minimum(c[2], c[3]))
    hi = np.maximum(np.maximum(c[0], c[1]), np.maximum(c[2], c[3]))
    return lo, hi


def binary(name: str, alo, ahi, blo, bhi, dt: DType) -> tuple[np.ndarray, np.ndarray]:
    """An interval containing ``a op b`` (rounded in ``dt``) for a, b in their intervals.
    Comparisons give ``[0, 0]``/``[1, 1]`` when decided and ``[0, 1]`` otherwise."""
    with np.errstate(all="ignore"):
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


def cast(lo: np.ndarray, hi: np.ndarray, src: DType, dst: DType) -> tuple[np.ndarray, np.ndarray]:
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
