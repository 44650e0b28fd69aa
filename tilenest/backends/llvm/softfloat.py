"""Exact half-precision, bfloat16 and FP8 conversions written in LLVM IR.

The code generator keeps f16 values in LLVM ``half`` and bf16 values as
``i16`` bit patterns. Where the host has no instruction for a conversion
(f64 -> f16 on x86-64 always, every f16 <-> f32 conversion on x86-64 without
F16C), LLVM's instruction selection calls a run-time helper of the compiler
runtime (``__truncdfhf2``, ``__truncsfhf2``, ``__extendhfsf2``, ...). Such a
helper is not part of any library a Python process is guaranteed to have
loaded, so tilenest defines every one of them here, in IR built from integer
operations and correctly rounded f32/f64 hardware arithmetic only, and the JIT
binds those definitions explicitly (:mod:`.symbols`).

Meaning of each conversion (IEEE 754, round to nearest even, as
``semantics/numerics.py`` states it):

* widening (f16 -> f32, f16 -> f64, bf16 -> f32) is exact; NaN stays NaN with
  its sign and leading payload bits, and is quiet;
* narrowing rounds once: overflow gives +-inf, the sign of zero is kept,
  subnormal results are rounded at their own (coarser) spacing, NaN becomes a
  quiet NaN with the sign and the leading payload bits;
* f64 -> f16 and f64 -> bf16 round once, not twice: the f64 value is first
  rounded to *odd* at f32 (:func:`f64_to_f32_odd`), which keeps the side of
  every f16/bf16 rounding midpoint, then rounded to nearest even;
* the FP8 formats (``i8`` bit patterns) widen exactly to f32 and are reached
  from f32 with one rounding and the cast's overflow policy
  (:func:`fp8_bits_to_f32`, :func:`f32_to_fp8_bits`).

The builders take an ``ir.IRBuilder`` positioned where the code goes; they
emit straight-line code (selects, no branches), so loops using them
vectorize.
"""

from __future__ import annotations

import math

from llvmlite import ir

I16, I32, I64 = ir.IntType(16), ir.IntType(32), ir.IntType(64)
F16, F32, F64 = ir.HalfType(), ir.FloatType(), ir.DoubleType()
BF16 = ir.IntType(16)  # bf16 travels as its bit pattern


def like(v: ir.Value, t: ir.Type) -> ir.Type:
    """``t``, or a vector of ``t`` as wide as ``v``'s vector type."""
    return ir.VectorType(t, v.type.count) if isinstance(v.type, ir.VectorType) else t


def const_of(v: ir.Value, c: int | float) -> ir.Constant:
    """The constant ``c`` of ``v``'s type (in every lane of a vector)."""
    t = v.type
    return ir.Constant(t, [c] * t.count) if isinstance(t, ir.VectorType) else ir.Constant(t, c)


def _c32(v: int) -> ir.Constant:
    return ir.Constant(I32, v)


def _fabs(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """``|x|`` by clearing the sign bit (no intrinsic, no libcall)."""
    t = x.type
    it = I32 if t == F32 else I64
    mask = (1 << 31) - 1 if t == F32 else (1 << 63) - 1
    return b.bitcast(b.and_(b.bitcast(x, it), ir.Constant(it, mask)), t)


def f16_bits_to_f32(b: ir.IRBuilder, h: ir.Value) -> ir.Value:
    """The f16 value with bit pattern ``h`` (i16) as an exact f32.

    Normal numbers move exponent and mantissa into place (rebias 15 -> 127);
    infinities and NaN get the all-ones exponent with the mantissa shifted
    (NaN is made quiet); a subnormal ``m * 2^-24`` is computed as the exact
    product ``f32(m) * 2^-24`` (``m < 2^10``)."""
    u = b.zext(h, I32)
    sign = b.shl(b.and_(u, _c32(0x8000)), _c32(16))
    mag = b.and_(u, _c32(0x7FFF))
    exp = b.lshr(mag, _c32(10))
    normal = b.add(b.shl(mag, _c32(13)), _c32((127 - 15) << 23))
    special = b.or_(b.add(normal, _c32((128 - 16) << 23)),
                    b.select(b.icmp_unsigned(">", mag, _c32(0x7C00)), _c32(0x0040_0000), _c32(0)))
    sub = b.bitcast(b.fmul(b.uitofp(mag, F32), ir.Constant(F32, 2.0 ** -24)), I32)
    bits = b.select(b.icmp_unsigned("==", exp, _c32(31)), special,
                    b.select(b.icmp_unsigned("==", exp, _c32(0)), sub, normal))
    return b.bitcast(b.or_(bits, sign), F32)


def f32_to_f16_bits(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """The bit pattern (i16) of the f32 value ``x`` rounded once to f16.

    With ``a = |x|`` as bits: NaN (``a > 0x7f800000``) gives ``0x7e00`` with the
    top payload bits; ``a >= 2^16`` (including +inf) gives inf (every finite
    value from 65520 up rounds to inf, which the normal path produces by the
    carry out of the mantissa); below ``2^-14`` the result is subnormal and the
    correctly rounded addition ``a + 1/2`` (whose ulp is ``2^-24``, the f16
    subnormal spacing) rounds it to nearest even, the count of ``2^-24``
    being the low bits of the sum; otherwise the 13 dropped mantissa bits are
    rounded to nearest even by adding ``0xfff`` plus the kept lowest bit, which
    carries into the exponent when the mantissa overflows."""
    u = b.bitcast(x, I32)
    sign = b.trunc(b.lshr(b.and_(u, _c32(0x8000_0000)), _c32(16)), I16)
    a = b.and_(u, _c32(0x7FFF_FFFF))
    nan = b.or_(_c32(0x7E00), b.and_(b.lshr(a, _c32(13)), _c32(0x3FF)))
    inf_or_nan = b.select(b.icmp_unsigned(">", a, _c32(0x7F80_0000)), nan, _c32(0x7C00))
    half = ir.Constant(F32, 0.5)
    sub = b.sub(b.bitcast(b.fadd(b.bitcast(a, F32), half), I32), _c32(0x3F00_0000))
    odd = b.and_(b.lshr(a, _c32(13)), _c32(1))
    norm = b.lshr(b.add(b.add(a, _c32(((15 - 127) << 23) + 0xFFF)), odd), _c32(13))
    r = b.select(b.icmp_unsigned(">=", a, _c32((127 + 16) << 23)), inf_or_nan,
                 b.select(b.icmp_unsigned("<", a, _c32(113 << 23)), sub, norm))
    return b.or_(b.trunc(r, I16), sign)


def f32_to_bf16_bits(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """The bit pattern (i16, lane-wise for a vector) of the f32 value ``v``
    rounded once to bf16: add ``0x7fff`` plus the kept lowest bit and drop 16
    bits (the carry handles mantissa overflow and overflow to inf); NaN keeps
    its top bits and is made quiet."""
    u = b.bitcast(v, like(v, I32))
    lsb = b.and_(b.lshr(u, const_of(u, 16)), const_of(u, 1))
    r = b.lshr(b.add(u, b.add(const_of(u, 0x7FFF), lsb)), const_of(u, 16))
    nan = b.fcmp_unordered("uno", v, v)
    q = b.or_(b.lshr(u, const_of(u, 16)), const_of(u, 0x40))
    return b.trunc(b.select(nan, q, r), like(v, I16))


def bf16_bits_to_f32(b: ir.IRBuilder, h: ir.Value) -> ir.Value:
    """The bf16 value with bit pattern ``h`` (i16, or a vector of them) as an
    exact f32 (the top half)."""
    u = b.zext(h, like(h, I32))
    return b.bitcast(b.shl(u, const_of(u, 16)), like(h, F32))


def f64_to_f32_odd(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """The f64 ``v`` rounded to odd at f32: the nearest-even f32 ``y`` when it is
    exact, infinite or NaN, else the neighbour of ``v`` toward zero with its
    last bit set (``y`` itself when ``y``'s last bit is already 1 and it lies
    toward zero). Rounding that to nearest even at any precision of at most 22
    bits equals rounding ``v`` once; f32's range covers the f16 and bf16
    ranges, so no midpoint is lost to f32 underflow or overflow either."""
    y = b.fptrunc(v, F32)
    ybits = b.bitcast(y, I32)
    back = b.fpext(y, F64)
    finite = b.fcmp_ordered("<", _fabs(b, y), ir.Constant(F32, math.inf))
    inexact = b.and_(b.fcmp_ordered("!=", back, v), finite)
    away = b.fcmp_ordered(">", _fabs(b, back), _fabs(b, v))
    tz = b.select(away, b.sub(ybits, _c32(1)), ybits)
    return b.bitcast(b.select(inexact, b.or_(tz, _c32(1)), ybits), F32)


def f64_to_f16_bits(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """The bit pattern of the f64 ``v`` rounded once to f16."""
    return f32_to_f16_bits(b, f64_to_f32_odd(b, v))


def f64_to_bf16_bits(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """The bit pattern of the f64 ``v`` rounded once to bf16."""
    return f32_to_bf16_bits(b, f64_to_f32_odd(b, v))


# -- FP8 ------------------------------------------------------------------------------------
#: per FP8 format: fraction bits, exponent bias, the code of the largest finite
#: value, of NaN, and of +infinity (None: the format has none)
FP8 = {"f8e4m3fn": (3, 7, 0x7E, 0x7F, None), "f8e5m2": (2, 15, 0x7B, 0x7E, 0x7C)}
I8 = ir.IntType(8)


def fp8_bits_to_f32(b: ir.IRBuilder, h: ir.Value, fmt: str) -> ir.Value:
    """The FP8 value with bit pattern ``h`` (``i8``, or a vector of them) as
    an exact f32: exponent and fraction moved into place (rebias to 127), a
    subnormal ``m * 2^(1-bias-F)`` as an exact product, and the specials:
    f8e4m3fn's one NaN pattern per sign (``S.1111.111``), f8e5m2's
    infinities and NaNs (made quiet) as in IEEE."""
    frac, bias, _top, _nan, inf_code = FP8[fmt]
    u = b.zext(h, like(h, I32))
    sign = b.shl(b.and_(u, const_of(u, 0x80)), const_of(u, 24))
    e = b.and_(b.lshr(u, const_of(u, frac)), const_of(u, (1 << (7 - frac)) - 1))
    m = b.and_(u, const_of(u, (1 << frac) - 1))
    normal = b.or_(b.shl(b.add(e, const_of(u, 127 - bias)), const_of(u, 23)),
                   b.shl(m, const_of(u, 23 - frac)))
    mf = b.uitofp(m, like(h, F32))
    sub = b.fmul(mf, const_of(mf, 2.0 ** (1 - bias - frac)))
    mag = b.select(b.icmp_unsigned("==", e, const_of(u, 0)), b.bitcast(sub, u.type), normal)
    if inf_code is None:  # e4m3fn
        special = b.icmp_unsigned("==", b.and_(u, const_of(u, 0x7F)), const_of(u, 0x7F))
        mag = b.select(special, const_of(u, 0x7FC00000), mag)
    else:  # e5m2: the all-ones exponent
        special = b.icmp_unsigned("==", e, const_of(u, (1 << (7 - frac)) - 1))
        nonfinite = b.select(b.icmp_unsigned("==", m, const_of(u, 0)),
                             const_of(u, 0x7F800000), const_of(u, 0x7FC00000))
        mag = b.select(special, nonfinite, mag)
    return b.bitcast(b.or_(mag, sign), like(h, F32))


def f32_to_fp8_bits(b: ir.IRBuilder, v: ir.Value, fmt: str, overflow: str) -> ir.Value:
    """The bit pattern (``i8``, lane-wise for a vector) of the f32 value ``v``
    rounded once to nearest even into the FP8 format ``fmt``
    (``numerics.cast``): a normal result adds half an ulp minus one plus the
    kept lowest bit and drops the low fraction bits (the carry handles
    fraction overflow), then rebiases; a subnormal one (below the least
    normal value) is ``|v| * 2^(bias-1+F)`` rounded to an integer by adding
    ``2^23`` (one f32 rounding, exact otherwise; 2^F, the carry, is the least
    normal code). A code beyond the largest finite one (and +-inf) becomes
    the largest finite code with ``overflow = 'saturate'``, the format's
    infinity, or its NaN where it has none, with ``'nonfinite'``; NaN stays
    NaN. The sign is kept throughout."""
    if overflow not in ("saturate", "nonfinite"):
        raise ValueError(f"internal: a cast into {fmt} without an overflow policy")
    frac, bias, top, nan_code, inf_code = FP8[fmt]
    u = b.bitcast(v, like(v, I32))
    a = b.and_(u, const_of(u, 0x7FFFFFFF))
    sign = b.trunc(b.and_(b.lshr(u, const_of(u, 24)), const_of(u, 0x80)), like(v, I8))
    sh = 23 - frac
    lsb = b.and_(b.lshr(a, const_of(u, sh)), const_of(u, 1))
    r = b.add(a, b.add(const_of(u, (1 << (sh - 1)) - 1), lsb))
    normal = b.sub(b.lshr(r, const_of(u, sh)), const_of(u, (127 - bias) << frac))
    mag = b.bitcast(a, v.type)  # |v|
    t = b.fadd(b.fmul(mag, const_of(v, 2.0 ** (bias - 1 + frac))), const_of(v, 2.0 ** 23))
    sub = b.sub(b.bitcast(t, u.type), const_of(u, 0x4B000000))
    small = b.icmp_unsigned("<", a, const_of(u, (128 - bias) << 23))  # below 2^(1 - bias)
    code = b.select(small, sub, normal)
    over_code = top if overflow == "saturate" else nan_code if inf_code is None else inf_code
    code = b.select(b.icmp_signed(">", code, const_of(u, top)), const_of(u, over_code), code)
    code = b.select(b.icmp_unsigned(">", a, const_of(u, 0x7F800000)), const_of(u, nan_code), code)
    return b.or_(b.trunc(code, like(v, I8)), sign)


HELPERS = {
    "__extendhfsf2": (F32, F16, lambda b, x: f16_bits_to_f32(b, b.bitcast(x, I16))),
    "__extendhfdf2": (F64, F16, lambda b, x: b.fpext(f16_bits_to_f32(b, b.bitcast(x, I16)), F64)),
    "__truncsfhf2": (F16, F32, lambda b, x: b.bitcast(f32_to_f16_bits(b, x), F16)),
    "__truncdfhf2": (F16, F64, lambda b, x: b.bitcast(f64_to_f16_bits(b, x), F16)),
}


def helper_module(triple: str) -> str:
    """LLVM assembly defining every helper of :data:`HELPERS` (external linkage,
    so the JIT can bind their addresses)."""
    m = ir.Module(name="tilenest.softfloat")
    m.triple = triple
    for name, (ret, arg, body) in HELPERS.items():
        fn = ir.Function(m, ir.FunctionType(ret, [arg]), name=name)
        fn.attributes.add("nounwind")
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        b.ret(body(b, fn.args[0]))
    return str(m)
