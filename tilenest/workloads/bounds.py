"""Running forward-error analysis in FP64: the workloads' own oracle.

Every workload states its result twice, independently of the interpreter and
of ``tn.reference``: once as a plain FP64 numpy formula, and once as a bound on
how far any admitted execution of the kernel may be from that formula. Both
come from one object, :class:`Approx`, a pair ``(v, e)``:

* ``v`` -- the exact real value of a quantity, evaluated in FP64 by the
  workload's numpy formula (the kernel's inputs are representable in FP64,
  so ``v`` starts exact);
* ``e >= 0`` -- a bound on ``|kernel - v|``, elementwise, where ``kernel`` is
  the value the kernel's own operation sequence produces in its declared
  dtypes, under any admitted evaluation order.

Each operation maps input pairs to an output pair by the textbook first-order
rules made rigorous (``u`` is the unit roundoff of the dtype the kernel computes
in, ``eta`` its least subnormal, ``gamma(n) = n*u/(1 - n*u)``):

==================  =======================================================
operation           bound on the result's error ``e'``
==================  =======================================================
``a + b``, ``a-b``  ``p = ea + eb``;  ``e' = p + u*(|a+b| + p)``
``a * b``           ``p = |a|*eb + |b|*ea + ea*eb``;  ``e' = p + u*(|ab| + p) + eta``
``a / b``           ``p = (ea*|b| + |a|*eb) / (|b|*(|b| - eb))`` (``inf`` if ``|b| <= eb``);
                    ``e' = p + u*(|a/b| + p) + eta``
``sqrt``            monotone propagation (below), correctly rounded: ``+ u*(...)``
``f`` transcendental monotone propagation ``p = max|f(v +- e) - f(v)|``; admitted
                    realizations are within 1 ulp (spec V-14): ``+ 2u*(|f| + p) + 2 eta``,
                    within ``k`` under a declared bound: ``+ 2ku*(|f| + p) + 2k eta``
``max``, ``min``    ``max(ea, eb)`` (1-Lipschitz in the sup norm, no rounding)
``sum`` of n terms  ``p = sum(e_i)``; any summation tree of n nonzero terms:
                    ``e' = p + gamma(n-1)*(sum|v_i| + p)`` (Higham, Thm. 4.4)
``contract`` (mma)  products and sum together: ``p = sum(|a|eb + ea|b| + ea*eb)``;
                    ``e' = p + gamma(2(K+1))*(sum|a*b| + |acc| + p) + K*eta`` (covers FMA and the
                    faithful rounding of matrix units)
``cast`` to T       ``e' = e + u_T*(|v| + e) + eta_T`` (exact when T is not narrower)
==================  =======================================================

The FP64 evaluation of ``v`` itself rounds; every rule adds ``4*2^-53*|v'|``
(and ``gamma64(n)*sum|v_i|`` for sums) so that ``e`` also covers the distance
between the computed ``v`` and the exact real value. Infinite and NaN values of
``v`` are *special*: they carry ``e = 0`` and must be matched exactly.

Bounds never depend on the evaluation order the kernel chooses, so one formula
serves every schedule (block sizes, rows per program) of a workload.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..semantics import dtypes as D
from ..semantics.arrays import is_float_storage
from ..semantics.dtypes import DType

F64 = np.float64

#: (unit roundoff, least positive subnormal) of each float dtype
ROUNDOFF: dict[str, tuple[float, float]] = {
    "f16": (2.0 ** -11, 2.0 ** -24),
    "bf16": (2.0 ** -8, 2.0 ** -133),
    "f32": (2.0 ** -24, 2.0 ** -149),
    "f64": (2.0 ** -53, 2.0 ** -1074),
}

#: relative error allowance for the FP64 evaluation of one operation of a formula
SLACK64 = 4 * 2.0 ** -53


def unit(dt: DType) -> float:
    """Unit roundoff ``u`` of a float dtype."""
    return ROUNDOFF[dt.name][0]


def eta(dt: DType) -> float:
    """Least positive subnormal of a float dtype."""
    return ROUNDOFF[dt.name][1]


def gamma(n: Any, dt: DType) -> Any:
    """``n*u/(1 - n*u)``; ``inf`` once ``n*u >= 1``."""
    u = unit(dt)
    n = np.asarray(n, dtype=F64)
    den = 1.0 - n * u
    return np.where(den > 0, n * u / np.where(den > 0, den, 1.0), np.inf)


def _arr(x: Any) -> np.ndarray:
    return np.asarray(x, dtype=F64)


@dataclass
class Approx:
    """A quantity the kernel computes: exact FP64 value ``v``, error bound ``e``,
    and the dtype ``dt`` the kernel holds it in (the dtype of its arithmetic)."""

    v: np.ndarray
    e: np.ndarray
    dt: DType

    # -- construction ---------------------------------------------------------
    @staticmethod
    def exact(a: Any, dt: DType | None = None) -> "Approx":
        """An input array: its stored values, exactly."""
        a = np.asarray(a)
        if dt is None:
            dt = D.from_numpy(a.dtype)
        v = a.astype(F64)
        return Approx(v, np.zeros_like(v), dt)

    @staticmethod
    def const(c: float, dt: DType) -> "Approx":
        """A literal next to a tile of dtype ``dt``: rounded once to ``dt`` (spec V-8)."""
        v = F64(np.asarray(c, dtype=F64).astype(dt.np).astype(F64))
        return Approx(np.asarray(v), np.zeros(()), dt)

    def _lift(self, o: Any) -> "Approx":
        if isinstance(o, Approx):
            if o.dt != self.dt:
                raise TypeError(f"mixed dtypes {self.dt} and {o.dt}: cast explicitly")
            return o
        return Approx.const(o, self.dt)

    def _fin(self, v: np.ndarray, e: np.ndarray) -> "Approx":
        """Result with special (non-finite) values made exact and FP64 slack added."""
        v = _arr(v)
        with np.errstate(invalid="ignore", over="ignore"):
            e = _arr(e) + SLACK64 * np.abs(v)
        e = np.where(np.isfinite(v), e, 0.0)
        return Approx(v, np.broadcast_to(e, v.shape).copy() if v.shape else e, self.dt)

    # -- arithmetic -------------------------------------------------------------
    def __add__(self, o: Any) -> "Approx":
        o = self._lift(o)
        u = unit(self.dt)
        with np.errstate(invalid="ignore", over="ignore"):
            v = self.v + o.v
            p = self.e + o.e
            return self._fin(v, p + u * (np.abs(v) + p))

    __radd__ = __add__

    def __neg__(self) -> "Approx":
        return Approx(-self.v, self.e, self.dt)

    def __sub__(self, o: Any) -> "Approx":
        return self + (-self._lift(o))

    def __rsub__(self, o: Any) -> "Approx":
        return self._lift(o) + (-self)

    def __mul__(self, o: Any) -> "Approx":
        o = self._lift(o)
        u, et = unit(self.dt), eta(self.dt)
        with np.errstate(invalid="ignore", over="ignore"):
            v = self.v * o.v
            p = np.abs(self.v) * o.e + np.abs(o.v) * self.e + self.e * o.e
            return self._fin(v, p + u * (np.abs(v) + p) + et)

    __rmul__ = __mul__

    def __truediv__(self, o: Any) -> "Approx":
        o = self._lift(o)
        return _div(self, o)

    def __rtruediv__(self, o: Any) -> "Approx":
        return _div(self._lift(o), self)

    def __abs__(self) -> "Approx":
        return Approx(np.abs(self.v), self.e, self.dt)

    # -- shape helpers (no arithmetic) -------------------------------------------
    def __getitem__(self, k: Any) -> "Approx":
        return Approx(self.v[k], np.broadcast_to(self.e, self.v.shape)[k], self.dt)

    def reshape(self, *shape: Any) -> "Approx":
        return Approx(self.v.reshape(*shape), np.broadcast_to(self.e, self.v.shape).reshape(*shape),
                      self.dt)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.v.shape

    def with_relative(self, r: Any) -> "Approx":
        """Add a relative perturbation ``|kernel/v - 1| <= r`` on top of ``e``
        (used where a derivation bounds a whole algorithm step at once)."""
        r = _arr(r)
        return Approx(self.v, self.e * (1 + r) + r * np.abs(self.v), self.dt)


def _div(a: Approx, b: Approx) -> Approx:
    u, et = unit(a.dt), eta(a.dt)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        v = a.v / b.v
        ab = np.abs(b.v)
        den = ab * (ab - b.e)
        p = np.where(ab > b.e, (a.e * ab + np.abs(a.v) * b.e) / np.where(den > 0, den, 1.0),
                     np.inf)
        return a._fin(v, p + u * (np.abs(v) + p) + et)


def _monotone(x: Approx, f: Callable[[np.ndarray], np.ndarray], rounding_ulps: float,
              lo: float = -np.inf) -> Approx:
    """``f`` monotone on its domain: the error of ``f(x~)`` is at most the larger
    move of ``f`` between ``v`` and ``v -+ e``; then the result rounds."""
    u, et = unit(x.dt), eta(x.dt)
    with np.errstate(all="ignore"):
        fv = f(x.v)
        up = f(x.v + x.e)
        dn = f(np.maximum(x.v - x.e, lo))
        p = np.maximum(np.abs(up - fv), np.abs(dn - fv))
        p = np.where(x.e == 0, 0.0, p)
        # ``ulps`` units in the last place: at most ``ulps * 2u * |f|`` for normal results and
        # ``ulps * 2 * eta`` in the subnormal range (``rounding_ulps`` counts half-ulps)
        return x._fin(fv, p + rounding_ulps * u * (np.abs(fv) + p) + rounding_ulps * et)


# The transcendental functions: within 1 ulp (spec V-14), or within the bound
# ``ulp`` that the kernel declares for the application (``tn.tanh(x, ulp=k)``,
# V-14 *Declared bounds*; None: the function's own), which the formula must
# then state too.


def _half_ulps(ulp: float | None) -> float:
    return 2.0 * (1.0 if ulp is None else ulp)


def exp(x: Approx, ulp: float | None = None) -> Approx:
    return _monotone(x, np.exp, _half_ulps(ulp))


def tanh(x: Approx, ulp: float | None = None) -> Approx:
    return _monotone(x, np.tanh, _half_ulps(ulp))


def sigmoid(x: Approx, ulp: float | None = None) -> Approx:
    return _monotone(x, lambda t: 1.0 / (1.0 + np.exp(-t)), _half_ulps(ulp))


def log(x: Approx, ulp: float | None = None) -> Approx:
    return _monotone(x, np.log, _half_ulps(ulp), lo=0.0)


def rsqrt(x: Approx, ulp: float | None = None) -> Approx:
    return _monotone(x, lambda t: 1.0 / np.sqrt(t), _half_ulps(ulp), lo=0.0)


def sqrt(x: Approx) -> Approx:
    return _monotone(x, np.sqrt, 1.0, lo=0.0)


def maximum(a: Approx, b: Any) -> Approx:
    b = a._lift(b)
    return Approx(np.maximum(a.v, b.v), np.maximum(a.e, b.e) * np.ones_like(a.v + b.v), a.dt)


def minimum(a: Approx, b: Any) -> Approx:
    b = a._lift(b)
    return Approx(np.minimum(a.v, b.v), np.maximum(a.e, b.e) * np.ones_like(a.v + b.v), a.dt)


def where(c: np.ndarray, a: Any, b: Any) -> Approx:
    """``ite`` with an exactly known condition."""
    if not isinstance(a, Approx):
        a = b._lift(a)
    b = a._lift(b)
    return Approx(np.where(c, a.v, b.v), np.where(c, a.e, b.e), a.dt)


def cast(x: Approx, dt: DType) -> Approx:
    """Conversion to ``dt``: one rounding when ``dt`` is narrower."""
    if unit(dt) <= unit(x.dt) and eta(dt) <= eta(x.dt):
        return Approx(x.v, x.e, dt)
    u, et = unit(dt), eta(dt)
    y = Approx(x.v, x.e, dt)
    return y._fin(x.v, x.e + u * (np.abs(x.v) + x.e) + et)


def total(x: Approx, axis: Any, keepdims: bool = True) -> Approx:
    """A sum over ``axis`` in any order (tree or fold)."""
    n = int(np.prod([x.v.shape[a] for a in np.atleast_1d(axis)]))
    g = gamma(max(n - 1, 0), x.dt)
    g64 = n * 2.0 ** -53
    with np.errstate(invalid="ignore", over="ignore"):
        v = x.v.sum(axis=axis, keepdims=keepdims)
        absum = np.abs(x.v).sum(axis=axis, keepdims=keepdims)
        p = np.broadcast_to(x.e, x.v.shape).sum(axis=axis, keepdims=keepdims)
        return x._fin(v, p + g * (absum + p) + g64 * absum)


def prefix(x: Approx, axis: int) -> Approx:
    """Inclusive prefix sums along ``axis``: element ``i`` sums ``i + 1`` terms in
    any grouping that keeps their order (or in order), so its error is at most
    ``gamma_i * sum_{j<=i} |x_j|`` plus the propagated input errors."""
    n = x.v.shape[axis]
    shape = [1] * x.v.ndim
    shape[axis] = n
    i = np.arange(n, dtype=F64).reshape(shape)
    with np.errstate(invalid="ignore", over="ignore"):
        v = np.cumsum(x.v, axis=axis)
        absum = np.cumsum(np.abs(x.v), axis=axis)
        p = np.cumsum(np.broadcast_to(x.e, x.v.shape), axis=axis)
        return x._fin(v, p + gamma(i, x.dt) * (absum + p) + (i + 1) * 2.0 ** -53 * absum)


def amax(x: Approx, axis: Any, keepdims: bool = True) -> Approx:
    """A maximum over ``axis`` (exact; inherits the largest input error)."""
    e = np.broadcast_to(x.e, x.v.shape).max(axis=axis, keepdims=keepdims)
    return Approx(x.v.max(axis=axis, keepdims=keepdims), e, x.dt)


def contract(spec: str, a: Approx, b: Approx, acc: Approx | None = None) -> Approx:
    """``acc + einsum(spec, a, b)`` computed by a (reassociating) ``mma`` in
    ``acc``'s dtype (or ``a``'s): ``K`` products per output, any order, with or
    without fused multiply-adds."""
    dt = acc.dt if acc is not None else a.dt
    ins, out = spec.split("->")
    sa, sb = ins.split(",")
    k = 1
    for ch in set(sa) | set(sb):
        if ch not in out:
            k *= (a.v.shape[sa.index(ch)] if ch in sa else b.v.shape[sb.index(ch)])
    ea = np.broadcast_to(a.e, a.v.shape)
    eb = np.broadcast_to(b.e, b.v.shape)
    with np.errstate(invalid="ignore", over="ignore"):
        v = np.einsum(spec, a.v, b.v)
        absum = np.einsum(spec, np.abs(a.v), np.abs(b.v))
        p = (np.einsum(spec, np.abs(a.v), eb) + np.einsum(spec, ea, np.abs(b.v))
             + np.einsum(spec, ea, eb))
        n = k
        if acc is not None:
            v = v + acc.v
            absum = absum + np.abs(acc.v)
            p = p + acc.e
            n = k + 1
        g = gamma(2 * n, dt)  # faithful rounding per operation (V-22): two nearest ones
        e = p + g * (absum + p) + k * eta(dt) + (n + 1) * 2.0 ** -53 * absum
        return Approx(_arr(v), np.where(np.isfinite(v), e, 0.0), dt)._fin(v, e)


# ---------------------------------------------------------------------------- judging
@dataclass
class Check:
    """The verdict of a workload output against its FP64 formula."""

    ok: bool
    name: str = ""
    index: tuple[int, ...] | None = None
    reason: str = ""
    max_ratio: float = 0.0  # max |got - v| / e over the finite, bounded elements

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        return "within the FP64 bound" if self.ok else self.reason


def within(name: str, got: np.ndarray, ref: Approx) -> Check:
    """``got`` (the kernel's output, any float dtype) against ``ref``: NaN where
    ``v`` is NaN, equal where ``v`` is infinite, ``|got - v| <= e`` elsewhere. A
    bound that is infinite at a finite ``v`` is reported as vacuous."""
    g = np.asarray(got).astype(F64)
    v = np.broadcast_to(ref.v, g.shape)
    e = np.broadcast_to(ref.e, g.shape)
    gn, vn = np.isnan(g), np.isnan(v)
    with np.errstate(invalid="ignore"):
        diff = np.abs(g - v)
        fin = np.isfinite(v)
        ok = np.where(vn, gn, np.where(fin, ~gn & (diff <= e), g == v))
        vac = fin & ~np.isfinite(e)
        ratio = np.where(fin & (e > 0), diff / np.where(e > 0, e, 1.0), 0.0)
    mr = float(np.nanmax(ratio)) if ratio.size else 0.0
    if np.any(vac):
        k = tuple(int(i) for i in np.argwhere(vac)[0])
        return Check(False, name, k, f"{name}{list(k)}: the FP64 bound is vacuous (inf)", mr)
    if np.all(ok):
        return Check(True, name, None, "", mr)
    k = tuple(int(i) for i in np.argwhere(~ok)[0])
    return Check(False, name, k,
                 f"{name}{list(k)} = {float(g[k])!r}, FP64 formula {float(v[k])!r}, "
                 f"|diff| = {float(diff[k])!r} > bound {float(e[k])!r}", mr)


def same_bits(name: str, got: np.ndarray, want: np.ndarray) -> Check:
    """Bitwise agreement (any NaN matches any NaN; ``-0.0`` differs from ``+0.0``)."""
    g, w = np.asarray(got), np.asarray(want)
    if g.shape != w.shape or g.dtype != w.dtype:
        return Check(False, name, None,
                     f"{name}: {g.dtype}{g.shape} vs expected {w.dtype}{w.shape}")
    if is_float_storage(g.dtype):
        gf, wf = g.astype(F64), w.astype(F64)
        bits = np.dtype(f"u{g.dtype.itemsize}")
        ok = (np.isnan(gf) & np.isnan(wf)) | (g.view(bits) == w.view(bits))
    else:
        ok = g == w
    if np.all(ok):
        return Check(True, name)
    k = tuple(int(i) for i in np.argwhere(~ok)[0])
    return Check(False, name, k, f"{name}{list(k)} = {g[k]!r}, expected exactly {w[k]!r}")
