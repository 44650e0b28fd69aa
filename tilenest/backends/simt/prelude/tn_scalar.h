// tilenest portable scalar semantics: the meaning of the loop IR's scalar
// operations in the C++14 that CUDA C++ and the Metal Shading Language share.
//
// Every function here is one loop-IR operation as semantics/numerics.py
// defines it (IEEE round-to-nearest per operation, integers wrapping, numpy's
// floor division and modulo, NaN-propagating maximum/minimum), written in
// float and integer arithmetic only: no double, no memcpy, no inline
// assembly, no `if constexpr` and no other C++17, so that one text serves
// every SIMT dialect (a test compiles it with -std=c++14 -pedantic-errors).
// What needs a dialect's own words (64-bit integer types, bit casts, atomics,
// f64, device instructions) stays in the dialect's prelude, which includes
// this header.
//
// The dialect's prelude defines, before including this header:
//   TN_FN              the qualifiers of a prelude function (CUDA: static
//                      __device__ __forceinline__);
//   TN_THREAD          the address space of a thread's own variables, for
//                      reference parameters (CUDA: nothing; MSL: thread);
//   TN_STATUS          the type of the pointer to the launch's status word
//                      (CUDA: int*);
//   tn_i64, tn_u64     the 64-bit integer types;
//   tn_fbits, tn_bitsf a float's bits as an unsigned and back;
//   tn_fail(st, code)  record the launch's first error code in *st;
//   and, where it has f64, the double overloads of tn_isnan, tn_signbit,
//   tn_copysign and tn_quiet: the float templates below (tn_fextreme,
//   tn_ffloordiv, tn_fmod) name them at their definition, where ordinary
//   lookup sees only the overloads declared before it.
//
// The math functions are called by their C++ overloaded names (fma, fabs,
// fmin, fmax, rint, floor, fmod): CUDA and MSL both overload them for float.
// A dialect that declared only the double versions would compute in double
// and round twice; the static_asserts below refuse that.
//
// 16-bit floats are stored as their bits (tn_f16 / tn_bf16) and computed in
// float: a binary op widens both operands exactly, computes in float (exact
// enough: float has more than 2p+2 bits for p = 11 and 8, so rounding the
// float result once more is the correctly rounded 16-bit result) and rounds
// once to nearest-even.
#ifndef TN_SCALAR_H
#define TN_SCALAR_H

typedef signed char tn_i8;
typedef short tn_i16;
typedef int tn_i32;
typedef unsigned char tn_u8;
typedef unsigned short tn_u16;
typedef unsigned int tn_u32;

struct tn_f16 { unsigned short bits; };
struct tn_bf16 { unsigned short bits; };

static_assert(sizeof(tn_i64) == 8 && sizeof(tn_u64) == 8, "tn_i64 and tn_u64 are 64-bit");
static_assert(sizeof(fma(1.0f, 1.0f, 1.0f)) == 4 && sizeof(fmod(1.0f, 1.0f)) == 4 &&
                  sizeof(rint(1.0f)) == 4 && sizeof(floor(1.0f)) == 4 &&
                  sizeof(fabs(1.0f)) == 4 && sizeof(fmin(1.0f, 1.0f)) == 4 &&
                  sizeof(fmax(1.0f, 1.0f)) == 4,
              "the float overloads of the math functions must be declared");

// ---------------------------------------------------------------------------
// bits

TN_FN bool tn_isnan(float x) { return x != x; }
TN_FN bool tn_signbit(float x) { return (tn_fbits(x) >> 31) != 0; }
TN_FN float tn_copysign(float m, float s) { return tn_bitsf((tn_fbits(m) & 0x7fffffffu) | (tn_fbits(s) & 0x80000000u)); }
TN_FN bool tn_isinf(float x) { return (tn_fbits(x) & 0x7fffffffu) == 0x7f800000u; }
TN_FN bool tn_isfinite(float x) { return (tn_fbits(x) & 0x7f800000u) != 0x7f800000u; }

// a select whose arms are both evaluated (a function's arguments are)
template <typename T> TN_FN T tn_select(bool c, T a, T b) { return c ? a : b; }

// ---------------------------------------------------------------------------
// 16-bit floats (software conversions; a dialect may have instructions)

TN_FN float tn_widen(tn_bf16 x) { return tn_bitsf((unsigned)x.bits << 16); }

// an f16 widened exactly, subnormals included
TN_FN float tn_widen_f16_soft(tn_f16 h) {
  unsigned s = (unsigned)(h.bits & 0x8000u) << 16, e = (h.bits >> 10) & 0x1f, m = h.bits & 0x3ffu;
  if (e == 0x1f) return tn_bitsf(s | 0x7f800000u | (m << 13));
  if (e != 0) return tn_bitsf(s | ((e + 112u) << 23) | (m << 13));
  // subnormal or zero: m * 2^-24, exact in float
  float v = (float)m * 5.9604644775390625e-08f;
  return tn_bitsf(s | tn_fbits(v));
}

TN_FN tn_bf16 tn_to_bf16(float x) {
  unsigned b = tn_fbits(x);
  tn_bf16 r;
  if (tn_isnan(x)) { r.bits = (unsigned short)((b >> 16) | 0x40u); return r; }
  unsigned lsb = (b >> 16) & 1u;
  r.bits = (unsigned short)((b + 0x7fffu + lsb) >> 16);
  return r;
}

TN_FN tn_f16 tn_to_f16(float x) {
  unsigned b = tn_fbits(x), s = (b >> 16) & 0x8000u, a = b & 0x7fffffffu;
  tn_f16 r;
  if (a > 0x7f800000u) { r.bits = (unsigned short)(s | 0x7e00u | ((a >> 13) & 0x3ffu)); return r; }
  if (a >= 0x477ff000u) { r.bits = (unsigned short)(s | 0x7c00u); return r; }  // rounds to inf
  if (a >= 0x38800000u) {  // normal half
    unsigned m = a + 0xfffu + ((a >> 13) & 1u) - (112u << 23);
    r.bits = (unsigned short)(s | (m >> 13));
    return r;
  }
  // subnormal half (or zero): round |x| * 2^24 to an integer, nearest-even
  float v = tn_bitsf(a) * 16777216.0f;  // exact: a power-of-two scale
  float f = (float)(unsigned)v;
  float d = v - f;
  unsigned q = (unsigned)f;
  if (d > 0.5f || (d == 0.5f && (q & 1u))) q += 1u;
  r.bits = (unsigned short)(s | q);
  return r;
}

// ---------------------------------------------------------------------------
// FP8 storage formats (spec/values.md V-24): stored as their bits, widened
// exactly to float, reached by casts alone: one rounding to nearest even
// from a float that holds the value exactly or rounded to odd, then the
// cast's overflow policy (saturate: the largest finite value of the sign;
// nonfinite: the format's infinity, or NaN in e4m3fn, which has none).

struct tn_f8e4m3fn { unsigned char bits; };
struct tn_f8e5m2 { unsigned char bits; };

TN_FN tn_f8e4m3fn tn_mk_f8e4m3fn(int b) { tn_f8e4m3fn r; r.bits = (unsigned char)b; return r; }
TN_FN tn_f8e5m2 tn_mk_f8e5m2(int b) { tn_f8e5m2 r; r.bits = (unsigned char)b; return r; }

// Widening: a code's value bits placed at the top of a float's exponent and
// fraction fields read as the code's value times 2^(b - 127) (b: the format's
// exponent bias; a subnormal code lands on a float subnormal), so one exact
// multiply by 2^(127 - b) gives the value; then the sign, and the codes of
// the format's top exponent (e5m2: infinities and NaNs; e4m3fn: only
// S.1111.111, NaN) are made directly, every NaN as the quiet float NaN of
// its sign (V-24).
TN_FN float tn_widen(tn_f8e5m2 x) {
  unsigned v = x.bits & 0x7fu, s = (unsigned)(x.bits & 0x80u) << 24;
  float f = tn_bitsf(v << 21) * tn_bitsf(0x77800000u);  // 2^112
  return tn_bitsf(s | (v > 0x7cu ? 0x7fc00000u : v == 0x7cu ? 0x7f800000u : tn_fbits(f)));
}

TN_FN float tn_widen(tn_f8e4m3fn x) {
  unsigned v = x.bits & 0x7fu, s = (unsigned)(x.bits & 0x80u) << 24;
  float f = tn_bitsf(v << 20) * tn_bitsf(0x7b800000u);  // 2^120
  return tn_bitsf(s | (v == 0x7fu ? 0x7fc00000u : tn_fbits(f)));
}

// The narrowing conversions in software; a dialect whose device rounds into
// FP8 by instruction defines TN_FP8_NARROWING and its own
// tn_narrow_<format>_<policy> with the same results.
#ifndef TN_FP8_NARROWING

// |x| rounded once to nearest even into a format of f fraction bits and
// exponent bias b, as its code before the overflow test: a normal result adds
// half an ulp minus one plus the kept lowest bit and drops the low bits (the
// carry handles fraction overflow), then rebiases; below the least normal
// value, |x| 2^(b-1+f) is rounded to an integer by adding 2^23 (the product is
// exact, so a contracted fma gives the same)
TN_FN unsigned tn_fp8_code(float x, unsigned f, unsigned b) {
  unsigned a = tn_fbits(x) & 0x7fffffffu, sh = 23u - f;
  if (a < ((128u - b) << 23)) {
    float t = tn_bitsf(a) * (float)(1u << (b - 1u + f)) + 8388608.0f;
    return tn_fbits(t) - 0x4b000000u;
  }
  return ((a + ((1u << (sh - 1u)) - 1u) + ((a >> sh) & 1u)) >> sh) - ((127u - b) << f);
}

TN_FN unsigned char tn_fp8_bits(float x, unsigned f, unsigned b, unsigned top,
                                unsigned over, unsigned nan) {
  unsigned u = tn_fbits(x), s = (u >> 24) & 0x80u;
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned char)(s | nan);
  unsigned c = tn_fp8_code(x, f, b);
  return (unsigned char)(s | (c > top ? over : c));
}

TN_FN tn_f8e4m3fn tn_narrow_f8e4m3fn_saturate(float x) {
  tn_f8e4m3fn r; r.bits = tn_fp8_bits(x, 3u, 7u, 0x7eu, 0x7eu, 0x7fu); return r;
}
TN_FN tn_f8e4m3fn tn_narrow_f8e4m3fn_nonfinite(float x) {
  tn_f8e4m3fn r; r.bits = tn_fp8_bits(x, 3u, 7u, 0x7eu, 0x7fu, 0x7fu); return r;
}
TN_FN tn_f8e5m2 tn_narrow_f8e5m2_saturate(float x) {
  tn_f8e5m2 r; r.bits = tn_fp8_bits(x, 2u, 15u, 0x7bu, 0x7bu, 0x7eu); return r;
}
TN_FN tn_f8e5m2 tn_narrow_f8e5m2_nonfinite(float x) {
  tn_f8e5m2 r; r.bits = tn_fp8_bits(x, 2u, 15u, 0x7bu, 0x7cu, 0x7eu); return r;
}
#endif  // TN_FP8_NARROWING

// ---------------------------------------------------------------------------
// integer arithmetic (wrapping, as two's complement)

template <typename T> struct tn_unsigned_of { typedef T type; };
template <> struct tn_unsigned_of<signed char> { typedef unsigned char type; };
template <> struct tn_unsigned_of<short> { typedef unsigned short type; };
template <> struct tn_unsigned_of<int> { typedef unsigned int type; };
template <> struct tn_unsigned_of<tn_i64> { typedef tn_u64 type; };

template <typename T> TN_FN T tn_iadd(T a, T b) {
  typedef typename tn_unsigned_of<T>::type U; return (T)(U)((U)a + (U)b);
}
template <typename T> TN_FN T tn_isub(T a, T b) {
  typedef typename tn_unsigned_of<T>::type U; return (T)(U)((U)a - (U)b);
}
template <typename T> TN_FN T tn_imul(T a, T b) {
  typedef typename tn_unsigned_of<T>::type U;
  return (T)(U)((tn_u64)(U)a * (tn_u64)(U)b);
}
template <typename T> TN_FN T tn_ineg(T a) { return tn_isub<T>((T)0, a); }
template <typename T> TN_FN T tn_iabs(T a) { return a < (T)0 ? tn_ineg<T>(a) : a; }

// error codes of the status word (the first error of a launch wins: tn_fail)
#define TN_DIV_ZERO 1000001
#define TN_NEG_SHIFT 1000002

template <typename T> TN_FN T tn_idiv(T a, T b, TN_STATUS st) {  // C division (toward zero)
  if (b == (T)0) { tn_fail(st, TN_DIV_ZERO); return (T)0; }
  if ((T)-1 < (T)0 && b == (T)-1) return tn_ineg<T>(a);
  return (T)(a / b);
}
template <typename T> TN_FN T tn_irem(T a, T b, TN_STATUS st) {
  if (b == (T)0) { tn_fail(st, TN_DIV_ZERO); return (T)0; }
  if ((T)-1 < (T)0 && b == (T)-1) return (T)0;
  return (T)(a % b);
}
template <typename T> TN_FN T tn_ifloordiv(T a, T b, TN_STATUS st) {  // Python's //
  if (b == (T)0) { tn_fail(st, TN_DIV_ZERO); return (T)0; }
  if ((T)-1 < (T)0 && b == (T)-1) return tn_ineg<T>(a);
  T q = (T)(a / b), r = (T)(a % b);
  if (r != (T)0 && ((r < (T)0) != (b < (T)0))) q = (T)(q - 1);
  return q;
}
template <typename T> TN_FN T tn_imod(T a, T b, TN_STATUS st) {  // Python's %
  if (b == (T)0) { tn_fail(st, TN_DIV_ZERO); return (T)0; }
  if ((T)-1 < (T)0 && b == (T)-1) return (T)0;
  T r = (T)(a % b);
  if (r != (T)0 && ((r < (T)0) != (b < (T)0))) r = (T)(r + b);
  return r;
}
template <typename T> TN_FN T tn_ishl(T a, T b, TN_STATUS st) {
  if ((T)-1 < (T)0 && b < (T)0) { tn_fail(st, TN_NEG_SHIFT); return (T)0; }
  typedef typename tn_unsigned_of<T>::type U;
  if ((tn_u64)b >= sizeof(T) * 8) return (T)0;
  return (T)(U)((U)a << (int)b);
}
template <typename T> TN_FN T tn_ishr(T a, T b, TN_STATUS st) {
  if ((T)-1 < (T)0 && b < (T)0) { tn_fail(st, TN_NEG_SHIFT); return (T)0; }
  if ((tn_u64)b >= sizeof(T) * 8) return (T)-1 < (T)0 ? (T)(a < (T)0 ? -1 : 0) : (T)0;
  return (T)(a >> (int)b);
}
template <typename T> TN_FN T tn_imax(T a, T b) { return a > b ? a : b; }
template <typename T> TN_FN T tn_imin(T a, T b) { return a < b ? a : b; }

// index arithmetic: Python floor division and modulo on 64-bit values
// x clamped to [lo, max(lo, hi)]
TN_FN tn_i64 tn_clamp(tn_i64 x, tn_i64 lo, tn_i64 hi) {
  return x < lo ? lo : (x > hi ? (hi > lo ? hi : lo) : x);
}
TN_FN tn_i64 tn_xfloordiv(tn_i64 a, tn_i64 b) {
  if (b == 0) return 0;
  if (b == -1) return -a;
  tn_i64 q = a / b, r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? q - 1 : q;
}
TN_FN tn_i64 tn_xmod(tn_i64 a, tn_i64 b) {
  if (b == 0 || b == -1) return 0;
  tn_i64 r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
TN_FN tn_i64 tn_xmin(tn_i64 a, tn_i64 b) { return a < b ? a : b; }
TN_FN tn_i64 tn_xmax(tn_i64 a, tn_i64 b) { return a > b ? a : b; }
// the same in 32 bits, for code whose index values are proved to fit an int
// (the index.width obligation); the overloads are chosen by the operands' type
TN_FN int tn_clamp(int x, int lo, int hi) {
  return x < lo ? lo : (x > hi ? (hi > lo ? hi : lo) : x);
}
TN_FN int tn_xfloordiv(int a, int b) {
  if (b == 0) return 0;
  if (b == -1) return -a;
  int q = a / b, r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? q - 1 : q;
}
TN_FN int tn_xmod(int a, int b) {
  if (b == 0 || b == -1) return 0;
  int r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
TN_FN int tn_xmin(int a, int b) { return a < b ? a : b; }
TN_FN int tn_xmax(int a, int b) { return a > b ? a : b; }

TN_FN tn_i64 tn_align16(tn_i64 n) { return (n + 15) / 16 * 16; }

// ---------------------------------------------------------------------------
// float arithmetic (the wide type: float for f16/bf16/f32; a dialect with f64
// instantiates the templates for double too)

// x with its quiet bit set (x a NaN)
TN_FN float tn_quiet(float x) { return tn_bitsf(tn_fbits(x) | 0x00400000u); }

// numpy's maximum / minimum: NaN propagates (the first NaN operand, quieted);
// equal operands differ at most in a zero's sign: max takes +0, min -0
template <typename F> TN_FN F tn_fextreme(F a, F b, bool is_max) {
  if (tn_isnan(a)) return tn_quiet(a);
  if (tn_isnan(b)) return tn_quiet(b);
  bool pick_a = is_max ? (a > b) : (a < b);
  if (a == b) pick_a = tn_signbit(a) != is_max;
  return pick_a ? a : b;
}

// numpy's floor_divide / remainder on floats (npy_divmod)
template <typename F> TN_FN F tn_ffloordiv(F a, F d) {
  F mod = fmod(a, d);
  if (d == (F)0) return a / d;
  F div = (a - mod) / d;
  if (mod != (F)0 && ((d < (F)0) != (mod < (F)0))) div = div - (F)1;
  if (div != (F)0) {
    F fl = floor(div);
    if (div - fl > (F)0.5) fl = fl + (F)1;
    return fl;
  }
  return tn_copysign((F)0, a / d);
}
template <typename F> TN_FN F tn_fmod(F a, F d) {
  F mod = fmod(a, d);
  if (d == (F)0) return mod;
  if (mod != (F)0) {
    if ((d < (F)0) != (mod < (F)0)) mod = mod + d;
    return mod;
  }
  return tn_copysign((F)0, d);
}
TN_FN float tn_frem(float a, float b) { return fmod(a, b); }

// IEEE division by a divisor shared by many dividends (a row's sum, say).
// tn_fdiv_prep computes, once, y = RN(1/b) and the range of |a| for which
//   q0 = RN(a y), r = fma(-b, q0, a), q = fma(r, y, q0)
// is RN(a / b); tn_fdiv_by uses it, and a / b outside that range.
// Why: scaled to a, b in [1, 2) (a = A 2^ea, b = B 2^eb), every step is the
// same computation on A and B times a power of two as long as nothing leaves
// the normal range: y needs eb <= 125; q0 and q, near 2^(ea - eb), need
// ea - eb in [-125, 126]; r, zero or a nonzero multiple of 2^(ea - 47),
// needs ea >= -79 to be zero or normal. On A and B the formula was compared
// with IEEE division for all 2^23 x 2^23 significand pairs on an H200
// (identical; spec/lowering.md L-6). Zeros, NaNs, infinities and subnormals of either
// operand fall outside the range (lo = +inf for such a b).
struct tn_fdivisor { float b, y, lo, hi; };
TN_FN tn_fdivisor tn_fdiv_prep(float b) {
  int e = (int)((tn_fbits(b) >> 23) & 0xffu) - 127;  // b's exponent when normal
  if (e < -126 || e > 125) return {b, 0.0f, tn_bitsf(0x7f800000u), 0.0f};
  int lo = e - 125 > -79 ? e - 125 : -79;              // lo <= ea
  int hi = e + 127 < 128 ? e + 127 : 128;              // ea < hi
  return {b, 1.0f / b, tn_bitsf((unsigned)(lo + 127) << 23),
          hi == 128 ? tn_bitsf(0x7f800000u) : tn_bitsf((unsigned)(hi + 127) << 23)};
}
// the short form, right when tn_fdiv_in(a, d)
TN_FN float tn_fdiv_short(float a, tn_fdivisor d) {
  float q0 = a * d.y;
  return fma(fma(-d.b, q0, a), d.y, q0);
}
TN_FN bool tn_fdiv_in(float a, tn_fdivisor d) {
  float m = fabs(a);
  return m >= d.lo && m < d.hi;
}
TN_FN float tn_fdiv_by(float a, tn_fdivisor d) {
  return tn_fdiv_in(a, d) ? tn_fdiv_short(a, d) : a / d.b;
}

TN_FN float tn_roundeven(float x) { return rint(x); }

// e^x in float arithmetic, below 1 ulp: the LLVM backend's exp_f32 (see
// backends/llvm/mathlib.py for the error analysis), step for step, so the two
// targets agree bitwise. Reduction x = k ln2 + r with a 16-bit head of ln2
// (exact with one fma) and the tail's rounding error recovered by a second
// fma; e^r - 1 = r + (d + r^2 q(r)), q of degree 4; one final rounding of
// (1 + t) 2^k by fma, subnormal results included. The constants are floats
// written in decimal (C++14 has no hexadecimal float literal), each the
// shortest decimal that reads back as that float; its exact value in the
// comment.
// the polynomial part of tn_exp_f32: t with e^x ~ (1 + t) 2^k, for the
// reduction x = k ln2 + r of x at k = rint(x / ln2) (k given as a float)
TN_FN float tn_exp_f32_t(float x, float k) {
  float nk = -k;
  float r1 = fma(nk, 6.9314575e-01f, x);    // 0x1.62e4p-1
  float r = fma(nk, 1.4286068e-06f, r1);    // 0x1.7f7d1cp-20
  float d = fma(nk, 1.4286068e-06f, r1 - r);
  float q = 1.3814529e-03f;                 // 0x1.6a23bcp-10
  q = fma(q, r, 8.36875e-03f);              // 0x1.123a2ap-7
  q = fma(q, r, 4.1668393e-02f);            // 0x1.5558f4p-5
  q = fma(q, r, 1.666652e-01f);             // 0x1.55549p-3
  q = fma(q, r, 4.9999994e-01f);            // 0x1.fffffcp-2
  return r + fma(r * r, q, d);
}
// k = rint(x log2e), the exact product of x and the float log2e rounded to an
// integer (ties to even) by one fma with the shift 1.5 * 2^23 (right for
// |x log2e| < 2^22); the sum's bits are 0x4b400000 + k.
TN_FN float tn_exp_f32_shifted(float x) {
  return fma(x, 1.442695e+00f, 12582912.0f);  // 0x1.715476p+0, 0x1.8p23
}
// tn_exp_f32's common case, |x| <= 87 (tn_exp_f32_in; the caller tests it): no clamp
// applies, x is not NaN and 2^k is a normal power of two (|k| <= 126). The
// shifted sum's bits moved left by 23 are k << 23 mod 2^32, the exponent field
// of 2^k less the bias: no conversion instruction.
TN_FN bool tn_exp_f32_in(float x) { return fabs(x) <= 87.0f; }
TN_FN float tn_exp_f32_near(float x) {
  float s = tn_exp_f32_shifted(x);
  float k = s - 12582912.0f;
  float sn = tn_bitsf((tn_fbits(s) << 23) + 0x3f800000u);
  return fma(tn_exp_f32_t(x, k), sn, sn);
}
TN_FN float tn_exp_f32(float x) {
  // the common case first (tn_exp_f32_near)
  if (tn_exp_f32_in(x)) return tn_exp_f32_near(x);
  float xc = fmin(fmax(x, -104.0f), 89.0f);
  float k = tn_exp_f32_shifted(xc) - 12582912.0f;
  float t = tn_exp_f32_t(xc, k);
  int ki = (int)k;
  if ((unsigned)(ki + 126) <= 253u) {  // 87 < |x| with 2^k still normal
    float sn = tn_bitsf((unsigned)(ki + 127) << 23);
    return fma(t, sn, sn);
  }
  bool big = ki > 127, tiny = ki < -149;
  int k1 = big ? 127 : (tiny ? -149 : ki);
  if (tiny) t = (t - 1.0f) * 0.5f;
  unsigned bits = k1 < -126 ? (1u << (unsigned)(k1 + 149)) : ((unsigned)(k1 + 127) << 23);
  float sc = tn_bitsf(bits);
  float y = fma(t, sc, sc);
  if (big) y = y * 2.0f;
  return tn_isnan(x) ? x + x : y;
}

// Guarded lane groups (the emitter's Emitter.guarded_lanes): the lanes of a
// group are computed with the common cases alone, each call folding whether
// its input was inside its common case into ok (no branch per lane); when ok
// ends false the group is computed again with the whole functions. Where ok
// stays true every call was inside its common case, where the whole function
// gives the same value: the group's values are the whole functions' either way.
TN_FN float tn_exp_f32_ok(float x, TN_THREAD bool& ok) {
  ok = ok & tn_exp_f32_in(x);
  return tn_exp_f32_near(x);
}
TN_FN float tn_fdiv_by_ok(float a, tn_fdivisor d, TN_THREAD bool& ok) {
  ok = ok & tn_fdiv_in(a, d);
  return tn_fdiv_short(a, d);
}

// the shuffle helpers' conversions of register types to and from an int
TN_FN tn_f16 tn_mk_f16(int b) { tn_f16 r; r.bits = (unsigned short)b; return r; }
TN_FN tn_bf16 tn_mk_bf16(int b) { tn_bf16 r; r.bits = (unsigned short)b; return r; }
TN_FN int tn_get16(tn_f16 v) { return v.bits; }
TN_FN int tn_get16(tn_bf16 v) { return v.bits; }
TN_FN bool tn_mk_bool(int b) { return b != 0; }
TN_FN int tn_getb(bool v) { return v ? 1 : 0; }
TN_FN signed char tn_mk_i8(int b) { return (signed char)b; }
TN_FN unsigned char tn_mk_u8(int b) { return (unsigned char)b; }
TN_FN short tn_mk_i16(int b) { return (short)b; }
TN_FN unsigned short tn_mk_u16(int b) { return (unsigned short)b; }
TN_FN int tn_geti(int v) { return v; }

#endif  // TN_SCALAR_H
