"""Interval shadows: the admitted set of a value, bounded rigorously.

When the oracle runs, a tile value whose admitted set is not a single point
carries, besides its canonical value, float64 bounds ``lo <= v <= hi`` that
contain every value an admitted execution can produce for it (``NaN`` in a
bound means "not bounded": any value, NaN included, is admitted). A value
without bounds is *exact*: every admitted execution produces its canonical
bits, and so is an element whose bounds are the point ``lo == hi`` equal to
its canonical value. Inexactness enters only where the calculus grants
freedom -- floating-point reductions under a tree policy (:func:`tree_envelope`,
spec R-8), reassociating ``mma``, and the declared ulp bound of a
transcendental (:func:`within_ulp`, spec V-14) -- and then propagates: each
lifted op maps input intervals to an interval containing all results, rounded
outward to the op's dtype.

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
from ..semantics.dtypes import DType

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


def within_ulp(y: np.ndarray, canonical: np.ndarray, dt: DType, k: float
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The admitted set of a function with a ``k``-ulp bound whose operands are
    exact (spec V-14): the values ``t`` of ``dt`` with ``|t - y| <= k ulp_dt(y)``,
    ``y`` the unrounded float64 value, as ``(lo, hi, point)``. Where the canonical
    (rounded) result is NaN, infinite or zero, the contract is bitwise: ``point``
    is true there and the bounds are the canonical value (NaN included)."""
    c = np.asarray(canonical)
    cf = c.astype(_F32 if c.dtype.itemsize == 2 else c.dtype).astype(_F64)
    y = np.asarray(y, dtype=_F64)
    point = ~np.isfinite(cf) | (cf == 0) | ~np.isfinite(y)
    with np.errstate(all="ignore"):
        w = k * ulp(np.where(point, 0.0, y), dt)
        lo, hi = round_in(y - w, y + w, dt)
    lo, hi = np.where(point, cf, lo), np.where(point, cf, hi)
    # the canonical value is admitted by construction (it is y rounded once)
    return np.fmin(lo, cf), np.fmax(hi, cf), point


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
            rlo, rhi = widen_ulp(rlo, rhi, dt, ulp)
    return round_out(rlo, rhi, dt) if name not in ("not", "isnan", "isinf", "isfinite",
                                                   "signbit") else (rlo, rhi)


def _corners(f: Any, alo, ahi, blo, bhi) -> tuple[np.ndarray, np.ndarray]:
    c = [f(alo, blo), f(alo, bhi), f(ahi, blo), f(ahi, bhi)]
    lo = np.minimum(np.minimum(c[0], c[1]), np.minimum(c[2], c[3]))
    hi = np.maximum(np.maximum(c[0], c[1]), np.maximum(c[2], c[3]))
    return lo, hi


def binary(name: str, alo, ahi, blo, bhi, dt: DType) -> tuple[np.ndarray, np.ndarray]:
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


# ---------------------------------------------------------------------------
# Tree reductions (spec R-8)

_U64 = 2.0 ** -53


def _gamma64(n: int) -> float:
    """``gamma_n`` of float64: bounds the float64 error of an n-step evaluation of
    an envelope itself (sums and products computed here in float64)."""
    return n * _U64 / (1.0 - n * _U64)


def tree_envelope(contract: str, dt: DType, lo: np.ndarray, hi: np.ndarray,
                  point: np.ndarray, canon: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bounds on every value a float ``add``/``mul``/``max``/``min`` tree can produce.

    The leaves (the seed and every lifted contribution; identity leaves change no
    value: ``x + -0.0 = x``, ``x * 1 = x``, ``max(x, -inf) = x`` exactly) lie along
    axis 0: leaf ``i`` takes any value in ``[lo_i, hi_i]`` (NaN bounds: any value),
    or exactly ``canon_i`` where ``point_i``. Every binary tree over every
    permutation of the leaves is covered (so ``ordered_tree`` too). Returns
    ``(lo, hi, point)`` over the remaining axes: ``point`` marks results that are
    the same in every tree (the canonical value, bit for bit), NaN bounds mark
    results that may be NaN among other values; the rest lie in ``[lo, hi]``.
    The rules, derived from ``fl(z) = z (1 + d) + e`` (module docstring), are
    stated in spec/reductions.md R-8."""
    lo = np.asarray(lo, dtype=_F64)
    hi = np.asarray(hi, dtype=_F64)
    point = np.asarray(point, dtype=bool)
    canon = np.asarray(canon, dtype=_F64)
    with np.errstate(all="ignore"):
        lo = np.where(point, canon, lo)
        hi = np.where(point, canon, hi)
        nan_leaf = point & np.isnan(canon)
        free_leaf = ~point & (np.isnan(lo) | np.isnan(hi))
        if contract in ("max", "min"):
            f = np.max if contract == "max" else np.min
            rlo, rhi = f(lo, axis=0), f(hi, axis=0)
            sure_nan = np.any(nan_leaf, axis=0)
            pt = sure_nan | np.all(point, axis=0)  # exact laws, one result
            return rlo, rhi, pt
        if contract == "add":
            return _sum_envelope(dt, lo, hi, point, canon, nan_leaf, free_leaf)
        if contract == "mul":
            return _product_envelope(dt, lo, hi, point, canon, nan_leaf, free_leaf)
    raise ValueError(f"no floating-point envelope for contract '{contract}'")


class SumLeaves:
    """The leaves of a floating-point sum, accumulated one leaf (array) at a time:
    the few sums and flags the envelope needs, so that a sum over many leaves
    (an ``mma`` contraction) never stacks them. :meth:`envelope` gives the bounds."""

    def __init__(self) -> None:
        self.n = 0
        self.stats: dict[str, np.ndarray] = {}

    def add(self, lo: Any, hi: Any, point: Any, canon: Any, dt: DType) -> None:
        """One leaf: any value in ``[lo, hi]``, or exactly ``canon`` where ``point``."""
        big = max_finite(dt)
        point = np.asarray(point, dtype=bool)
        canon = np.asarray(canon, dtype=_F64)
        with np.errstate(all="ignore"):
            lo = np.where(point, canon, lo)
            hi = np.where(point, canon, hi)
            new = {
                "lo": lo, "hi": hi,
                "A": np.minimum(np.fmax(np.abs(lo), np.abs(hi)), big),  # finite realizations
                "up": np.clip(hi, 0.0, big), "dn": np.clip(-lo, 0.0, big),
                "may_pinf": hi == np.inf, "may_minf": lo == -np.inf,
                "sure_pinf": lo == np.inf, "sure_minf": hi == -np.inf,
                "nan": point & np.isnan(canon),
                "free": ~point & (np.isnan(lo) | np.isnan(hi)),
                "zero": point & (canon == 0),
            }
        self.n += 1
        if not self.stats:
            self.stats = new
            return
        st = self.stats
        with np.errstate(all="ignore"):
            for key in ("lo", "hi", "A", "up", "dn"):
                st[key] = st[key] + new[key]
            for key in ("may_pinf", "may_minf", "sure_pinf", "sure_minf", "nan", "free"):
                st[key] = st[key] | new[key]
            st["zero"] = st["zero"] & new["zero"]

    def envelope(self, dt: DType, rounds: int | None = None, absolute: Any = 0.0
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(lo, hi, point)`` of every tree over the leaves.

        Each leaf passes through at most ``rounds`` roundings (default ``n - 1``:
        the additions of a tree) and the result carries an absolute error of at
        most ``absolute`` besides (0 for a sum of floats; the products' underflow
        for ``mma``). Without overflow every partial is ``sum_S x_i (1 + theta_i)``
        (+ its share of ``absolute``) with ``|theta_i| <= gamma_rounds``, so
        ``|y - sum x| <= gamma_rounds * A + absolute``, ``A = sum |x_i|``. A partial
        can reach ``+inf`` only if ``Up + that >= Omega`` with ``Up`` the sum of
        the positive parts (or a leaf may be ``+inf``); likewise ``-inf``; NaN
        needs both."""
        st, n = self.stats, self.n
        k = n - 1 if rounds is None else rounds
        omega = overflow_threshold(dt)
        with np.errstate(all="ignore"):
            A = st["A"]
            err = gamma(k, dt) * A + 2.0 * _gamma64(n + 1) * A + absolute * (1.0 + 1e-12)
            pos = (st["up"] + err >= omega) | st["may_pinf"]
            neg = (st["dn"] + err >= omega) | st["may_minf"]
            sure_nan = st["nan"] | (st["sure_pinf"] & st["sure_minf"])
            rlo, rhi = round_out(np.where(neg, -np.inf, st["lo"] - err),
                                 np.where(pos, np.inf, st["hi"] + err), dt)
            # one sign of infinity is certain and the other impossible: that infinity
            only_p = st["sure_pinf"] & ~neg & ~st["free"]
            only_m = st["sure_minf"] & ~pos & ~st["free"]
            rlo = np.where(only_p, np.inf, np.where(only_m, -np.inf, rlo))
            rhi = np.where(only_p, np.inf, np.where(only_m, -np.inf, rhi))
            free = (st["free"] | (pos & neg)) & ~sure_nan
            rlo = np.where(free | sure_nan, np.nan, rlo)
            rhi = np.where(free | sure_nan, np.nan, rhi)
            # all leaves zero: an exact zero, -0.0 iff every leaf is -0.0 (a partial
            # is -0.0 only from two -0.0 operands; exact cancellation gives +0.0)
            zero = st["zero"] & ~sure_nan
            rlo = np.where(zero, st["lo"], rlo)
            rhi = np.where(zero, st["hi"], rhi)
        return rlo, rhi, sure_nan | only_p | only_m | zero


def _sum_envelope(dt, lo, hi, point, canon, nan_leaf, free_leaf):
    """Sum of the leaves along axis 0 (:class:`SumLeaves`)."""
    acc = SumLeaves()
    for i in range(lo.shape[0]):
        acc.add(lo[i], hi[i], point[i], canon[i], dt)
    return acc.envelope(dt)


def _product_envelope(dt, lo, hi, point, canon, nan_leaf, free_leaf):
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
    zero. The sign is the product of the signs in every tree."""
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
    free_any = np.any(free_leaf, axis=0)
    only_inf = sure_inf & ~zero_possible & ~sure_nan & ~free_any
    only_zero = sure_zero & ~inf_possible & ~sure_nan & ~free_any
    rlo = np.where(only_inf, np.where(pos_only, np.inf, -np.inf), rlo)
    rhi = np.where(only_inf, np.where(neg_only, -np.inf, np.inf), rhi)
    rlo = np.where(only_zero, np.where(sign_known, 0.0, -e_min), rlo)
    rhi = np.where(only_zero, np.where(sign_known, 0.0, e_min), rhi)
    free = (free_any | (inf_possible & zero_possible)) & ~sure_nan & ~only_inf & ~only_zero
    rlo = np.where(free | sure_nan, np.nan, rlo)
    rhi = np.where(free | sure_nan, np.nan, rhi)
    pt = sure_nan | ((only_inf | only_zero) & sign_known)
    return rlo, rhi, pt
