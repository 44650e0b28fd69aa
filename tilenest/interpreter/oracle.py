"""The oracle: the admitted outputs of a call (``tn.reference``).

For each tensor a program stores to, :class:`Admitted` describes the set of
results every admitted execution can produce (see ``shadow.py``):

* elements computed without freedom must match the reference **bitwise**
  (IEEE bits; any NaN matches a NaN; ``-0.0`` and ``+0.0`` differ);
* elements downstream of a floating-point tree reduction, a reassociating
  ``mma`` or an ulp-bounded function must lie in ``[lo, hi]`` -- the FP64
  reference with a rigorous error envelope -- or be NaN where ``nan`` admits
  NaN. An element whose only admitted value is NaN (empty range, ``nan``) must
  be a NaN (any NaN, as for a bitwise element); an unbounded element is the
  range ``[-inf, +inf]`` with ``nan``.

``admits(candidate)`` answers whether a candidate output (from another
implementation, a compiled kernel, a different schedule) is admitted, and if
not, names the first offending element and why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..semantics.arrays import is_float_storage
from ..semantics.dtypes import DType


@dataclass
class Verdict:
    """Whether a candidate is admitted; if not, the first offending element and
    why. ``undetermined``: the oracle could not judge at all (the admitted set
    depends on a branch taken on an inexact value), which is never a pass."""

    ok: bool
    index: tuple[int, ...] | None = None
    reason: str = ""
    undetermined: bool = False

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        return "admitted" if self.ok else f"not admitted: {self.reason}"


@dataclass
class Admitted:
    """The admitted values of one output tensor: element ``e`` admits the values
    ``x`` with ``lo[e] <= x <= hi[e]``, and NaN where ``nan[e]`` (shadow.py)."""

    name: str
    dtype: DType
    value: np.ndarray  # the reference result (canonical evaluation, declared dtype)
    lo: np.ndarray | None = None  # float64 bounds; None: every element is bitwise
    hi: np.ndarray | None = None
    determined: bool = True  # False when control flow depended on an inexact value
    nan: np.ndarray | None = None  # NaN admitted (besides the range)
    #: where control flow depended on an inexact value (when not ``determined``)
    undetermined_at: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.lo is None:
            return
        from .shadow import settle

        # bounds given without ``nan`` admit no NaN; a NaN bound: every value
        nan = np.zeros(np.shape(self.lo), dtype=bool) if self.nan is None else self.nan
        self.lo, self.hi, self.nan = settle(self.lo, self.hi, nan)

    @property
    def exact_mask(self) -> np.ndarray:
        """Elements whose contract is bitwise: one admitted value, the reference
        (a NaN reference: NaN alone, any NaN)."""
        if self.lo is None:
            return np.ones(self.value.shape, dtype=bool)
        ref = _f64(self.value)
        point = ((self.lo == self.hi) & (np.signbit(self.lo) == np.signbit(self.hi)) & ~self.nan
                 & (self.lo == ref))
        return point | ((self.lo > self.hi) & self.nan & np.isnan(ref))

    @property
    def unbounded_mask(self) -> np.ndarray:
        """Elements that admit every value."""
        if self.lo is None:
            return np.zeros(self.value.shape, dtype=bool)
        return (self.lo == -np.inf) & (self.hi == np.inf) & self.nan

    @property
    def envelope(self) -> np.ndarray:
        """Width of the admitted range (0 where bitwise)."""
        if self.lo is None:
            return np.zeros(self.value.shape)
        with np.errstate(invalid="ignore"):
            return np.where(self.exact_mask, 0.0, np.maximum(self.hi - self.lo, 0.0))

    def admits(self, candidate: Any) -> Verdict:
        """Whether ``candidate`` is an admitted result. Never ok when the set is
        not ``determined``: a branch or loop condition was computed from an
        inexact value, so admitted executions may have taken other paths whose
        results this run did not compute."""
        if not self.determined:
            at = f" at {', '.join(self.undetermined_at)}" if self.undetermined_at else ""
            return Verdict(False, None, f"{self.name}: the oracle cannot judge this call: control "
                           f"flow{at} depends on an inexact value (a tree reduction, a "
                           "reassociating mma or a transcendental)", undetermined=True)
        c = np.asarray(candidate)
        if c.shape != self.value.shape:
            return Verdict(False, None, f"{self.name}: shape {c.shape} differs from "
                                        f"{self.value.shape}")
        if c.dtype != self.value.dtype:
            return Verdict(False, None, f"{self.name}: dtype {c.dtype} differs from "
                                        f"{self.value.dtype}")
        exact = self.exact_mask
        bad = np.zeros(c.shape, dtype=bool)
        why = np.zeros(c.shape, dtype=np.int8)  # 1 bits, 2 nan, 3 range
        if np.any(exact):
            cv, rv = c[exact], self.value[exact]
            if self.dtype.is_float:
                cn, rn = _isnan(cv), _isnan(rv)
                diff = (cn != rn) | (~rn & (_bits(cv) != _bits(rv)))
            else:
                diff = cv != rv
            idx = np.zeros(c.shape, dtype=bool)
            idx[exact] = diff
            bad |= idx
            why[idx] = 1
        inexact = ~exact
        if np.any(inexact):
            lo, hi, nan = self.lo, self.hi, self.nan
            cf = _f64(c)
            cn = np.isnan(cf)
            nan_bad = inexact & cn & ~nan
            with np.errstate(invalid="ignore"):
                out = inexact & ~cn & ((cf < lo) | (cf > hi))
            bad |= nan_bad | out
            why[nan_bad] = 2
            why[out] = 3
        if not np.any(bad):
            return Verdict(True)
        k = tuple(int(i) for i in np.argwhere(bad)[0])
        got, ref = c[k], self.value[k]
        w = why[k]
        if w == 1:
            reason = (f"{self.name}{list(k)} = {_show(got)} but the contract is bitwise: "
                      f"expected {_show(ref)}")
        elif w == 2:
            reason = (f"{self.name}{list(k)} is NaN; admitted values are in "
                      f"[{float(self.lo[k])!r}, {float(self.hi[k])!r}] (reference {_show(ref)})")
        elif self.lo[k] > self.hi[k]:
            reason = (f"{self.name}{list(k)} = {_show(got)} but the only admitted value is "
                      f"NaN (reference {_show(ref)})")
        else:
            also = " or NaN" if self.nan[k] else ""
            reason = (f"{self.name}{list(k)} = {_show(got)} lies outside the admitted "
                      f"[{float(self.lo[k])!r}, {float(self.hi[k])!r}]{also} "
                      f"(reference {_show(ref)})")
        return Verdict(False, k, reason)


def _f64(a: np.ndarray) -> np.ndarray:
    """Values widened exactly to float64 (16-bit floats through f32)."""
    a = np.asarray(a)
    return (a.astype(np.float32) if a.dtype.itemsize == 2 and a.dtype.kind not in "iub"
            else a).astype(np.float64)


def _isnan(a: np.ndarray) -> np.ndarray:
    return np.isnan(a.astype(np.float64))


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def _show(v: Any) -> str:
    v = np.asarray(v)
    if is_float_storage(v.dtype):
        f = float(v)
        return f"{f!r} (bits 0x{int(_bits(v.reshape(1))[0]):0{v.dtype.itemsize * 2}x})"
    return repr(v.item())
