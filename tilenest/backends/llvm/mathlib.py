"""Transcendental functions for the LLVM backend, and their accuracy contract.

The interpreter defines a transcendental ``f`` on ``f16/bf16/f32`` as the float64
value of ``f`` rounded once to the dtype (``numerics.TRANSCENDENTAL_ULP``: 1 ulp),
and on ``f64`` as numpy's float64 function (4 ulp). The backend follows the
same structure so that compiled results agree with the reference:

* every narrow (``f16/bf16/f32``) transcendental is evaluated in float64 and
  rounded once to the dtype;
* ``exp`` on a narrow dtype uses :func:`exp_narrow`, a polynomial written in
  LLVM IR (vectorizable): Cody-Waite reduction ``x = k ln2 + r`` with
  ``|r| <= ln2/2`` (``k ln2`` subtracted exactly with two FMAs), the degree-13
  Taylor polynomial of ``e^r`` (truncation error below ``2^-57`` relative)
  evaluated by Estrin's scheme with FMAs (dependency depth 4), and scaling by ``2^k`` built from bits. Its
  float64 error is a few float64 ulp (< ``2^-50`` relative), so after the one
  rounding to f32 it is within the 1-ulp contract always, and bit-identical to
  the interpreter's value except when the exact result lies within ``2^-50``
  relative of a rounding midpoint (probability about ``2^-26`` per element).
  It is valid over the whole float64 range (``2^k`` is applied as two normal
  factors; results in the float64 subnormal range may be off by one subnormal
  ulp, far below any narrow dtype's resolution), because ``sigmoid`` uses the
  float64 value itself; NaN propagates, overflow gives ``+inf``.
* every other transcendental (``exp`` on f64, ``exp2 log log2 log1p expm1 sin
  cos tanh erf pow atan2``) calls the C library's float64 function (scalar,
  not vectorized): within 1 ulp of float64 for glibc, hence within the narrow
  dtypes' 1-ulp contract after the one rounding and within the f64 4-ulp
  contract; ``sigmoid`` is ``1/(1 + exp(-x))`` and ``rsqrt`` is ``1/sqrt(x)``, both
  in float64 with correctly rounded divisions and square roots, exactly as the
  interpreter writes them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math

from llvmlite import ir

F64 = ir.DoubleType()
I64 = ir.IntType(64)

#: C library functions the generated code may call (float64 -> float64, or two args)
LIBM_UNARY = ("exp", "exp2", "log", "log2", "log1p", "expm1", "sin", "cos", "tanh", "erf")
LIBM_BINARY = ("pow", "atan2")

_LN2_HI = 6.93147180369123816490e-01  # low 32 bits zero: k * _LN2_HI is exact for |k| < 2**20
_LN2_LO = 1.90821492927058770002e-10
_INV_LN2 = 1.4426950408889634
_EXP_MAX = 709.782712893384  # above: exp overflows float64
_EXP_MIN = -745.1332191019412  # below: exp is below half the smallest subnormal


def libm_addresses() -> dict[str, int]:
    """Addresses of the libm functions, for the JIT's symbol table."""
    name = ctypes.util.find_library("m")
    lib = ctypes.CDLL(name) if name else ctypes.CDLL(None)
    out = {}
    for f in LIBM_UNARY + LIBM_BINARY:
        out[f] = ctypes.cast(getattr(lib, f), ctypes.c_void_p).value
    return out


class MathLib:
    """Declarations and definitions of math helpers inside one module."""

    def __init__(self, module: ir.Module):
        self.m = module
        self.fns: dict[str, ir.Function] = {}

    def intrinsic(self, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
        fn = self.fns.get(name)
        if fn is None:
            fn = ir.Function(self.m, ir.FunctionType(ret, args), name=name)
            self.fns[name] = fn
        return fn

    def libm(self, name: str) -> ir.Function:
        n = 2 if name in LIBM_BINARY else 1
        return self.intrinsic(name, F64, [F64] * n)

    def exp_narrow(self) -> ir.Function:
        """``double tn.exp.narrow(double)``: e^x for results that are rounded to a
        narrow dtype, possibly after float64 arithmetic (see the module docstring)."""
        name = "tn.exp.narrow"
        if name in self.fns:
            return self.fns[name]
        fn = ir.Function(self.m, ir.FunctionType(F64, [F64]), name=name)
        fn.linkage = "internal"
        fn.attributes.add("alwaysinline")
        fn.attributes.add("nounwind")
        self.fns[name] = fn
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        x = fn.args[0]
        c = lambda v: ir.Constant(F64, v)  # noqa: E731
        fma = self.intrinsic("llvm.fma.f64", F64, [F64, F64, F64])
        rnd = self.intrinsic("llvm.roundeven.f64", F64, [F64])
        isnan = b.fcmp_unordered("uno", x, x)
        big = b.fcmp_ordered(">", x, c(_EXP_MAX))
        small = b.fcmp_ordered("<", x, c(_EXP_MIN))
        xc = b.select(big, c(_EXP_MAX), b.select(small, c(_EXP_MIN), x))
        xc = b.select(isnan, c(0.0), xc)
        k = b.call(rnd, [b.fmul(xc, c(_INV_LN2))])
        nk = b.fneg(k)
        r = b.call(fma, [nk, c(_LN2_HI), xc])
        r = b.call(fma, [nk, c(_LN2_LO), r])
        # Estrin's scheme: the same polynomial with dependency depth 4 instead of 13
        # (Horner's chain of FMAs made the vectorized loop latency-bound)
        coef = [c(1.0 / math.factorial(n)) for n in range(14)]
        q = [b.call(fma, [coef[2 * i + 1], r, coef[2 * i]]) for i in range(7)]
        r2 = b.fmul(r, r)
        s_ = [b.call(fma, [q[1], r2, q[0]]), b.call(fma, [q[3], r2, q[2]]),
              b.call(fma, [q[5], r2, q[4]]), q[6]]
        r4 = b.fmul(r2, r2)
        t0 = b.call(fma, [s_[1], r4, s_[0]])
        t1 = b.call(fma, [s_[3], r4, s_[2]])
        p = b.call(fma, [t1, b.fmul(r4, r4), t0])
        # 2^k in two normal factors: k in [-1075, 1024] splits into halves in range
        ki = b.fptosi(k, I64)
        k1 = b.ashr(ki, ir.Constant(I64, 1))
        k2 = b.sub(ki, k1)

        def pow2(e: ir.Value) -> ir.Value:
            return b.bitcast(b.shl(b.add(e, ir.Constant(I64, 1023)), ir.Constant(I64, 52)), F64)

        res = b.fmul(b.fmul(p, pow2(k1)), pow2(k2))
        res = b.select(big, c(math.inf), res)
        res = b.select(small, c(0.0), res)
        res = b.select(isnan, b.fadd(x, x), res)
        b.ret(res)
        return fn
