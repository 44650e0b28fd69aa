"""Transcendental functions for the LLVM backend, and their accuracy contract.

The interpreter defines a transcendental ``f`` on ``f16/bf16/f32`` as the float64
value of ``f`` rounded once to the dtype, with the contract that a result within
1 ulp of the exact value is admitted (``numerics.TRANSCENDENTAL_ULP``), and on
``f64`` as numpy's float64 function (4 ulp). The backend meets the narrow
contract with its own vectorizable code, written in LLVM IR (straight-line
arithmetic, selects and bit operations, so the loop vectorizer widens it):

* ``exp`` on a narrow dtype is :meth:`MathLib.exp_f32`, pure f32 arithmetic with
  one final rounding (f16/bf16 round its f32 value once more, which stays far
  inside their 1 ulp);
* ``exp2 expm1 log log2 log1p tanh erf sigmoid`` on a narrow dtype are
  evaluated in float64 on the exactly widened argument and rounded once to the
  dtype (:meth:`MathLib.narrow`). Each float64 evaluation has relative error
  ``eps <= 2^-33`` (stated per function), so the rounded result is within
  ``0.5 + 2^24 eps < 0.51`` ulp of the exact value for every f32 input (the
  same argument covers subnormal results, whose ulp is larger relative to the
  value, and f16/bf16, whose ulp is larger still);
* the rest (``sin cos pow atan2`` on narrow dtypes, every f64 transcendental)
  call the C library's float64 functions (scalar): within 1 ulp of float64 for
  glibc, hence within both contracts. ``rsqrt`` is ``1/sqrt(x)`` with
  correctly rounded steps, as the interpreter writes it.

Every narrow function is also checked against the float64 reference over
every f32 input (``tests/test_llvm_math.py``, marker ``slow``); the measured
maxima are listed in spec/lowering.md.
"""

from __future__ import annotations

import math

from llvmlite import ir

F32 = ir.FloatType()
F64 = ir.DoubleType()
I32 = ir.IntType(32)
I64 = ir.IntType(64)

#: C library functions the generated code may call (float64 -> float64, or two args);
#: each is bound explicitly by ``symbols.bind_all``
LIBM_UNARY = ("exp", "exp2", "log", "log2", "log1p", "expm1", "sin", "cos", "tanh", "erf")
LIBM_BINARY = ("pow", "atan2")

_LN2_HI = 6.93147180369123816490e-01  # low 32 bits zero: k * _LN2_HI is exact for |k| < 2**20
_LN2_LO = 1.90821492927058770002e-10
_INV_LN2 = 1.4426950408889634

_LN2_HI_F32 = 0.693145751953125  # 16 significant bits: k * _LN2_HI_F32 is exact for |k| < 2**8
_LN2_LO_F32 = 1.428606765330187e-06  # ln2 - _LN2_HI_F32 rounded to f32 (error 2**-44)
_INV_LN2_F32 = 1.4426950216293335
_SQRT_HALF_BITS = 0x3FE6A09E667F3BCD  # float64 bits of sqrt(1/2)
#: G(u) ~ erfc(a) e^(a^2) on 1/2 <= a <= 4, u = (2a - 4.5) / 3.5: coefficients of u^0..u^18
_ERFCX_G = (0.2310872587301055, -0.15485137994376913, 0.09797742150498931,
            -0.05896416758927321, 0.0339422161060765, -0.018772146240289854,
            0.010010975138523519, -0.005163017052008778, 0.0025818463350331194,
            -0.0012558031640829887, 0.0005941512845688791, -0.00027070963368037906,
            0.0001217249686520333, -5.890927181502054e-05, 2.5574796056053032e-05,
            -5.789262247149706e-06, 2.306751008955369e-06, -3.5211180509908326e-06,
            1.4252922358716967e-06)
#: 1.5 * 2^23: for |v| < 2^22, ``fma(a, b, _ROUND_SHIFT_F32) - _ROUND_SHIFT_F32`` is
#: ``a b`` rounded to an integer (ties to even), and the bits of the sum are
#: ``0x4b400000`` plus that integer
_ROUND_SHIFT_F32 = 12582912.0
#: q(r) ~ (e^r - 1 - r) / r^2 on |r| <= ln2/2, coefficients of r^0..r^4 (f32 values;
#: minimax for the error of ``r^2 q(r)`` relative to ``e^r``, at most 3.1e-9)
_EXPM1_Q_F32 = (0.4999999403953552, 0.1666651964187622, 0.04166839271783829,
                0.008368750102818012, 0.0013814528938382864)


class MathLib:
    """Declarations and definitions of math helpers inside one module."""

    #: narrow-dtype transcendentals evaluated by :meth:`narrow` (float64 in and out)
    NARROW = ("exp2", "expm1", "log", "log2", "log1p", "tanh", "erf", "sigmoid")

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

    def exp_f32(self) -> ir.Function:
        """``float tn.exp.f32(float)``: e^x in f32 arithmetic, faithful (below 1 ulp).

        Reduction ``x = k ln2 + r``, ``k = roundeven(x log2e)`` (the exact
        product of ``x`` and the f32 ``log2e``, rounded by one FMA with the
        shift ``_ROUND_SHIFT_F32``): ``r1 = x - k _LN2_HI_F32`` is exact (16-bit head, ``|k| <= 150``; one FMA), ``r =
        RN(r1 - k _LN2_LO_F32)``, and its rounding error ``d`` is recovered by a
        second FMA (``r1 - r`` is exact), so ``r + d`` is ``x - k ln2`` within
        ``2^-36``. Then ``t = r + (d + r^2 q(r)) ~ e^(r+d) - 1`` with ``q`` a
        degree-4 fit (f32 coefficients; ``r^2 q(r)`` within ``3.1e-9 e^r`` of
        ``e^r - 1 - r`` on ``|r| <= ln2/2``), and the result is ``fma(t, 2^k,
        2^k)``: a single rounding of ``(1 + t) 2^k``, also when it is subnormal (``2^k`` is then an exact
        subnormal power of two). Before that rounding the error is the
        rounding of ``t`` (at most ``2^-26`` for ``|t| < 1/2``) plus a few
        smaller terms, a fraction of an ulp of the result; the maximum of the
        whole over every f32 input is 0.9 ulp or less (measured exhaustively,
        see spec/lowering.md). ``x`` is clamped to ``[-104, 89]``, beyond which
        the result is ``0`` or ``+inf`` anyway; NaN is selected through.
        """
        fn, b = self._define("tn.exp.f32", F32, [F32])
        if b is not None:
            b.ret(_ExpF32(self, b, F32).full(fn.args[0]))
        return fn

    def exp_f32_vec(self, w: int) -> ir.Function:
        """``<w x float> tn.exp.v<w>f32(<w x float>)``: :meth:`exp_f32` in every
        lane, bit for bit, with the rare cases kept off the common path.

        The common path is the scalar function's arithmetic without its range
        handling: it applies when the rounded ``k`` of every lane lies in
        ``[-126, 127]``, where ``2^k`` is a normal float and the scalar
        function's clamps and selects all take their identity branch (its
        clamp of ``x`` to ``[-104, 89]`` changes no ``x`` with such a ``k``).
        ``k`` is read from the bits of the shifted product ``x log2e + 1.5 *
        2^23`` (``0x4b400000 + k``), so one unsigned comparison per lane tells
        whether a lane leaves the range (NaN and infinities do, their bits
        being far from that constant). A step where some lane does runs the
        whole scalar formula lane-wise instead.
        """
        vt = ir.VectorType(F32, w)
        fn, b = self._define(f"tn.exp.v{w}f32", vt, [vt])
        if b is None:
            return fn
        x = fn.args[0]
        e = _ExpF32(self, b, vt)
        kshift = e.fma(x, e.c(_INV_LN2_F32), e.c(_ROUND_SHIFT_F32))
        t = e.poly(x, b.fsub(kshift, e.c(_ROUND_SHIFT_F32)))
        bits = b.bitcast(kshift, e.int_t)
        # k + 126 = bits - 0x4b400000 + 126, in [0, 253] exactly when k is in range
        off = b.sub(bits, e.i(0x4B400000 - 126))
        out = b.icmp_unsigned(">", off, e.i(253))
        anyout = b.call(self.intrinsic(f"llvm.vector.reduce.or.v{w}i1", ir.IntType(1),
                                       [out.type]), [out])
        common, rare = fn.append_basic_block("common"), fn.append_basic_block("rare")
        b.cbranch(anyout, rare, common)
        b.position_at_end(common)
        s = b.bitcast(b.shl(b.sub(bits, e.i(0x4B400000 - 127)), e.i(23)), vt)
        b.ret(e.fma(t, s, s))
        b.position_at_end(rare)
        b.ret(e.full(x))
        return fn

    def fdiv_prep_f32(self, b: ir.IRBuilder, d: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value]:
        """``(y, lo, hi)`` for the f32 divisor ``d``, emitted at ``b``: ``y =
        1/d`` (IEEE) and the range ``lo <= |a| < hi`` of dividends for which
        :meth:`fdiv_by_f32_vec`'s short form is the IEEE quotient ``a / d``
        (spec/lowering.md L-6, *Division by a shared divisor*). With ``d``'s
        exponent ``e`` (``d`` normal, ``e <= 125``), ``|a|``'s exponent must lie
        in ``[max(e - 125, -79), min(e + 127, 128))``; for any other ``d`` (zero,
        subnormal, ``|d| >= 2^126``, infinite, NaN) the range is empty (``lo =
        +inf``)."""
        i = lambda v: ir.Constant(I32, v)  # noqa: E731
        e = b.sub(b.and_(b.lshr(b.bitcast(d, I32), i(23)), i(0xFF)), i(127))
        usable = b.and_(b.icmp_signed(">=", e, i(-126)), b.icmp_signed("<=", e, i(125)))
        lo_e = b.sub(e, i(125))
        lo_e = b.select(b.icmp_signed(">", lo_e, i(-79)), lo_e, i(-79))
        hi_e = b.add(e, i(127))
        inf = ir.Constant(F32, math.inf)
        lo = b.bitcast(b.shl(b.add(lo_e, i(127)), i(23)), F32)
        hi = b.select(b.icmp_signed(">=", hi_e, i(128)), inf,
                      b.bitcast(b.shl(b.add(hi_e, i(127)), i(23)), F32))
        y = b.fdiv(ir.Constant(F32, 1.0), d)
        return (b.select(usable, y, ir.Constant(F32, 0.0)), b.select(usable, lo, inf),
                b.select(usable, hi, ir.Constant(F32, 0.0)))

    def fdiv_by_f32_vec(self, w: int) -> ir.Function:
        """``<w x float> tn.fdiv_by.v<w>f32(a, d, y, lo, hi)``: ``a / d`` in
        every lane, bit for bit, for the divisor ``d`` prepared by
        :meth:`fdiv_prep_f32` (``y``, ``lo``, ``hi`` splat). The common path is
        ``q0 = a y``, ``r = fma(-d, q0, a)``, ``q = fma(r, y, q0)``: a multiply
        and two FMAs instead of a division, valid when every lane's ``|a|`` is
        in ``[lo, hi)`` (one ordered comparison each way, so a NaN leaves it);
        a step where some lane is not divides every lane."""
        vt = ir.VectorType(F32, w)
        fn, b = self._define(f"tn.fdiv_by.v{w}f32", vt, [vt] * 5)
        if b is None:
            return fn
        a, d, y, lo, hi = fn.args
        e = _ExpF32(self, b, vt)
        q0 = b.fmul(a, y)
        q = e.fma(e.fma(b.fneg(d), q0, a), y, q0)
        m = e.call("fabs", a)
        inside = b.and_(b.fcmp_ordered(">=", m, lo), b.fcmp_ordered("<", m, hi))
        out = b.not_(inside)
        anyout = b.call(self.intrinsic(f"llvm.vector.reduce.or.v{w}i1", ir.IntType(1),
                                       [out.type]), [out])
        common, rare = fn.append_basic_block("common"), fn.append_basic_block("rare")
        b.cbranch(anyout, rare, common)
        b.position_at_end(common)
        b.ret(q)
        b.position_at_end(rare)
        b.ret(b.fdiv(a, d))
        return fn

    def _define(self, name: str, ret: ir.Type, args: list[ir.Type]
                ) -> tuple[ir.Function, ir.IRBuilder | None]:
        """The internal always-inlined function ``name``, and a builder at its entry
        when it still has to be written (``None`` when already defined)."""
        if name in self.fns:
            return self.fns[name], None
        fn = ir.Function(self.m, ir.FunctionType(ret, args), name=name)
        fn.linkage = "internal"
        fn.attributes.add("alwaysinline")
        fn.attributes.add("nounwind")
        self.fns[name] = fn
        return fn, ir.IRBuilder(fn.append_basic_block("entry"))

    def narrow(self, op: str) -> ir.Function:
        """``double tn.<op>.narrow(double)``: ``op`` (one of :attr:`NARROW`) of a
        float64 argument that is a widened f16/bf16/f32 value, with relative
        error at most ``2^-33`` for every such argument, so that rounding the
        result once to the narrow dtype is within 1 ulp (see the method of each
        function below)."""
        fn, b = self._define(f"tn.{op}.narrow", F64, [F64])
        if b is not None:
            b.ret(getattr(_Narrow(self, b), op)(fn.args[0]))
        return fn


class _ExpF32:
    """The arithmetic of :meth:`MathLib.exp_f32` on f32 scalars or vectors
    (``ty``): constants are splat to ``ty`` and intrinsics overloaded on it."""

    def __init__(self, lib: MathLib, b: ir.IRBuilder, ty: ir.Type):
        self.lib, self.b, self.ty = lib, b, ty
        w = ty.count if isinstance(ty, ir.VectorType) else None
        self.int_t = I32 if w is None else ir.VectorType(I32, w)
        self.sfx = "f32" if w is None else f"v{w}f32"

    def c(self, v: float) -> ir.Constant:
        return ir.Constant(self.ty, v) if self.ty is F32 else \
            ir.Constant(self.ty, [v] * self.ty.count)

    def i(self, v: int) -> ir.Constant:
        return ir.Constant(self.int_t, v) if self.int_t is I32 else \
            ir.Constant(self.int_t, [v] * self.int_t.count)

    def call(self, name: str, *args: ir.Value) -> ir.Value:
        fn = self.lib.intrinsic(f"llvm.{name}.{self.sfx}", self.ty, [self.ty] * len(args))
        return self.b.call(fn, list(args))

    def fma(self, a: ir.Value, x: ir.Value, y: ir.Value) -> ir.Value:
        return self.call("fma", a, x, y)

    def poly(self, xc: ir.Value, k: ir.Value) -> ir.Value:
        """``t ~ e^(xc - k ln2) - 1`` for the integer-valued ``k`` (the
        reduction and polynomial of :meth:`MathLib.exp_f32`)."""
        b = self.b
        nk = b.fneg(k)
        r1 = self.fma(nk, self.c(_LN2_HI_F32), xc)
        r = self.fma(nk, self.c(_LN2_LO_F32), r1)
        d = self.fma(nk, self.c(_LN2_LO_F32), b.fsub(r1, r))
        acc = self.c(_EXPM1_Q_F32[-1])
        for cf in reversed(_EXPM1_Q_F32[:-1]):
            acc = self.fma(acc, r, self.c(cf))
        return b.fadd(r, self.fma(b.fmul(r, r), acc, d))

    def full(self, x: ir.Value) -> ir.Value:
        """e^x for every input, as :meth:`MathLib.exp_f32` states it."""
        b, c, i = self.b, self.c, self.i
        xc = self.call("minnum", self.call("maxnum", x, c(-104.0)), c(89.0))
        shift = c(_ROUND_SHIFT_F32)
        k = b.fsub(self.fma(xc, c(_INV_LN2_F32), shift), shift)
        t = self.poly(xc, k)
        # (1 + t) 2^k = (1 + t') 2^k1 with k1 = k clamped to [-149, 127] (2^k1 is a
        # float): t' = t when k = k1; (t - 1) / 2 for k = -150 (its rounding is far
        # below 2^-149); for k = 128 the exact doubling below (the result is normal)
        ki = b.fptosi(k, self.int_t)
        big = b.icmp_signed(">", ki, i(127))
        tiny = b.icmp_signed("<", ki, i(-149))
        k1 = b.select(big, i(127), b.select(tiny, i(-149), ki))
        t = b.select(tiny, b.fmul(b.fsub(t, c(1.0)), c(0.5)), t)
        normal = b.shl(b.add(k1, i(127)), i(23))
        sub = b.shl(i(1), b.add(k1, i(149)))
        s = b.bitcast(b.select(b.icmp_signed("<", k1, i(-126)), sub, normal), self.ty)
        y = self.fma(t, s, s)
        y = b.select(big, b.fmul(y, c(2.0)), y)
        return b.select(b.fcmp_unordered("uno", x, x), b.fadd(x, x), y)


class _Narrow:
    """Builders of the float64 evaluations behind :meth:`MathLib.narrow`.

    Arguments are f16/bf16/f32 values widened to float64, so they have at most
    24 significant bits and lie in ``[-2^128, 2^128]``; products of two of them
    are exact in float64. Each method returns the float64 result."""

    def __init__(self, lib: MathLib, b: ir.IRBuilder):
        self.lib, self.b = lib, b
        self.fma_fn = lib.intrinsic("llvm.fma.f64", F64, [F64, F64, F64])

    # -- helpers ------------------------------------------------------------------------
    @staticmethod
    def c(v: float) -> ir.Constant:
        return ir.Constant(F64, v)

    def fma(self, a: ir.Value, x: ir.Value, y: ir.Value) -> ir.Value:
        return self.b.call(self.fma_fn, [a, x, y])

    def f(self, name: str, *args: ir.Value) -> ir.Value:
        fn = self.lib.intrinsic(f"llvm.{name}.f64", F64, [F64] * len(args))
        return self.b.call(fn, list(args))

    def clamp(self, x: ir.Value, lo: float, hi: float) -> ir.Value:
        """``x`` clamped to ``[lo, hi]`` (NaN becomes ``lo``: callers select NaN
        back at the end)."""
        return self.f("minnum", self.f("maxnum", x, self.c(lo)), self.c(hi))

    def nan_through(self, x: ir.Value, res: ir.Value) -> ir.Value:
        """``res``, or a quiet NaN where ``x`` is NaN."""
        b = self.b
        return b.select(b.fcmp_unordered("uno", x, x), b.fadd(x, x), res)

    def pow2(self, k: ir.Value) -> ir.Value:
        """``2^k`` for an integer-valued float64 ``k`` in ``[-1022, 1023]``."""
        b = self.b
        e = b.add(b.fptosi(k, I64), ir.Constant(I64, 1023))
        return b.bitcast(b.shl(e, ir.Constant(I64, 52)), F64)

    def expm1_reduced(self, r: ir.Value) -> ir.Value:
        """``e^r - 1`` for ``|r| <= 0.35``: ``r + r^2 Q(r)`` with ``Q`` the Taylor
        polynomial of ``(e^r - 1 - r) / r^2`` to degree 8. Truncation is below
        ``r^11 / 11! * 1.03 <= 2^-40 |r|`` and the evaluation loses a few
        float64 ulp, so the relative error is below ``2^-40``."""
        q = _horner(self.b, self.fma_fn, r, [self.c(1.0 / math.factorial(n + 2))
                                             for n in range(9)])
        return self.fma(self.b.fmul(r, r), q, r)

    def reduce_exp(self, x: ir.Value) -> tuple[ir.Value, ir.Value]:
        """``(k, r)`` with ``x = k ln2 + r``, ``k`` integer valued, ``|r| <= 0.35``
        (Cody-Waite: ``k * _LN2_HI`` is exact and ``x - k _LN2_HI`` too, one
        rounding of ``2^-53 |r|`` in the second step), for ``|x| < 2^19``."""
        k = self.f("roundeven", self.b.fmul(x, self.c(_INV_LN2)))
        nk = self.b.fneg(k)
        return k, self.fma(nk, self.c(_LN2_LO), self.fma(nk, self.c(_LN2_HI), x))

    def log_parts(self, x: ir.Value) -> tuple[ir.Value, ir.Value]:
        """``(e, L)`` with ``x = 2^e m``, ``m`` in ``[sqrt(1/2), sqrt(2))`` and
        ``L = log(m)``, for positive normal float64 ``x`` (every positive narrow
        value). ``m`` and ``e`` come from the bits exactly; ``L = 2 atanh(s)``
        with ``s = (m - 1) / (m + 1)``, ``|s| <= 0.1716``, summed as ``2s + 2s z
        R(z)``, ``z = s^2``, ``R`` the series ``sum z^j / (2j + 3)`` to ``j = 6``:
        truncation below ``z^7 / 17 <= 2^-39`` relative; ``m - 1`` is exact and
        ``m + 1``, the division and the sum add a few float64 ulp, so ``L`` has
        relative error below ``2^-38``."""
        b = self.b
        bits = b.bitcast(x, I64)
        e = b.ashr(b.sub(bits, ir.Constant(I64, _SQRT_HALF_BITS)), ir.Constant(I64, 52))
        m = b.bitcast(b.sub(bits, b.shl(e, ir.Constant(I64, 52))), F64)
        s = b.fdiv(b.fsub(m, self.c(1.0)), b.fadd(m, self.c(1.0)))
        s2 = b.fmul(s, self.c(2.0))
        z = b.fmul(s, s)
        r = _horner(b, self.fma_fn, z, [self.c(1.0 / (2 * j + 3)) for j in range(7)])
        return b.sitofp(e, F64), self.fma(b.fmul(s2, z), r, s2)

    def log_specials(self, u: ir.Value, res: ir.Value) -> ir.Value:
        """``res`` for positive finite ``u``; ``log``'s values elsewhere: ``-inf``
        at ``+-0``, NaN below 0 and at NaN, ``+inf`` at ``+inf``."""
        b, c = self.b, self.c
        res = b.select(b.fcmp_ordered("==", u, c(0.0)), c(-math.inf), res)
        res = b.select(b.fcmp_ordered("<", u, c(0.0)), c(math.nan), res)
        res = b.select(b.fcmp_ordered("==", u, c(math.inf)), u, res)
        return self.nan_through(u, res)

    # -- the functions -------------------------------------------------------------------
    def expm1(self, x: ir.Value) -> ir.Value:
        """``e^x - 1 = fma(2^k, t, 2^k - 1)`` with ``t = e^r - 1``
        (:meth:`expm1_reduced`, relative ``2^-40``) and ``x`` clamped to
        ``[-104, 89]`` (beyond, narrow results are ``-1`` and ``+inf``). The
        only cancellation is ``k = 0``, where the result is ``t`` itself; for
        ``k != 0`` the result is at least ``0.29 |2^k t|``, so the relative error
        stays below ``2^-38``. ``+-0`` is returned as is."""
        b = self.b
        k, r = self.reduce_exp(self.clamp(x, -104.0, 89.0))
        p = self.pow2(k)
        res = self.fma(p, self.expm1_reduced(r), b.fsub(p, self.c(1.0)))
        res = b.select(b.fcmp_ordered("==", x, self.c(0.0)), x, res)
        return self.nan_through(x, res)

    def exp2(self, x: ir.Value) -> ir.Value:
        """``2^x = 2^k (1 + t)``, ``k = roundeven(x)``, ``t = e^r - 1`` at ``r = (x -
        k) ln2`` (``x - k`` exact, one rounding in the product: relative error
        ``2^-53`` in ``r``, hence ``2^-54`` in the result), ``x`` clamped to
        ``[-151, 129]``; relative error below ``2^-39``, and ``2^n`` exactly for
        integers ``n``."""
        b = self.b
        xc = self.clamp(x, -151.0, 129.0)
        k = self.f("roundeven", xc)
        r = b.fmul(b.fsub(xc, k), self.c(math.log(2)))
        p = self.pow2(k)
        return self.nan_through(x, self.fma(p, self.expm1_reduced(r), p))

    def sigmoid(self, x: ir.Value) -> ir.Value:
        """``1 / (1 + e^-x)`` with ``e^-x = 2^k (1 + t)`` (relative ``2^-40``) for
        ``-x`` clamped to ``[-104, 104]`` (beyond, the narrow result is 1 or 0
        either way): the sum and the correctly rounded division add ``2^-52``."""
        b = self.b
        k, r = self.reduce_exp(self.clamp(b.fneg(x), -104.0, 104.0))
        p = self.pow2(k)
        e = self.fma(p, self.expm1_reduced(r), p)
        return self.nan_through(x, b.fdiv(self.c(1.0), b.fadd(self.c(1.0), e)))

    def tanh(self, x: ir.Value) -> ir.Value:
        """``sign(x) E / (E + 2)`` with ``E = expm1(2 |x|)`` (:meth:`expm1`,
        relative ``2^-38``; ``2|x|`` is clamped to 40 where narrow results are
        1): relative error below ``2^-36``. ``copysign`` keeps ``-0``."""
        b = self.b
        a = self.f("minnum", b.fmul(self.f("fabs", x), self.c(2.0)), self.c(40.0))
        e = self.expm1(a)
        return self.nan_through(x, self.f("copysign", b.fdiv(e, b.fadd(e, self.c(2.0))), x))

    def erf(self, x: ir.Value) -> ir.Value:
        """``sign(x) erf(a)``, ``a = |x|``. For ``a < 1/2``: ``a P(a^2)`` with ``P``
        the Taylor series ``2/sqrt(pi) sum (-1)^n a^2n / (n! (2n+1))`` to
        ``n = 8`` (alternating; truncation below ``a^18 / (9! 19) <= 2^-40``
        relative). For ``1/2 <= a <= 4``: ``1 - e^(-a^2) G(u)``, ``G`` a degree-18
        polynomial in ``u = (2a - 4.5) / 3.5`` fitted to ``erfc(a) e^(a^2)``
        (absolute error below ``2^-36`` after the factor ``e^(-a^2)``, itself
        relative ``2^-40`` since ``a^2`` is exact); ``erf(a) >= 0.52`` there, so
        the relative error is below ``2^-35``. ``a`` is clamped to 4, where the
        narrow result is 1. ``copysign`` keeps ``-0``."""
        b, c = self.b, self.c
        a = self.f("minnum", self.f("fabs", x), c(4.0))
        a2 = b.fmul(a, a)
        small = b.fmul(a, _horner(b, self.fma_fn, a2, [
            c((-1) ** n * 2.0 / math.sqrt(math.pi) / (math.factorial(n) * (2 * n + 1)))
            for n in range(9)]))
        k, r = self.reduce_exp(b.fneg(a2))
        p = self.pow2(k)
        g = _horner(b, self.fma_fn, self.fma(a, c(2 / 3.5), c(-4.5 / 3.5)),
                    [c(v) for v in _ERFCX_G])
        large = b.fsub(c(1.0), b.fmul(self.fma(p, self.expm1_reduced(r), p), g))
        res = b.select(b.fcmp_ordered("<", a, c(0.5)), small, large)
        return self.nan_through(x, self.f("copysign", res, x))

    def log(self, x: ir.Value) -> ir.Value:
        """``e ln2 + L`` (:meth:`log_parts`) in one FMA; where ``e != 0``, ``|log x|
        >= 0.34`` bounds the cancellation, so the relative error is below
        ``2^-36``."""
        e, lm = self.log_parts(x)
        return self.log_specials(x, self.fma(e, self.c(math.log(2)), lm))

    def log2(self, x: ir.Value) -> ir.Value:
        """``e + L / ln2`` in one FMA (relative error below ``2^-36``); exactly
        ``n`` at ``2^n``."""
        e, lm = self.log_parts(x)
        return self.log_specials(x, self.fma(lm, self.c(1.0 / math.log(2)), e))

    def log1p(self, x: ir.Value) -> ir.Value:
        """``log(1 + x)`` where ``1 + x`` is exact in float64 (``|x| >= 2^-29``;
        for large ``|x|`` its rounding is ``2^-53`` relative, harmless), and
        ``x`` itself for ``|x| < 2^-29`` (relative error ``|x| / 2 < 2^-30``, so
        within 0.52 ulp after rounding to f32)."""
        b = self.b
        u = b.fadd(x, self.c(1.0))
        e, lm = self.log_parts(u)
        res = self.log_specials(u, self.fma(e, self.c(math.log(2)), lm))
        return b.select(b.fcmp_ordered("<", self.f("fabs", x), self.c(2.0 ** -29)), x, res)


def _horner(b: ir.IRBuilder, fma: ir.Function, x: ir.Value, coef: list[ir.Value]) -> ir.Value:
    """``coef[0] + coef[1] x + ... + coef[n] x^n`` by Horner's rule with FMAs."""
    acc = coef[-1]
    for cf in reversed(coef[:-1]):
        acc = b.call(fma, [acc, x, cf])
    return acc
