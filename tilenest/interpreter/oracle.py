"""The oracle: the admitted outputs of a call (``tn.reference``).

For each tensor a program stores to, :class:`Admitted` describes the set of
results every admitted execution can produce (see ``shadow.py``):

* elements computed without freedom must match the reference **bitwise**
  (IEEE bits; any NaN matches a NaN; ``-0.0`` and ``+0.0`` differ);
* elements downstream of a floating-point tree reduction or a reassociating
  ``mma`` must lie in ``[lo, hi]`` -- the FP64 reference with a rigorous error
  envelope -- and be NaN only where the envelope is unbounded.

``admits(candidate)`` answers whether a candidate output (from another
implementation, a compiled kernel, a different schedule) is admitted, and if
not, names the first offending element and why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..semantics.dtypes import DType


@dataclass
class Verdict:
    ok: bool
    index: tuple[int, ...] | None = None
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        return "admitted" if self.ok else f"not admitted: {self.reason}"


@dataclass
class Admitted:
    """The admitted values of one output tensor."""

    name: str
    dtype: DType
    value: np.ndarray  # the reference result (canonical evaluation, declared dtype)
    lo: np.ndarray | None = None  # float64 bounds; None: every element is bitwise
    hi: np.ndarray | None = None
    determined: bool = True  # False when control flow depended on an inexact value

    @property
    def exact_mask(self) -> np.ndarray:
        """Elements whose contract is bitwise."""
        if self.lo is None:
            return np.ones(self.value.shape, dtype=bool)
        ref = self.value.astype(np.float64)
        same = (self.lo == self.hi) & ((self.lo == ref) | (np.isnan(ref) & np.isnan(self.lo)))
        return same | (np.isnan(ref) & ~np.isnan(self.lo) & (self.lo == self.hi))

    @property
    def envelope(self) -> np.ndarray:
        """Width of the admitted interval (0 where bitwise)."""
        if self.lo is None:
            return np.zeros(self.value.shape)
        with np.errstate(invalid="ignore"):
            return np.where(self.exact_mask, 0.0, self.hi - self.lo)

    def admits(self, candidate: Any) -> Verdict:
        c = np.asarray(candidate)
        if c.shape != self.value.shape:
            return Verdict(False, None, f"shape {c.shape} differs from {self.value.shape}")
        if c.dtype != self.value.dtype:
            return Verdict(False, None, f"dtype {c.dtype} differs from {self.value.dtype}")
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
            lo, hi = self.lo, self.hi
            cf = c.astype(np.float64)
            unbounded = np.isnan(lo) | np.isnan(hi)
            nan_bad = inexact & ~unbounded & np.isnan(cf)
            with np.errstate(invalid="ignore"):
                out = inexact & ~unbounded & ~np.isnan(cf) & ((cf < lo) | (cf > hi))
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
        else:
            reason = (f"{self.name}{list(k)} = {_show(got)} lies outside the admitted "
                      f"[{float(self.lo[k])!r}, {float(self.hi[k])!r}] (reference {_show(ref)})")
        return Verdict(False, k, reason)


def _isnan(a: np.ndarray) -> np.ndarray:
    return np.isnan(a.astype(np.float64))


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def _show(v: Any) -> str:
    v = np.asarray(v)
    if v.dtype.kind == "f" or v.dtype.name == "bfloat16":
        f = float(v)
        return f"{f!r} (bits 0x{int(_bits(v.reshape(1))[0]):0{v.dtype.itemsize * 2}x})"
    return repr(v.item())
