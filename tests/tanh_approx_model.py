"""``tn_tanh_approx`` (the cuda prelude's tanh on f32 under a declared bound)
in numpy float32 arithmetic, operation for operation.

The realization: for ``|x| < 1`` the odd polynomial ``|x| + |x|^3 P(x^2)``
(:data:`COEFFS`, Horner by fma); above, ``1 - 2 / (e + 1)`` with ``e =
ex2.approx.ftz(|x| * 2 log2e)`` and the reciprocal by ``rcp.approx.ftz``;
the sign of ``x`` copied onto the result. Every f32 operation of it is an
IEEE operation rounded to nearest (``fma`` included, :func:`fma32`) except
the two of the special function unit, which the model takes as parameters:

* ``ex2``: the correctly rounded ``2^a`` moved ``k`` floats up or down, kept
  only where it stays within ``ex2_ulp`` ulp of the exact ``2^a`` (the
  device measured 2.383 over every f32 input, the PTX ISA promises 2 ulp of
  the correctly rounded value, so 2.5);
* ``rcp``: the correctly rounded ``1/s`` moved ``j`` floats (the PTX ISA
  promises 1 ulp; ``j in (-1, 0, 1)`` covers every float within it).

With both shifts 0 the model is what the emulator computes (its
``tn_ex2_approx_ftz`` and ``tn_rcp_approx`` are the host's correctly rounded
values), bit for bit (``tests/test_approx_tanh.py``); the largest error over
every shift is a bound on what any device meeting those two promises
computes (``benchmarks/tanh_approx.py`` runs both over every input)."""

from __future__ import annotations

import numpy as np

#: P's coefficients, lowest first, f32: the least-squares fit of
#: ``(tanh(x) - x) / x^3`` in ``x^2`` on ``(0, 1]``, weighted to tanh's
#: relative error and iterated toward minimax (Lawson), each coefficient
#: rounded to f32 before the next ones are refitted
#: (``benchmarks/tanh_approx.py --fit``)
COEFFS = tuple(np.float32(float.fromhex(h)) for h in (
    "-0x1.55553cp-2", "0x1.110be6p-3", "-0x1.b9628ap-5", "0x1.600bf2p-6",
    "-0x1.0467d8p-7", "0x1.2db9cap-9", "-0x1.780d3ap-12"))
#: 2 log2(e) rounded to f32 (0x1.715476p+1)
TWO_LOG2E = np.float32(2.0 * 1.4426950408889634)
#: where the exponential form takes over from the polynomial
SPLIT = np.float32(1.0)


def fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``a * b + c`` of f32 operands rounded once to f32: the product is
    exact in f64, the sum is rounded to odd in f64 (TwoSum's error decides
    the last bit), and a value rounded to odd with 29 bits to spare rounds to
    f32 as the exact sum would."""
    a64, b64, c64 = (np.asarray(v, np.float32).astype(np.float64) for v in (a, b, c))
    with np.errstate(all="ignore"):
        p = a64 * b64
        s = p + c64
        bb = s - p
        err = (p - (s - bb)) + (c64 - bb)
        even = (s.view(np.uint64) & 1) == 0
        fix = (err != 0) & even & np.isfinite(s)
        s = np.where(fix, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
        return s.astype(np.float32)


def _step(v: np.ndarray, k: int) -> np.ndarray:
    """``v`` moved ``k`` floats away from (k > 0) or toward (k < 0) zero; v >= 0."""
    for _ in range(abs(k)):
        v = np.nextafter(v, np.float32(np.inf) if k > 0 else np.float32(0))
    return v


def ulp32(y: np.ndarray) -> np.ndarray:
    """The spacing of f32 in the binade of ``|y|`` (f64, finite): ``2^(max(e,
    -126) - 23)`` for ``2^e <= |y| < 2^(e+1)`` (spec/values.md V-14)."""
    _, e = np.frexp(np.abs(np.asarray(y, np.float64)))
    return np.ldexp(1.0, np.maximum(e - 1, -126) - 23)


def polynomial(ax: np.ndarray) -> np.ndarray:
    """``ax + ax^3 P(ax^2)`` as the prelude evaluates it (``ax >= 0``)."""
    s = ax * ax
    p = np.full_like(ax, COEFFS[-1])
    for c in COEFFS[-2::-1]:
        p = fma32(p, s, np.float32(c))
    return fma32(p, s * ax, ax)


def exponential(ax: np.ndarray, ex2_shift: int = 0, rcp_shift: int = 0,
                ex2_ulp: float = 2.5) -> tuple[np.ndarray, np.ndarray]:
    """``1 - 2 / (e + 1)`` as the prelude evaluates it (``ax >= 0``), its
    two special-function results shifted (module doc); with the mask of the
    inputs where the shifted ``2^a`` is within ``ex2_ulp`` of the exact one."""
    with np.errstate(all="ignore"):
        a = ax * TWO_LOG2E
        exact = np.exp2(a.astype(np.float64))
        e = _step(exact.astype(np.float32), ex2_shift)
        inf = np.isinf(exact)
        ok = inf | (np.abs(e.astype(np.float64) - exact) <= ex2_ulp * ulp32(np.where(inf, 1, exact)))
        s = e + np.float32(1)
        r = _step((1.0 / s.astype(np.float64)).astype(np.float32), rcp_shift)
        return fma32(np.float32(-2), r, np.float32(1)), ok


def tanh_approx(x: np.ndarray, ex2_shift: int = 0, rcp_shift: int = 0,
                ex2_ulp: float = 2.5) -> tuple[np.ndarray, np.ndarray]:
    """The whole function on f32 ``x`` (module doc): ``(result, admitted)``,
    ``admitted`` false where the ex2 shift leaves the unit's promise."""
    x = np.asarray(x, np.float32)
    ax = np.abs(x)
    big, ok = exponential(ax, ex2_shift, rcp_shift, ex2_ulp)
    with np.errstate(all="ignore"):
        y = np.where(ax < SPLIT, polynomial(ax), big)
    return np.copysign(y, x), ok | (ax < SPLIT)


def ulp_error(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``|y - tanh(x)| / ulp32(tanh(x))`` with tanh in f64 (within an ulp of
    f64, far below f32's); 0 where both are NaN, inf where one is."""
    x = np.asarray(x, np.float32).astype(np.float64)
    with np.errstate(all="ignore"):
        ref = np.tanh(x)
        err = np.abs(y.astype(np.float64) - ref) / ulp32(np.where(np.isnan(ref), 1, ref))
    nan = np.isnan(ref)
    return np.where(nan, np.where(np.isnan(y), 0.0, np.inf), np.where(np.isnan(y), np.inf, err))
