"""Fast evaluation of f32 transcendentals, bit for bit the values
``numerics.unary`` defines.

``numerics.unary`` gives ``exp``, ``exp2``, ``log``, ``log2`` and ``sigmoid``
on f32 as the float64 function value rounded once to f32, the float64 value
computed in extended precision (long double) so that it does not depend on
numpy's vector loops -- exact, but about ten times slower than numpy's float64
functions. Those are within a few float64 ulps of the true value, as is the
reference float64 value. Rounding to f32 drops the low 29 bits of the float64
significand, and two float64 values round to the same f32 unless an f32
rounding boundary (a midpoint between neighbouring f32 values) lies between
them. So where numpy's float64 value ``y`` lies in the f32 normal range more
than :data:`MARGIN` float64 ulps away from every midpoint -- its low 29 bits
differ from ``2^28`` by more than ``MARGIN`` -- its f32 rounding is the
reference value. Every other element (near a midpoint, outside the normal
range, infinite, NaN: about one in 2^18 of random inputs) is computed by
``numerics.unary`` itself.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..semantics import numerics as N
from ..semantics.dtypes import DType

#: float64 ulps a numpy float64 function value may be from the reference one
#: (both are within a few ulps of the true value; this leaves a wide margin)
MARGIN = 1 << 10


def _sigmoid(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``1 / (1 + exp(-x))`` in float64, written to ``out`` when given."""
    out = np.negative(x, out=out)
    np.exp(out, out=out)
    np.add(out, 1.0, out=out)
    return np.divide(1.0, out, out=out)


#: numpy float64 functions close to the reference float64 function of each op
FAST64: dict[str, Callable[..., np.ndarray]] = {
    "exp": np.exp, "exp2": np.exp2, "log": np.log, "log2": np.log2, "sigmoid": _sigmoid,
}

_LOW29 = np.uint64((1 << 29) - 1)
#: the low 29 significand bits ``low29`` of a float64 are within MARGIN of
#: 2^28 iff ``(bits - _NEAR_LO) mod 2^29 <= 2 MARGIN`` (the subtraction's
#: borrow leaves the low 29 bits alone)
_NEAR_LO = np.uint64((1 << 28) - MARGIN)
_NEAR_SPAN = np.uint64(2 * MARGIN)
_F32_TINY = np.float32(2.0 ** -126)
_F32_MAX = np.finfo(np.float32).max

#: elements evaluated at a time (the float64 temporaries stay in cache)
_CHUNK = 1 << 16


def unary(op: str, x: np.ndarray, dt: DType, out: np.ndarray | None = None) -> np.ndarray:
    """``numerics.unary(op, x, dt)``, faster for the f32 functions of :data:`FAST64`;
    ``out``: an f32 array of ``x``'s shape, C-contiguous, whose contents the
    caller gives up (it may be ``x`` itself), which then holds the result. The
    result is returned either way.

    Per chunk: ``y`` = numpy's float64 value, ``r`` = ``y`` rounded to f32. An
    element is taken from ``numerics.unary`` instead when ``y`` lies within
    MARGIN float64 ulps of an f32 rounding midpoint (its low 29 significand
    bits), or when ``|r|`` is not in ``(2^-126, max f32]`` -- then ``y`` may lie
    outside the f32 normal range ``[2^-126, 2^128)`` or be NaN; inside that
    range the test is only stricter (``|y| < 2^-126`` rounds to at most
    ``2^-126``, ``|y| >= 2^128`` to infinity). Both tests are first made on
    the chunk's extremes (the least distance to a midpoint; the least and
    greatest result, or magnitude where some result is not positive), and
    per element only in a chunk that fails one of them. The chunk's buffers
    are made once per call."""
    if dt.name != "f32" or op not in FAST64 or np.size(x) < 64:
        return N.unary(op, x, dt)
    x = np.asarray(x, dtype=np.float32)
    flat = np.ascontiguousarray(x).reshape(-1)
    # operands the result overwrites are copied chunk by chunk before it does
    keep = out is not None and np.may_share_memory(out, flat)
    if out is None:
        out = np.empty(x.shape, dtype=np.float32)
    res = out.reshape(-1)
    fn = FAST64[op]
    n0 = min(_CHUNK, flat.size)
    y0 = np.empty(n0, dtype=np.float64)
    a0 = np.empty(n0, dtype=np.float32)
    x0 = np.empty(n0 if keep else 0, dtype=np.float32)
    with np.errstate(all="ignore"):
        for i in range(0, flat.size, _CHUNK):
            n = min(_CHUNK, flat.size - i)
            part = flat[i:i + n]
            if keep:
                part = x0[:n]
                np.copyto(part, flat[i:i + n])
            y = y0[:n]
            w = y.view(np.uint64)  # y's bits, then (once r is made) distances
            r = res[i:i + n]
            np.copyto(y, part)
            fn(y, out=y)
            np.copyto(r, y, casting="same_kind")
            np.subtract(w, _NEAR_LO, out=w)
            np.bitwise_and(w, _LOW29, out=w)
            near = w.min() <= _NEAR_SPAN
            lo, hi = r.min(), r.max()  # NaN propagates: then every test below fails
            if not lo > 0:  # a result <= 0 (log, log2) or NaN: test magnitudes
                a = np.abs(r, out=a0[:n])
                lo, hi = a.min(), a.max()
            if near or not (lo > _F32_TINY and hi <= _F32_MAX):
                a = np.abs(r, out=a0[:n])
                bad = (w <= _NEAR_SPAN) | ~((a > _F32_TINY) & (a <= _F32_MAX))
                r[bad] = N.unary(op, part[bad], dt)
    return out
