"""Exact scalar semantics of every elementwise op, vectorized over numpy arrays.

This module is the numerical reference the whole project validates against
(DESIGN.md, "Numerical contract"). Every function takes numpy arrays that hold
the storage type ``dt.np`` of a :class:`~tilenest.semantics.dtypes.DType`
(broadcastable against each other) and returns numpy arrays of ``dt.np``, or of
``np.bool_`` for predicates and comparisons.

General rules, stated once:

* Floating point is IEEE 754 binary arithmetic in the declared dtype with
  round-to-nearest-even; subnormals are kept (no flush to zero), there is no
  contraction into FMA and no excess precision. f16 and bf16 results of
  ``+ - * /`` and ``sqrt`` are the exact result rounded once to the dtype (they
  are computed in f32 and rounded, which is exact because f32 carries at least
  2p+2 bits for both formats); they are bit-identical to numpy/ml_dtypes.
* Transcendental functions are the float64 value rounded once to the dtype; their
  accuracy contract is :data:`TRANSCENDENTAL_ULP`, not bit equality.
* A NaN result is a quiet NaN. Its sign and payload are not part of the contract
  (validation compares NaNs as a class), except where an op says otherwise.
* Integers are two's complement and wrap around modulo 2**bits; no numpy
  overflow warning ever escapes. Integer division or remainder by zero and
  negative shift counts raise :class:`IntegerArithmeticError`.
* Floating-point exceptions (overflow, invalid, divide-by-zero) never raise: they
  yield the IEEE default results (inf, NaN, signed zero).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import RuntimeSemanticError
from .dtypes import DType
from .dtypes import FP8_OPS
from .dtypes import f32 as _f32

__all__ = ["IntegerArithmeticError", "TRANSCENDENTAL_ULP", "ulp_bound", "unrounded", "unary",
           "binary", "select", "cast", "bitcast", "constant"]


class IntegerArithmeticError(RuntimeSemanticError):
    """An integer operation without a value: division or remainder by zero, or a
    shift by a negative count."""

    kind = "arithmetic error"


_TRANSCENDENTAL = ("exp", "exp2", "log", "log2", "log1p", "expm1", "sin", "cos", "tanh", "erf",
                   "sigmoid", "rsqrt", "pow", "atan2")

#: Accuracy bound, in units in the last place of the result dtype, of each
#: transcendental function per float dtype, relative to the exact mathematical
#: value: ``TRANSCENDENTAL_ULP[fn][dtype name]``. f16/bf16/f32 results are the
#: float64 value rounded once, so they are off by at most 0.5 ulp plus a
#: negligible float64 error; 1.0 covers that (a result may differ from the
#: correctly rounded one only when the exact value lies within a float64 error
#: of a rounding midpoint). f64 results are evaluated in the platform's
#: extended precision where it has one (numpy ``longdouble``: the C library's
#: ``expl``, ``powl``, ``atan2l``...) and rounded once, so they are correctly
#: rounded but for rare double roundings, whatever SIMD loops numpy uses for
#: float64 on this machine and version (those are up to 1 ulp off, and differ
#: between numpy releases and instruction sets); ``erf`` comes from the C
#: library through ``math.erf``. 4 ulp is the bound C libraries document
#: (measured here against 200-bit references: <= 1 ulp). ``rsqrt`` in f64 is two correctly
#: rounded operations (<= 2 ulp, bounded by 3) and ``sigmoid`` is exp followed by
#: two correctly rounded operations (bounded by 8). The bound is the contract
#: for every implementation: the oracle admits any result within it, so a
#: compiled kernel may evaluate differently (the LLVM backend's narrow
#: functions are faithful, i.e. below 1 ulp; spec/lowering.md lists each).
TRANSCENDENTAL_ULP: dict[str, dict[str, float]] = {
    fn: {"f16": 1.0, "bf16": 1.0, "f32": 1.0,
         "f64": {"sigmoid": 8.0, "rsqrt": 3.0}.get(fn, 4.0)}
    for fn in _TRANSCENDENTAL
}


#: the unary functions whose application may declare its own, looser bound
#: (the op's optional ``ulp`` attribute, ``tn.exp(x, ulp=4)``)
DECLARABLE_ULP = ("exp", "exp2", "log", "log2", "log1p", "expm1", "sin", "cos", "tanh", "erf",
                  "sigmoid", "rsqrt")


def ulp_bound(op: str, dt: DType, declared: float | None = None) -> float:
    """The accuracy bound (ulp of ``dt``) of ``op``; 0.0 means bit-exact.
    ``declared`` is the bound the program states for this application (the
    op's ``ulp`` attribute, checked by :func:`check_declared_ulp`): it
    replaces the function's own (:data:`TRANSCENDENTAL_ULP`).

    A bound ``k > 0`` admits, for operands ``x``, every value ``t`` of ``dt`` with
    ``|t - y| <= k * ulp_dt(y)``, where ``y = unrounded(op, dt, x)`` is the
    interpreter's float64 evaluation before its final rounding and ``ulp_dt(y)``
    is the spacing of ``dt`` in the binade of ``|y|`` (the subnormal spacing
    below the least normal). Results that are NaN, infinite or zero are exact
    (spec V-14). The bound is the same mechanism for every op and dtype: unary
    and binary functions alike, f64 included."""
    if declared is not None:
        return float(declared)
    return TRANSCENDENTAL_ULP.get(op, {}).get(dt.name, 0.0)


def check_declared_ulp(op: str, dt: DType, declared: Any) -> str | None:
    """Why ``declared`` cannot be the bound of ``op`` on ``dt`` (None when it
    can): a program may loosen a function's contract (spec V-14, *Declared
    bounds*), to a finite number of ulp at least the function's own bound,
    and only for the functions of :data:`DECLARABLE_ULP`."""
    if op not in DECLARABLE_ULP:
        return f"'{op}' takes no ulp bound (only {', '.join(DECLARABLE_ULP)} do)"
    if isinstance(declared, bool) or not isinstance(declared, (int, float)) \
            or not np.isfinite(declared):
        return f"ulp={declared!r} is not a finite number"
    own = TRANSCENDENTAL_ULP[op].get(dt.name, 0.0)
    if declared < own:
        return (f"ulp={declared!r} is tighter than {op}'s own bound on {dt} ({own:g} ulp): a "
                "declared bound may only admit more results")
    return None


def unrounded(op: str, dt: DType, *xs: np.ndarray) -> np.ndarray:
    """The float64 value of the transcendental ``op`` on the values ``xs`` of the
    float dtype ``dt``, before the final rounding to ``dt``: ``unary``/``binary``
    return exactly ``_from_f64(unrounded(...), dt)``. For f64 it is the value."""
    if op not in _F64_FUNCTION:
        raise ValueError(f"'{op}' is not a transcendental function")
    with np.errstate(all="ignore"):
        return np.asarray(_F64_FUNCTION[op](*(_to_f64(_arr(x, dt.np), dt) for x in xs)),
                          dtype=_F64)


# ---------------------------------------------------------------------------
# Representation helpers

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_UINT: dict[int, np.dtype[Any]] = {8: np.dtype(np.uint8), 16: np.dtype(np.uint16),
                                   32: np.dtype(np.uint32), 64: np.dtype(np.uint64)}
#: The quiet bit (most significant mantissa bit) of each float format.
_QUIET = {"f16": 0x0200, "bf16": 0x0040, "f32": 0x0040_0000, "f64": 0x0008_0000_0000_0000}
_SIGN = {"f16": 0x8000, "bf16": 0x8000, "f32": 0x8000_0000, "f64": 0x8000_0000_0000_0000}


def _arr(x: object, dt: npt.DTypeLike) -> np.ndarray:
    return np.asarray(x, dtype=dt)


def _bits(x: np.ndarray) -> np.ndarray:
    """The raw bits of ``x`` as an unsigned integer array of the same width."""
    x = np.asarray(x)
    return x.view(_UINT[x.dtype.itemsize * 8])


def _wide(x: np.ndarray, dt: DType) -> np.ndarray:
    """f16/bf16/FP8 values widened exactly to f32; other dtypes unchanged."""
    return x.astype(_F32) if dt.is_float and dt.bits < 32 else x


def _to_f64(x: np.ndarray, dt: DType) -> np.ndarray:
    """Float values widened exactly to f64."""
    return np.asarray(_wide(x, dt)).astype(_F64)


def _from_f32(y: np.ndarray, dt: DType) -> np.ndarray:
    """f32 values rounded once (nearest-even) to ``dt`` (f16, bf16 or f32)."""
    return np.asarray(y).astype(dt.np)


def _from_f64(x: np.ndarray, dt: DType) -> np.ndarray:
    """f64 values rounded once (nearest-even) to the float dtype ``dt``.

    f64 -> f32 is a direct hardware rounding. For f16 and bf16 a plain
    f64 -> f32 -> dtype chain would round twice, so the first step rounds to odd
    instead: an inexact f32 result is replaced by the neighbour whose last bit is
    1. Rounding to odd at 24 bits then to nearest at p <= 22 bits equals one
    rounding to nearest at p bits (the odd value keeps x's side of every midpoint).
    """
    x = np.asarray(x, dtype=_F64)
    if dt.name == "f64":
        return x
    y = np.asarray(x.astype(_F32))
    if dt.name == "f32":
        return y
    bits = _bits(y)
    inexact = np.isfinite(y) & (y.astype(_F64) != x)
    toward_zero = np.where(np.abs(y.astype(_F64)) > np.abs(x), bits - np.uint32(1), bits)
    odd = np.where(inexact, toward_zero | np.uint32(1), bits)
    return _from_f32(np.asarray(odd, dtype=np.uint32).view(_F32), dt)


def _quiet(x: np.ndarray, dt: DType) -> np.ndarray:
    """``x`` with the quiet bit set (callers use it on NaN elements only)."""
    q = _bits(x) | _UINT[dt.bits].type(_QUIET[dt.name])
    return np.asarray(q).view(dt.np)


def _via_f32(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    """An IEEE operation evaluated by numpy in the dtype itself for f32/f64 (into
    ``out`` when given, as :func:`binary` says), and for f16/bf16 on the operands
    widened to f32 with the result rounded once."""
    def run(dt: DType, *xs: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        if dt.bits == 16:
            return _from_f32(fn(*(x.astype(_F32) for x in xs)), dt)
        return np.asarray(fn(*xs) if out is None else fn(*xs, out=out))
    return run


def _via_f64(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    """A function evaluated on the float64 values of its operands with numpy's
    float64 implementation, the result rounded once to the dtype (a fresh
    array: ``out`` is not used)."""
    def run(dt: DType, *xs: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        shape = np.broadcast_shapes(*(np.shape(x) for x in xs))
        n = int(np.prod(shape))
        if n <= _CHUNK or len(xs) != 1:
            return _from_f64(fn(*(_to_f64(x, dt) for x in xs)), dt)
        # element-wise and exact either way; chunks keep the f64 temporaries in cache
        x = np.ascontiguousarray(xs[0]).reshape(-1)
        out = np.empty(n, dtype=dt.np)
        for i in range(0, n, _CHUNK):
            out[i:i + _CHUNK] = _from_f64(fn(_to_f64(x[i:i + _CHUNK], dt)), dt)
        return out.reshape(shape)
    return run


_CHUNK = 1 << 15


_erf64 = np.frompyfunc(math.erf, 1, 1)


def _erf(x: np.ndarray) -> np.ndarray:
    return np.asarray(_erf64(x), dtype=_F64)


# ---------------------------------------------------------------------------
# Unary ops

def _float_neg(x: np.ndarray, dt: DType) -> np.ndarray:
    sign = _bits(x).dtype.type(_SIGN[dt.name])
    return np.asarray(_bits(x) ^ sign).view(dt.np)


def _float_abs(x: np.ndarray, dt: DType) -> np.ndarray:
    mask = _bits(x).dtype.type(~_SIGN[dt.name] & ((1 << dt.bits) - 1))
    return np.asarray(_bits(x) & mask).view(dt.np)


def _int_neg(x: np.ndarray, dt: DType) -> np.ndarray:
    u = _bits(x)
    return np.asarray(u.dtype.type(0) - u).view(dt.np)


def _int_abs(x: np.ndarray, dt: DType) -> np.ndarray:
    return np.where(x < 0, _int_neg(x, dt), x) if dt.is_signed else x


#: whether numpy's ``longdouble`` is wider than float64 (x87 extended on x86-64
#: Linux, binary128 on aarch64 Linux); where it is not, float64 is evaluated as is
_EXTENDED = np.finfo(np.longdouble).nmant > np.finfo(np.float64).nmant


def _extended(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    """``fn`` (a numpy ufunc) on float64 operands evaluated in extended
    precision and rounded once to float64: the correctly rounded value but
    for rare double roundings, independent of numpy's float64 loops (which are
    up to 1 ulp off and vary with the numpy release and the CPU's vector
    instructions). C99 special cases (infinities, NaN, signed zeros, pow(x, 0)
    = 1) are the extended functions', the same as float64's."""
    if not _EXTENDED:
        return fn

    def f(*xs: np.ndarray) -> np.ndarray:
        return np.asarray(fn(*(np.asarray(x, dtype=np.longdouble) for x in xs)),
                          dtype=_F64)

    return f


_exp = _extended(np.exp)

#: The float64 evaluation of each transcendental (operands and result float64);
#: the op's value in a dtype is this value rounded once (``_via_f64``).
_F64_FUNCTION: dict[str, Callable[..., np.ndarray]] = {
    "exp": _exp, "exp2": _extended(np.exp2), "log": _extended(np.log),
    "log2": _extended(np.log2), "log1p": _extended(np.log1p), "expm1": _extended(np.expm1),
    "sin": _extended(np.sin), "cos": _extended(np.cos), "tanh": _extended(np.tanh),
    "erf": _erf, "sigmoid": lambda x: 1.0 / (1.0 + _exp(-x)),
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "pow": _extended(np.power), "atan2": _extended(np.arctan2),
}
assert set(_F64_FUNCTION) == set(_TRANSCENDENTAL)

_FLOAT_UNARY: dict[str, Callable[[DType, np.ndarray], np.ndarray]] = {
    **{fn: _via_f64(_F64_FUNCTION[fn]) for fn in _TRANSCENDENTAL if fn not in ("pow", "atan2")},
    "sqrt": _via_f32(np.sqrt), "floor": _via_f32(np.floor), "ceil": _via_f32(np.ceil),
    "trunc": _via_f32(np.trunc), "round": _via_f32(np.rint),
    "isnan": lambda dt, x: np.isnan(_wide(x, dt)),
    "isinf": lambda dt, x: np.isinf(_wide(x, dt)),
    "isfinite": lambda dt, x: np.isfinite(_wide(x, dt)),
    "signbit": lambda dt, x: (_bits(x) & _bits(x).dtype.type(_SIGN[dt.name])) != 0,
    "neg": lambda dt, x: _float_neg(x, dt), "abs": lambda dt, x: _float_abs(x, dt),
}
_INT_UNARY: dict[str, Callable[[DType, np.ndarray], np.ndarray]] = {
    "neg": lambda dt, x: _int_neg(x, dt), "abs": lambda dt, x: _int_abs(x, dt),
    "bitnot": lambda dt, x: np.invert(x),
}
_BOOL_UNARY: dict[str, Callable[[DType, np.ndarray], np.ndarray]] = {
    "not": lambda dt, x: np.logical_not(x),
}


def _not_defined(op: str, dt: DType) -> ValueError:
    return ValueError(f"elementwise op '{op}' is not defined on {dt}")


@np.errstate(all="ignore")
def unary(op: str, x: np.ndarray, dt: DType) -> np.ndarray:
    """The unary elementwise op ``op`` applied to ``x`` (values of ``dt``).

    Floats: ``sqrt`` is correctly rounded. ``exp exp2 log log2 log1p expm1 sin cos
    tanh erf`` are the float64 function value rounded once to the dtype (f64: the
    float64 function itself); ``sigmoid(x)`` is 1/(1+exp(-x)) and ``rsqrt(x)`` is
    1/sqrt(x), both evaluated in float64 and rounded once. ``floor ceil trunc`` are
    exact; ``round`` rounds half to even. All keep the sign of a zero result
    (``ceil(-0.5) = -0.0``). ``neg`` flips and ``abs`` clears the sign bit (so
    ``abs(-0.0) = +0.0``, and both act on NaN's sign). ``isnan isinf isfinite
    signbit`` return bool; ``signbit`` reads the sign bit (true for -0.0 and for
    NaNs with the sign bit set).
    Integers: ``neg`` is 0 - x modulo 2**bits (also on unsigned dtypes); ``abs`` of
    the most negative value wraps to itself; ``bitnot`` complements every bit.
    bool: ``not`` is logical negation.
    """
    x = _arr(x, dt.np)
    if dt.is_fp8:  # classification only, on the exact f32 value
        if op not in FP8_OPS:
            raise _not_defined(op, dt)
        return unary(op, x.astype(_F32), _f32)
    table = _FLOAT_UNARY if dt.is_float else _INT_UNARY if dt.is_int else _BOOL_UNARY
    if op not in table:
        raise _not_defined(op, dt)
    return np.asarray(table[op](dt, x))


# ---------------------------------------------------------------------------
# Binary ops

def _float_extreme(a: np.ndarray, b: np.ndarray, dt: DType, is_max: bool) -> np.ndarray:
    wa, wb = _wide(a, dt), _wide(b, dt)
    pick_a = (wa > wb) if is_max else (wa < wb)
    # Equal operands differ at most in the sign of a zero: max takes +0, min -0.
    pick_a = pick_a | ((wa == wb) & (np.signbit(wa) != is_max))
    r = np.where(pick_a, a, b)
    return np.where(np.isnan(wa), _quiet(a, dt), np.where(np.isnan(wb), _quiet(b, dt), r))


def _float_binary(op: str, a: np.ndarray, b: np.ndarray, dt: DType,
                  out: np.ndarray | None = None) -> np.ndarray:
    if op in ("maximum", "minimum"):
        return _float_extreme(a, b, dt, op == "maximum")
    return _FLOAT_BINARY[op](dt, a, b, out=out)


_FLOAT_BINARY: dict[str, Callable[..., np.ndarray]] = {
    "add": _via_f32(np.add), "sub": _via_f32(np.subtract), "mul": _via_f32(np.multiply),
    "div": _via_f32(np.divide), "rem": _via_f32(np.fmod), "floordiv": _via_f32(np.floor_divide),
    "mod": _via_f32(np.mod), "pow": _via_f64(_F64_FUNCTION["pow"]),
    "atan2": _via_f64(_F64_FUNCTION["atan2"]),
}


def _wrap(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Callable[..., np.ndarray]:
    """A ring operation computed on the unsigned bit patterns (mod 2**bits)."""
    def run(dt: DType, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.asarray(fn(_bits(a), _bits(b))).view(dt.np)
    return run


def _check_divisor(op: str, b: np.ndarray) -> None:
    if np.any(b == 0):
        raise IntegerArithmeticError(f"integer division by zero in '{op}'",
                                     hint="guard the divisor, e.g. ite(d == 0, 1, d)")


def _int_divide(op: str, a: np.ndarray, b: np.ndarray, dt: DType) -> np.ndarray:
    a, b = np.broadcast_arrays(a, b)
    _check_divisor(op, b)
    minus_one = (b == -1) if dt.is_signed else np.zeros(b.shape, bool)
    sb = np.where(minus_one, np.ones_like(b), b)  # x / -1 is computed as neg(x)
    if op in ("rem", "mod"):
        # x rem 1 = x mod 1 = 0, which is also x rem -1 = x mod -1.
        return np.asarray(np.fmod(a, sb) if op == "rem" else np.mod(a, sb))
    if op == "div":
        q = (a - np.fmod(a, sb)) // sb  # a - rem(a, b) is an exact multiple of b
    else:
        q = np.floor_divide(a, sb)
    return np.asarray(np.where(minus_one, _int_neg(a, dt), q))


def _shift(op: str, x: np.ndarray, s: np.ndarray, dt: DType) -> np.ndarray:
    x, s = np.broadcast_arrays(x, s)
    if dt.is_signed and np.any(s < 0):
        raise IntegerArithmeticError(f"negative shift count in '{op}'")
    big = s >= dt.bits
    count = np.where(big, np.zeros_like(s), s)
    if op == "shl":
        r = np.asarray(np.left_shift(_bits(x), _bits(count))).view(dt.np)
        return np.asarray(np.where(big, np.zeros_like(x), r))
    r = np.right_shift(x, count)  # arithmetic for signed, logical for unsigned dtypes
    fill = np.where(x < 0, -np.ones_like(x), 0) if dt.is_signed else np.zeros_like(x)
    return np.asarray(np.where(big, fill, r))


#: the integer divisions: a zero divisor is an error of the program (V-10),
#: and undefined in C, so compiled code evaluates them only where it does
INT_DIVISIONS = ("div", "rem", "floordiv", "mod")

_INT_BINARY: dict[str, Callable[..., np.ndarray]] = {
    "add": _wrap(np.add), "sub": _wrap(np.subtract), "mul": _wrap(np.multiply),
    "maximum": lambda dt, a, b: np.maximum(a, b), "minimum": lambda dt, a, b: np.minimum(a, b),
    "and": lambda dt, a, b: np.bitwise_and(a, b), "or": lambda dt, a, b: np.bitwise_or(a, b),
    "xor": lambda dt, a, b: np.bitwise_xor(a, b),
    **{op: (lambda dt, a, b, op=op: _int_divide(op, a, b, dt))
       for op in INT_DIVISIONS},
    **{op: (lambda dt, a, b, op=op: _shift(op, a, b, dt)) for op in ("shl", "shr")},
}
_BOOL_BINARY: dict[str, Callable[..., np.ndarray]] = {
    "and": lambda dt, a, b: np.logical_and(a, b), "or": lambda dt, a, b: np.logical_or(a, b),
    "xor": lambda dt, a, b: np.logical_xor(a, b),
    "maximum": lambda dt, a, b: np.logical_or(a, b),
    "minimum": lambda dt, a, b: np.logical_and(a, b),
}
_COMPARE: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
    "eq": np.equal, "ne": np.not_equal,
}


@np.errstate(all="ignore")
def binary(op: str, a: np.ndarray, b: np.ndarray, dt: DType,
           out: np.ndarray | None = None) -> np.ndarray:
    """The binary elementwise op ``op`` on ``a`` and ``b`` (both values of ``dt``).

    ``out``: an array of the result's shape and dtype whose contents the caller
    gives up (it may be ``a`` or ``b`` itself); the float ops numpy evaluates
    in f32 or f64 itself (all but ``pow``, ``atan2`` and the extremes) write
    their result into it. The result is returned either way.

    Floats: ``add sub mul div`` are IEEE operations correctly rounded to ``dt``.
    ``rem`` is C fmod (exact; sign of the dividend); ``floordiv`` is numpy's
    floor_divide (floor of the quotient) and ``mod`` numpy's mod (sign of the
    divisor), both evaluated in the dtype (f16/bf16: in f32, rounded once).
    ``pow`` and ``atan2`` are the float64 functions (IEEE/C99 special cases, e.g.
    pow(x, 0) = 1 even for NaN x) rounded once. ``maximum``/``minimum`` return a
    quiet NaN if either operand is NaN (the first NaN operand with its quiet bit
    set), and order zeros: maximum(-0, +0) = +0 and minimum(-0, +0) = -0 in
    either argument order.
    Integers: ``add sub mul`` wrap modulo 2**bits. ``div`` truncates toward zero
    and ``rem`` has the sign of the dividend (C); ``floordiv`` rounds toward -inf
    and ``mod`` has the sign of the divisor (Python). MIN / -1 wraps to MIN and
    MIN rem/mod -1 is 0. A zero divisor raises IntegerArithmeticError.
    ``and or xor`` are bitwise. ``shl`` shifts in zeros (bits shifted out are
    lost; counts >= the bit width give 0); ``shr`` is arithmetic on signed dtypes
    (counts >= width give 0 or -1 by sign) and logical on unsigned ones (>= width
    gives 0). The count has the value's dtype; a negative count raises.
    bool: ``and or xor`` are logical, ``maximum`` is or, ``minimum`` is and.
    Comparisons ``lt le gt ge eq ne`` return bool; on floats they are IEEE (any
    comparison with NaN is false except ``ne``; -0.0 == +0.0); on bool False < True.
    """
    a, b = _arr(a, dt.np), _arr(b, dt.np)
    if op in _COMPARE:
        return np.asarray(_COMPARE[op](_wide(a, dt), _wide(b, dt)))
    if dt.is_fp8:
        raise _not_defined(op, dt)
    if dt.is_float:
        if op not in _FLOAT_BINARY and op not in ("maximum", "minimum"):
            raise _not_defined(op, dt)
        return np.asarray(_float_binary(op, a, b, dt, out))
    table = _INT_BINARY if dt.is_int else _BOOL_BINARY
    if op not in table:
        raise _not_defined(op, dt)
    return np.asarray(table[op](dt, a, b))


def select(c: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``ite``: ``a`` where ``c`` is true, else ``b`` (values copied bit for bit,
    NaN payloads and zero signs included)."""
    c, a = np.asarray(c, dtype=np.bool_), np.asarray(a)
    return np.asarray(np.where(c, a, np.asarray(b, dtype=a.dtype)))


# ---------------------------------------------------------------------------
# Conversions

def _int64_to_f64(x: np.ndarray, src: DType, odd: bool) -> np.ndarray:
    """64-bit integers to f64 rounded to nearest even, or to odd with ``odd``.

    The magnitude m = hi * 2**32 + lo is summed from two exact halves, so the
    sum is rounded once; the Fast2Sum error term tells whether (and which way)
    it was inexact.
    """
    neg = (x < 0) if src.is_signed else np.zeros(x.shape, bool)
    u = _bits(x)
    m = np.where(neg, np.uint64(0) - u, u)
    big = (m >> np.uint64(32)).astype(_F64) * 2.0**32
    lo = (m & np.uint64(0xFFFF_FFFF)).astype(_F64)
    y = big + lo
    if odd:
        err = lo - (y - big)  # exact: m - y
        ybits = _bits(y)
        toward_zero = np.where(err < 0, ybits - np.uint64(1), ybits)
        y = np.where(err != 0, toward_zero | np.uint64(1), ybits).view(_F64)
    return np.where(neg, -y, y)


def _int_to_float(x: np.ndarray, src: DType, dst: DType) -> np.ndarray:
    if src.bits <= 32 or src.is_bool:
        return _from_f64(x.astype(_F64), dst)  # exact in f64, then one rounding
    if dst.name == "f64":
        return _int64_to_f64(x, src, odd=False)
    return _from_f64(_int64_to_f64(x, src, odd=True), dst)


def _float_to_int(x: np.ndarray, src: DType, dst: DType) -> np.ndarray:
    t = np.trunc(_to_f64(x, src))
    lo = -(2.0 ** (dst.bits - 1)) if dst.is_signed else 0.0
    hi = 2.0 ** (dst.bits - 1 if dst.is_signed else dst.bits)  # first value out of range
    info = np.iinfo(dst.np)
    inside = (t >= lo) & (t < hi)
    r = np.where(inside, t, 0.0).astype(dst.np)
    r = np.where(t >= hi, dst.np.type(info.max), r)
    return np.where(t < lo, dst.np.type(info.min), r)  # NaN compares false: stays 0


#: the largest finite value of each FP8 format
FP8_MAX = {"f8e4m3fn": 448.0, "f8e5m2": 57344.0}
#: the overflow policies of a cast into an FP8 format: the largest finite
#: value of the sign, or the format's non-finite value (e4m3fn NaN, e5m2 +-inf)
OVERFLOW = ("saturate", "nonfinite")


def _to_fp8(x: np.ndarray, src: DType, dst: DType, overflow: str) -> np.ndarray:
    """``x`` rounded once to nearest even into the FP8 format ``dst``
    (subnormals kept); a value whose rounding lies beyond the largest finite
    value, or an infinity, follows ``overflow``; NaN stays NaN."""
    if overflow not in OVERFLOW:
        raise ValueError(f"a cast into {dst} needs an overflow policy, one of {OVERFLOW}")
    if src.is_float and src.name != "f64":
        r = np.asarray(x.astype(_F32).astype(dst.np))  # exact widening, one rounding
    elif src.is_float:
        r = np.asarray(_from_f64(x, dst))
    else:
        r = np.asarray(_int_to_float(x, src, dst))
    if overflow == "saturate":
        w = _to_f64(x, src) if src.is_float else x.astype(_F64)
        over = ~np.isfinite(r.astype(_F32)) & ~np.isnan(w)
        top = np.asarray(FP8_MAX[dst.name], dtype=dst.np)
        r = np.where(over, np.where(np.signbit(w), -top, top), r)
    return np.asarray(r, dtype=dst.np)


@np.errstate(all="ignore")
def cast(x: np.ndarray, src: DType, dst: DType, overflow: str | None = None) -> np.ndarray:
    """The value of ``x`` (dtype ``src``) converted to ``dst``.

    float -> float: exact when widening; narrowing rounds once to nearest even
    (also f64 -> f16/bf16, never through an intermediate rounding), overflows to
    +-inf, keeps NaN (quiet) and the sign of zero.
    into FP8 (from any number, FP8 included): rounded once to nearest even,
    subnormals kept, zero signs kept, NaN stays NaN; beyond the largest finite
    value (after rounding) and from +-inf, ``overflow`` decides (required):
    ``saturate`` gives the largest finite value of the sign, ``nonfinite`` NaN
    in f8e4m3fn (which has no infinities) and +-inf in f8e5m2.
    float -> int: truncation toward zero, saturating to the integer range
    (+-inf saturate too); NaN gives 0.
    int -> int: two's-complement truncation or sign/zero extension (wraps).
    int -> float: rounded once to nearest even (also 64-bit ints to f32/f16/bf16).
    bool -> number: 0 or 1. number -> bool: x != 0 (so NaN -> True, -0.0 -> False).
    """
    x = _arr(x, src.np)
    if src == dst:
        return x.copy()
    if dst.is_fp8:
        return _to_fp8(x, src, dst, overflow or "")
    if src.is_fp8 and not dst.is_bool:  # exact into f32, then as from f32
        x, src = x.astype(_F32), _f32
    if dst.is_bool:
        return np.asarray(_wide(x, src) != 0)
    if src.is_float and dst.is_float:
        if src.name == "f64":
            return _from_f64(x, dst)
        return _from_f32(x.astype(_F32), dst) if dst.bits < 64 else _to_f64(x, src)
    if src.is_float:
        return np.asarray(_float_to_int(x, src, dst))
    if dst.is_float:
        return np.asarray(_int_to_float(x, src, dst))
    return np.asarray(x.astype(dst.np))  # int/bool -> int: modular


def bitcast(x: np.ndarray, src: DType, dst: DType) -> np.ndarray:
    """The bits of ``x`` (dtype ``src``) reinterpreted as ``dst`` of equal width.

    bool is stored as one byte holding 0 or 1: bool -> i8/u8 gives 0 or 1, and
    i8/u8 -> bool is true when any bit is set (every bool stays 0 or 1).
    """
    if src.bits != dst.bits:
        raise ValueError(f"bitcast needs equal bit widths ({src} -> {dst})")
    x = _arr(x, src.np)
    if dst.is_bool:
        return np.asarray(_bits(x) != 0)
    if src.is_bool:
        return np.asarray(x.astype(np.uint8)).view(dst.np)
    return np.asarray(x.copy().view(dst.np))


# ---------------------------------------------------------------------------
# Constants

def _python_int_to_float(v: int, dt: DType) -> np.ndarray:
    if dt.name == "f64":
        try:
            return _arr(float(v), _F64)  # Python rounds int -> float correctly
        except OverflowError:
            return _arr(math.inf if v > 0 else -math.inf, _F64)
    m = abs(v)
    shift = max(m.bit_length() - 53, 0)
    top = m >> shift
    if m & ((1 << shift) - 1):
        top |= 1  # round to odd at 53 bits: one later rounding to <= 51 bits stays exact
    try:
        f = math.ldexp(float(top), shift)
    except OverflowError:
        f = math.inf  # beyond every float format's range
    return _from_f64(_arr(-f if v < 0 else f, _F64), dt)


@np.errstate(all="ignore")
def constant(value: int | float | bool, dt: DType) -> np.ndarray:
    """A 0-d array holding the literal ``value`` in ``dt``.

    A float literal (a Python float, i.e. an f64 value) is rounded once to a float
    dtype; an integer literal into a float dtype is rounded once (huge integers
    overflow to +-inf). An integer literal must fit an integer dtype. bool
    literals (and the integers 0 and 1) go into bool; a bool literal is 0/1 in a
    numeric dtype. Anything else raises ValueError.
    """
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool):
        if dt.is_bool:
            return _arr(value, np.bool_)
        value = int(value)
    if dt.is_bool:
        if isinstance(value, int) and value in (0, 1):
            return _arr(bool(value), np.bool_)
        raise ValueError(f"constant {value!r} is not a bool")
    if isinstance(value, int):
        if dt.is_float:
            return _python_int_to_float(value, dt)
        info = np.iinfo(dt.np)
        if not info.min <= value <= info.max:
            raise ValueError(f"constant {value} does not fit {dt} "
                             f"(range {info.min}..{info.max})")
        return _arr(value, dt.np)
    if isinstance(value, float):
        if not dt.is_float:
            raise ValueError(f"constant {value!r} is not representable in {dt}")
        return _from_f64(_arr(value, _F64), dt)
    raise ValueError(f"constant {value!r} is not a number")


#: Every elementwise op name this module implements.
OPS: frozenset[str] = frozenset(
    set(_FLOAT_UNARY) | set(_INT_UNARY) | set(_BOOL_UNARY) | set(_FLOAT_BINARY)
    | set(_INT_BINARY) | set(_BOOL_BINARY) | set(_COMPARE) | {"maximum", "minimum"}
    | {"ite", "cast", "bitcast"})
