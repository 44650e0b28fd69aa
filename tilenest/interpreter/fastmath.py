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


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


#: numpy float64 functions close to the reference float64 function of each op
FAST64: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "exp": np.exp, "exp2": np.exp2, "log": np.log, "log2": np.log2, "sigmoid": _sigmoid,
}

_LOW = np.uint64((1 << 29) - 1)
_HALF = np.int64(1 << 28)
_EXP_MASK = np.uint64(0x7FF)
#: float64 biased exponents of the f32 normal range [2^-126, 2^128)
_EMIN, _EMAX = 1023 - 126, 1023 + 127

#: elements evaluated at a time (float64 temporaries stay in cache)
_CHUNK = 1 << 15


def unary(op: str, x: np.ndarray, dt: DType) -> np.ndarray:
    """``numerics.unary(op, x, dt)``, faster for the f32 functions of :data:`FAST64`."""
    if dt.name != "f32" or op not in FAST64 or np.size(x) < 64:
        return N.unary(op, x, dt)
    x = np.asarray(x, dtype=np.float32)
    shape = x.shape
    flat = np.ascontiguousarray(x).reshape(-1)
    out = np.empty(flat.shape, dtype=np.float32)
    fn = FAST64[op]
    with np.errstate(all="ignore"):
        for i in range(0, flat.size, _CHUNK):
            part = flat[i:i + _CHUNK]
            y = fn(part.astype(np.float64))
            r = y.astype(np.float32)
            bits = y.view(np.uint64)
            e = (bits >> np.uint64(52)) & _EXP_MASK
            near = np.abs((bits & _LOW).astype(np.int64) - _HALF) <= MARGIN
            bad = near | (e < _EMIN) | (e > _EMAX)
            if bad.any():
                r[bad] = N.unary(op, part[bad], dt)
            out[i:i + _CHUNK] = r
    return out.reshape(shape)
