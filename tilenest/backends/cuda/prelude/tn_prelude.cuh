// tilenest CUDA prelude: the scalar semantics of the loop IR in CUDA C++.
//
// Every function here is the meaning of one loop-IR operation as
// semantics/numerics.py defines it (IEEE round-to-nearest per operation,
// integers wrapping, saturating float-to-int casts, numpy's floor division
// and modulo, NaN-propagating maximum/minimum). The float and integer part
// that CUDA shares with the other SIMT dialects is the portable header
// tn_scalar.h (backends/simt/prelude, on the include path beside this
// folder); this file defines what that header asks of a dialect, then adds
// CUDA's own: f64, bit casts, the status word's atomics, warp shuffles,
// vector accesses, tensor cores and asynchronous copies.
//
// The same text compiles for the device (NVRTC, sm_90a) and, with
// TN_EMULATE defined and the emulator's shim header included first, as host
// C++; only the few spots that need a device instruction differ, each behind
// one #ifdef.
#pragma once

typedef long long tn_i64;
typedef unsigned long long tn_u64;

#define TN_FN static __device__ __forceinline__
#define TN_THREAD
#define TN_STATUS int*

// ---------------------------------------------------------------------------
// what the portable header needs: bits, the status word, and the double
// overloads its float templates name (declared before it, see tn_scalar.h)

TN_FN unsigned tn_fbits(float x) { return __float_as_uint(x); }
TN_FN float tn_bitsf(unsigned b) { return __uint_as_float(b); }
TN_FN unsigned long long tn_dbits(double x) { return (unsigned long long)__double_as_longlong(x); }
TN_FN double tn_bitsd(unsigned long long b) { return __longlong_as_double((long long)b); }
TN_FN bool tn_isnan(double x) { return x != x; }
TN_FN bool tn_signbit(double x) { return (tn_dbits(x) >> 63) != 0; }
TN_FN double tn_copysign(double m, double s) {
  return tn_bitsd((tn_dbits(m) & 0x7fffffffffffffffull) | (tn_dbits(s) & 0x8000000000000000ull));
}
TN_FN bool tn_isinf(double x) { return (tn_dbits(x) & 0x7fffffffffffffffull) == 0x7ff0000000000000ull; }
TN_FN bool tn_isfinite(double x) { return (tn_dbits(x) & 0x7ff0000000000000ull) != 0x7ff0000000000000ull; }
TN_FN double tn_quiet(double x) { return tn_bitsd(tn_dbits(x) | 0x0008000000000000ull); }

// the first error of a program wins (0: none yet)
TN_FN void tn_fail(int* status, int code) { atomicCAS(status, 0, code); }

// rounding into FP8 by instruction on devices that have it (sm_89 and
// later); the emulator and older devices take tn_scalar.h's software one
#if !defined(TN_EMULATE) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define TN_FP8_NARROWING 1
#endif

#include "tn_scalar.h"

// ---------------------------------------------------------------------------
// bits

// the bits of one register type read as another of the same width
template <typename D, typename S> TN_FN D tn_bitcast(S s) {
  static_assert(sizeof(D) == sizeof(S), "tn_bitcast between types of different widths");
  D d;
  memcpy(&d, &s, sizeof(D));
  return d;
}

// ---------------------------------------------------------------------------
// 16-bit floats

#ifndef TN_EMULATE
TN_FN float tn_widen(tn_f16 h) {  // exact, subnormals included
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.bits));
  return f;
}
#else
TN_FN float tn_widen(tn_f16 h) { return tn_widen_f16_soft(h); }
#endif

// On the device one conversion instruction each (sm_80 and later): cvt.rn
// rounds to nearest-even exactly as the integer code of tn_to_bf16 /
// tn_to_f16, subnormal results included (no .ftz); a NaN becomes the
// canonical NaN of the format (a NaN's sign and payload are not part of the
// contract, spec/values.md V-14).
#ifdef TN_EMULATE
TN_FN tn_bf16 tn_narrow_bf16(float x) { return tn_to_bf16(x); }
TN_FN tn_f16 tn_narrow_f16(float x) { return tn_to_f16(x); }
#else
TN_FN tn_bf16 tn_narrow_bf16(float x) {
  tn_bf16 r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.bits) : "f"(x));
  return r;
}
TN_FN tn_f16 tn_narrow_f16(float x) {
  tn_f16 r;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.bits) : "f"(x));
  return r;
}
#endif

#ifdef TN_FP8_NARROWING
// FP8 (spec/values.md V-24) by the pair conversions, x in the upper byte and
// 0 in the lower. cvt.rn.satfinite rounds once to nearest even, subnormals
// kept; a NaN becomes V-24's NaN of the format (e4m3fn's one NaN; e5m2's
// quiet S.11111.10, where the instruction gives S.11111.11), to which x's
// sign is given back (V-24 keeps it; for every other value the instruction
// keeps the sign already).
// Only values of at most the tie above the largest finite one reach it: the
// saturate policy first clamps to +-max (a value between max and that tie
// rounds to max anyway; NaN passes, comparing false), the nonfinite policy
// takes the overflow first, so neither depends on how the instruction
// treats an infinity.
TN_FN float tn_fp8_clamp(float x, float top) { return x > top ? top : x < -top ? -top : x; }
TN_FN unsigned tn_fp8_sign(float x) { return (tn_fbits(x) >> 24) & 0x80u; }
TN_FN unsigned tn_cvt_e4m3(float x) {
  unsigned short d;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(d) : "f"(x), "f"(0.0f));
  return ((unsigned)d >> 8) | tn_fp8_sign(x);
}
TN_FN unsigned tn_cvt_e5m2(float x) {
  // (the instruction's NaN is S.11111.11; V-24's is S.11111.10)
  unsigned short d;
  asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(d) : "f"(x), "f"(0.0f));
  return (tn_isnan(x) ? 0x7eu : (unsigned)d >> 8) | tn_fp8_sign(x);
}
// (the sign is taken from x itself: the compiler may build the clamp from
// min/max instructions that hand a NaN on as the canonical, positive one)
TN_FN tn_f8e4m3fn tn_narrow_f8e4m3fn_saturate(float x) {
  return tn_mk_f8e4m3fn((int)(tn_cvt_e4m3(tn_fp8_clamp(x, 448.0f)) | tn_fp8_sign(x)));
}
TN_FN tn_f8e5m2 tn_narrow_f8e5m2_saturate(float x) {
  return tn_mk_f8e5m2((int)(tn_cvt_e5m2(tn_fp8_clamp(x, 57344.0f)) | tn_fp8_sign(x)));
}
// the nonfinite policy: a value rounding past the largest finite one (e4m3fn:
// above 464, the tie that rounds to 448; e5m2: from 61440, the tie that rounds
// up to 2^16) or +-inf becomes NaN (e4m3fn) or +-inf (e5m2); NaN compares
// false and converts as above
TN_FN tn_f8e4m3fn tn_narrow_f8e4m3fn_nonfinite(float x) {
  return tn_mk_f8e4m3fn((int)(fabsf(x) > 464.0f ? tn_fp8_sign(x) | 0x7fu : tn_cvt_e4m3(x)));
}
TN_FN tn_f8e5m2 tn_narrow_f8e5m2_nonfinite(float x) {
  return tn_mk_f8e5m2((int)(fabsf(x) >= 61440.0f ? tn_fp8_sign(x) | 0x7cu : tn_cvt_e5m2(x)));
}
// (Widening stays tn_scalar.h's: on an H200 its integer code dequantized
// 8192^2 e4m3fn codes at 68% of the copy bandwidth, cvt.rn.f16x2.e4m3x2 then
// cvt.f32.f16 at 51%, both conversions being of the slower kind;
// benchmarks/cuda.py --only fp8.)
#endif

// a double rounded to odd at float: rounding that once more to at most 22
// significant bits equals rounding the double once
TN_FN float tn_f64_to_f32_odd(double d) {
  if (tn_isnan(d)) return (float)d;
  float f = (float)d;
  double back = (double)f;
  if (back == d) return f;
  double ad = d < 0 ? -d : d, ab = back < 0 ? -back : back;
  unsigned b = tn_fbits(f);
  if (ab > ad) b -= 1u;  // toward zero (also from inf to FLT_MAX)
  return tn_bitsf(b | 1u);
}

TN_FN float tn_round_f32(double d) { return (float)d; }
TN_FN tn_f16 tn_round_f16(double d) { return tn_to_f16(tn_f64_to_f32_odd(d)); }
TN_FN tn_bf16 tn_round_bf16(double d) { return tn_to_bf16(tn_f64_to_f32_odd(d)); }
TN_FN double tn_round_f64(double d) { return d; }

// ---------------------------------------------------------------------------
// approximations, each called only where the program declared a bound it
// meets (the dialect's approx table, spec/values.md V-14 "Declared bounds");
// that contract measures by distance alone, an infinity standing at 2^128,
// so near the overflow and underflow thresholds they need no special case

#ifndef TN_EMULATE
// 2^a by the special function unit: within 2 ulp of the correctly rounded
// value (PTX ISA), subnormal results kept (no .ftz), 2^-inf = 0, 2^inf = inf
TN_FN float tn_ex2_approx(float a) {
  float y;
  asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(a));
  return y;
}
// the same for a >= 0, where no result is subnormal: the unit alone, without
// the scaling that keeps subnormal results
TN_FN float tn_ex2_approx_ftz(float a) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(a));
  return y;
}
// 1/s by the special function unit, within 1 ulp (PTX ISA); subnormal results
// flushed to 0, so callers take it only where those are below their bound
TN_FN float tn_rcp_approx(float s) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(s));
  return r;
}
// x y rounded toward -inf
TN_FN float tn_fmul_down(float x, float y) {
  float p;
  asm("mul.rm.f32 %0, %1, %2;" : "=f"(p) : "f"(x), "f"(y));
  return p;
}
#else
// the emulator has no such unit: the host's 2^a and 1/s, rounded once
TN_FN float tn_ex2_approx(float a) { return (float)exp2((double)a); }
TN_FN float tn_ex2_approx_ftz(float a) { return (float)exp2((double)a); }
TN_FN float tn_rcp_approx(float s) { return (float)(1.0 / (double)s); }
TN_FN float tn_fmul_down(float x, float y) {
  const double e = (double)x * (double)y;  // exact
  const float p = (float)e;
  return (double)p > e ? nextafterf(p, -INFINITY) : p;
}
#endif
// e^x as 2^a (1 + r ln2): a = x log2e rounded down to a float, r the rest
// of x log2e -- the product's rounding error (exact by one fma, >= 0) plus x
// times the float log2e's own error (of x's sign). |r| < 2^-16 wherever 2^a
// is finite and nonzero, and r >= 0 where 2^a is infinite for a finite x (x > 88), so the
// final fma keeps that infinity; an infinite x gives r = NaN, which fmin
// turns into 2^-16, keeping 2^a's 0 or infinity. The error is 2^a's (2 ulp
// plus its rounding) and the final rounding: within 4 ulp, the bound the
// dialect states; tests/test_approx_exp.py measures it on the device over
// every float input.
TN_FN float tn_exp_f32_approx(float x) {
  const float a = tn_fmul_down(x, 1.442695e+00f);  // 0x1.715476p+0
  float r = fma(x, 1.442695e+00f, -a);
  r = fmin(fma(x, 1.925963e-08f, r), 1.5258789e-05f);  // 0x1.4ae0c0p-26: log2e less
                                                        // 0x1.715476p+0; 2^-16
  const float y = tn_ex2_approx(a);
  return fma(y, r * 6.931472e-01f, y);             // 0x1.62e430p-1, ln2 rounded
}
// e^x as 2^a alone, a = x log2e rounded to nearest: 2^a's error plus that of
// a, |x log2e - a| <= ulp(a)/2 + |x| 2^-25.6, which is up to 2^-18.5 of the
// value's size (about 66 ulp) at |a| in [64, 128); the dialect states 96
TN_FN float tn_exp_f32_coarse(float x) { return tn_ex2_approx(x * 1.442695e+00f); }
// tanh x, odd by construction: tanh |x| with the sign of x copied on (so
// tanh(-0) = -0 and NaN stays NaN). Below 1: |x| + |x|^3 P(x^2), P of degree
// 6 fitted to tanh's relative error on (0, 1] with float coefficients
// (benchmarks/tanh_approx.py --fit), within 0.95 ulp there, where the form
// below would lose the digits that 2/(e + 1) cancels. From 1 on: 1 - 2/(e +
// 1), e = 2^(2 |x| log2e) >= 1 by the special function unit (no subnormal
// result, so .ftz changes nothing) and 1/(e + 1) by rcp.approx, whose flushed
// subnormal results lie where 2/(e + 1) is far below half an ulp of 1: from
// |x| about 9.01 on the result is exactly 1, e = inf included, with no test.
// There a relative error d of e moves the result by d (1 - tanh^2)/2 <= 0.21 d.
// With every ex2 within 2.5 ulp of 2^a and every rcp within one float of the
// rounded 1/s, at most 2.18 ulp over every input (benchmarks/tanh_approx.py);
// the dialect states 3
TN_FN float tn_tanh_approx(float x) {
  const float ax = fabsf(x);
  const float s = ax * ax;
  float p = fma(-3.58630816e-04f, s, 2.30198470e-03f);  // -0x1.780d3ap-12, 0x1.2db9cap-9
  p = fma(p, s, -7.94694945e-03f);                      // -0x1.0467d8p-7
  p = fma(p, s, 2.14872230e-02f);                       // 0x1.600bf2p-6
  p = fma(p, s, -5.38799949e-02f);                      // -0x1.b9628ap-5
  p = fma(p, s, 1.33323476e-01f);                       // 0x1.110be6p-3
  p = fma(p, s, -3.33332956e-01f);                      // -0x1.55553cp-2
  const float small = fma(p, s * ax, ax);
  const float e = tn_ex2_approx_ftz(ax * 2.88539004e+00f);  // 0x1.715476p+1, 2 log2e
  const float big = fma(-2.0f, tn_rcp_approx(e + 1.0f), 1.0f);
  return copysignf(ax < 1.0f ? small : big, x);
}

// ---------------------------------------------------------------------------
// float arithmetic in f64, and CUDA's instructions for the float forms

#ifndef TN_EMULATE
// numpy's maximum / minimum on the device in one instruction: max.NaN /
// min.NaN are IEEE 754-2019 maximum / minimum (+0 above -0; a NaN operand
// gives the canonical NaN, whose sign and payload the contract leaves open)
template <> __device__ __forceinline__ float tn_fextreme<float>(float a, float b, bool is_max) {
  float r;
  if (is_max)
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  else
    asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
#endif

TN_FN double tn_frem(double a, double b) { return fmod(a, b); }
TN_FN double tn_roundeven(double x) { return rint(x); }

// transcendentals: evaluated in double (CUDA's double functions are within
// 2 ulp of double; rounded once to a narrow dtype that is within 1 ulp, and
// within the 4 ulp f64 bound as they are)
TN_FN double tn_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
TN_FN double tn_rsqrt(double x) { return 1.0 / sqrt(x); }

// saturating float -> integer (NaN -> 0), as LLVM's fptosi.sat / fptoui.sat
template <typename T> TN_FN T tn_f2i(double x, double lo, double hi) {
  if (tn_isnan(x)) return (T)0;
  if (x <= lo) return (T)lo;
  if (x >= hi) return (T)hi;
  return (T)x;
}
TN_FN long long tn_f2i64(double x) {
  if (tn_isnan(x)) return 0;
  if (x <= -9223372036854775808.0) return (long long)0x8000000000000000ull;
  if (x >= 9223372036854775808.0) return 0x7fffffffffffffffll;
  return (long long)x;
}
TN_FN unsigned long long tn_f2u64(double x) {
  if (tn_isnan(x) || x <= 0.0) return 0;
  if (x >= 18446744073709551616.0) return 0xffffffffffffffffull;
  return (unsigned long long)x;
}

// a 64-bit integer rounded to odd at double (then once more to a narrow type)
TN_FN double tn_i64_to_f64_odd(unsigned long long m, bool neg) {
  double big = (double)(m >> 32) * 4294967296.0;
  double lo = (double)(m & 0xffffffffull);
  double y = big + lo;
  double err = lo - (y - big);
  unsigned long long yb = tn_dbits(y);
  if (err != 0.0) yb = (err < 0.0 ? yb - 1 : yb) | 1ull;
  y = tn_bitsd(yb);
  return neg ? -y : y;
}

// ---------------------------------------------------------------------------
// warp collectives on every register type (16-bit floats as their bits)

#define TN_SHFL(T)                                                                            \
  TN_FN T tn_shfl_idx(unsigned m, T v, int l, int w) { return __shfl_sync(m, v, l, w); }      \
  TN_FN T tn_shfl_xor(unsigned m, T v, int l, int w) { return __shfl_xor_sync(m, v, l, w); }  \
  TN_FN T tn_shfl_up(unsigned m, T v, int l, int w) { return __shfl_up_sync(m, v, (unsigned)l, w); } \
  TN_FN T tn_shfl_down(unsigned m, T v, int l, int w) { return __shfl_down_sync(m, v, (unsigned)l, w); }
TN_SHFL(int)
TN_SHFL(unsigned)
TN_SHFL(long long)
TN_SHFL(unsigned long long)
TN_SHFL(float)
TN_SHFL(double)
#undef TN_SHFL
#define TN_SHFL_VIA(T, U, GET, PUT)                                                           \
  TN_FN T tn_shfl_idx(unsigned m, T v, int l, int w) { return PUT(tn_shfl_idx(m, (U)GET(v), l, w)); } \
  TN_FN T tn_shfl_xor(unsigned m, T v, int l, int w) { return PUT(tn_shfl_xor(m, (U)GET(v), l, w)); } \
  TN_FN T tn_shfl_up(unsigned m, T v, int l, int w) { return PUT(tn_shfl_up(m, (U)GET(v), l, w)); }   \
  TN_FN T tn_shfl_down(unsigned m, T v, int l, int w) { return PUT(tn_shfl_down(m, (U)GET(v), l, w)); }
TN_SHFL_VIA(tn_f16, int, tn_get16, tn_mk_f16)
TN_SHFL_VIA(tn_bf16, int, tn_get16, tn_mk_bf16)
TN_SHFL_VIA(bool, int, tn_getb, tn_mk_bool)
TN_SHFL_VIA(signed char, int, tn_geti, tn_mk_i8)
TN_SHFL_VIA(unsigned char, int, tn_geti, tn_mk_u8)
TN_SHFL_VIA(short, int, tn_geti, tn_mk_i16)
TN_SHFL_VIA(unsigned short, int, tn_geti, tn_mk_u16)
#undef TN_SHFL_VIA

// ---------------------------------------------------------------------------
// vector accesses: V consecutive elements at an address aligned to their
// total size (4, 8 or 16 bytes), as one load or store instruction

template <typename T, int V> struct tn_pack { T e[V]; };

// lane i of a pack of 16-bit floats, read from the 32-bit word that holds it
// (lane 2j in the low half of word j, 2j + 1 in the high half), for widening
// only: a bf16 lane is then one mask or one shift of that word, where
// widening the lane as a 16-bit value first extracts it (two instructions)
template <typename T> struct tn_lane16 {
  unsigned w;
  bool hi;
};
template <typename T, int V> TN_FN tn_lane16<T> tn_lane(const tn_pack<T, V>& p, int i) {
  static_assert(sizeof(T) == 2 && V % 2 == 0, "tn_lane reads pairs of 16-bit lanes");
  unsigned w;
  memcpy(&w, &p.e[i & ~1], 4);
  return {w, (i & 1) != 0};
}
TN_FN float tn_widen(tn_lane16<tn_bf16> x) {
  return tn_bitsf(x.hi ? (x.w & 0xffff0000u) : (x.w << 16));
}
TN_FN float tn_widen(tn_lane16<tn_f16> x) {
  return tn_widen(tn_f16{(unsigned short)(x.hi ? x.w >> 16 : x.w & 0xffffu)});
}

TN_FN bool tn_aligned(const void* p, unsigned long long bytes) {
  return ((unsigned long long)p & (bytes - 1)) == 0;
}
// whether x is a multiple of m > 0 (for either sign of x)
TN_FN bool tn_multiple(long long x, long long m) { return x % m == 0; }

// the alignment the instructions of a B-byte vector access need (0: it is
// done element by element): a GPU faults ("misaligned address") below it
template <int B> struct tn_valign {
  static constexpr unsigned long long value = B == 32 ? 16 : (B == 16 || B == 8 || B == 4) ? B : 0;
};

// ---------------------------------------------------------------------------
// tensor cores: ldmatrix.x4 (four 8x8 b16 matrices from shared memory, one
// row address per lane; _t: transposed) and mma.sync m16n8k16 row.col with
// f32 accumulation in place (d += a * b), m16n8k32 for FP8 operands. The emulator runs them as warp
// collectives by the PTX fragment layouts (tn_cuda_shim.h).
#ifdef TN_EMULATE
#define tn_ldsm_x4(r, p) tn_emu::ldsm_at(__LINE__, (r), (p), false)
#define tn_ldsm_x4_t(r, p) tn_emu::ldsm_at(__LINE__, (r), (p), true)
#define tn_mma_bf16(d, a, b) tn_emu::mma_at(__LINE__, true, (d), (a), (b))
#define tn_mma_f16(d, a, b) tn_emu::mma_at(__LINE__, false, (d), (a), (b))
#define tn_mma_e4m3_e4m3(d, a, b) tn_emu::mma8_at(__LINE__, false, false, (d), (a), (b))
#define tn_mma_e4m3_e5m2(d, a, b) tn_emu::mma8_at(__LINE__, false, true, (d), (a), (b))
#define tn_mma_e5m2_e4m3(d, a, b) tn_emu::mma8_at(__LINE__, true, false, (d), (a), (b))
#define tn_mma_e5m2_e5m2(d, a, b) tn_emu::mma8_at(__LINE__, true, true, (d), (a), (b))
#else
TN_FN void tn_ldsm_x4(unsigned* r, const void* p) {
  unsigned s = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}
TN_FN void tn_ldsm_x4_t(unsigned* r, const void* p) {
  unsigned s = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}
TN_FN void tn_mma_bf16(float* d, const unsigned* a, const unsigned* b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
               "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
TN_FN void tn_mma_f16(float* d, const unsigned* a, const unsigned* b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
               "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// FP8 operands (sm_89 and later): m16n8k32, the same registers holding four
// 8-bit values each; the accumulator's layout is m16n8k16's
#define TN_MMA_FP8(A, B)                                                                     \
  TN_FN void tn_mma_##A##_##B(float* d, const unsigned* a, const unsigned* b) {               \
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32." #A "." #B ".f32 {%0, %1, %2, %3}, " \
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"                              \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                             \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));         \
  }
TN_MMA_FP8(e4m3, e4m3)
TN_MMA_FP8(e4m3, e5m2)
TN_MMA_FP8(e5m2, e4m3)
TN_MMA_FP8(e5m2, e5m2)
#undef TN_MMA_FP8
#endif

// ---------------------------------------------------------------------------
// warpgroup tensor cores (Hopper wgmma) and the shared layout they read.
//
// tn_swz128<R, C, A, G>(L): the physical element of logical element L of a
// row-major R x C tile (a ring of such tiles: L beyond R*C is a later copy)
// in the 128-byte swizzled layout (loopir.Swizzle128): panels of A columns
// (128 bytes), each R rows of 128 bytes, 16-byte chunk x of row r stored at
// chunk x ^ (r % 8) (G elements per chunk). L is never negative.
template <int R, int C, int A, int G, typename T> TN_FN T tn_swz128(T L) {
  typedef unsigned long long U;
  const U l = (U)L, per = (U)R * C, ver = l / per, x = l % per, r = x / C, c = x % C;
  return (T)(ver * per + (c / A) * R * A + r * A + ((((c % A) / G) ^ (r & 7)) * G) + c % G);
}

#ifdef TN_EMULATE
TN_FN unsigned tn_smem_addr(const void* p) { return tn_emu::smem_addr(0, p); }
TN_FN void tn_wgmma_fence() { tn_emu::wgmma_fence(); }
#define tn_wgmma_commit() tn_emu::wgmma_commit()
template <int N> TN_FN void tn_wgmma_wait() { tn_emu::wgmma_wait(N); }
TN_FN void tn_fence_proxy_async() {}
#else
// the address of p in the block's shared-memory window
TN_FN unsigned tn_smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
// wgmma.fence: the accumulator registers' earlier accesses are ordered before
// the next wgmma; commit: the wgmmas issued since the last commit form a
// group; wait<N>: all but the N newest groups are complete (results in the
// registers, shared reads done)
TN_FN void tn_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
TN_FN void tn_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> TN_FN void tn_wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// this thread's writes to shared memory become visible to the async proxy
// (the tensor cores' reads); a block barrier follows
TN_FN void tn_fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
#endif

// a wgmma matrix descriptor: start address, leading and stride byte offsets
// (each in 16-byte units, 14 bits) and the 128-byte swizzle mode (1 << 62)
TN_FN tn_u64 tn_wgmma_desc(unsigned addr, unsigned lead, unsigned stride) {
  return (tn_u64)((addr >> 4) & 0x3fffu) | ((tn_u64)((lead >> 4) & 0x3fffu) << 16) |
         ((tn_u64)((stride >> 4) & 0x3fffu) << 32) | (1ull << 62);
}
// the descriptor d with its start address `bytes` further on (a multiple of
// 16): the address field holds addr / 16 in 14 bits, and every shared-window
// address is below 2^18 (228 KiB), so the field takes the sum without a carry
// -- the low word alone changes (one 32-bit add)
TN_FN tn_u64 tn_wgmma_desc_at(tn_u64 d, unsigned bytes) {
  return ((d >> 32) << 32) | (tn_u64)((unsigned)d + (bytes >> 4));
}

// asynchronous global -> shared copies of B = 4, 8 or 16 bytes (16 per
// instruction; 32 as two) to a shared-window address (tn_smem_addr). Every
// block barrier of a kernel with such copies is preceded by
// tn_cp_async_commit() (the copies this thread issued since its last commit
// form a group) and tn_cp_async_wait<N>() (every group but the N newest is
// complete): the loop IR's Barrier(keep=N).
#ifdef TN_EMULATE
// the emulator keeps each copy pending (source bytes read at issue) until a
// wait orders its group: the latest completion the PTX semantics permit, so
// a consumer that reads a version too early reads the poison
template <int N> TN_FN void tn_cp_async_wait() {
  alignas(16) unsigned char bytes[32];
  void* dst;
  int n;
  while ((n = tn_emu::async_complete(N, &dst, bytes)) > 0) memcpy(dst, bytes, n);
}
template <int B> TN_FN void tn_cp_async(unsigned at, const void* src) {
  static_assert(B == 4 || B == 8 || B == 16 || B == 32, "cp.async copies 4, 8 or 16 bytes");
  void* dst = tn_emu::smem_ptr(0, at, B);
  tn_emu::require_aligned(dst, B < 16 ? B : 16);
  tn_emu::require_aligned(src, B < 16 ? B : 16);
  alignas(16) unsigned char data[B];
  memcpy(data, src, B);  // the source is read at issue
  while (!tn_emu::async_issue(dst, data, B)) {  // a full queue: the oldest lands now
    alignas(16) unsigned char bytes[32];
    void* d;
    int n = tn_emu::async_complete(-(1 << 30), &d, bytes);
    memcpy(d, bytes, n);
  }
}
TN_FN void tn_cp_async_commit() { tn_emu::async_commit(); }
#else
template <int B> TN_FN void tn_cp_async(unsigned s, const void* src) {
  static_assert(B == 4 || B == 8 || B == 16 || B == 32, "cp.async copies 4, 8 or 16 bytes");
  if constexpr (B == 32) {
    tn_cp_async<16>(s, src);
    tn_cp_async<16>(s + 16u, (const char*)src + 16);
  } else {
    if constexpr (B == 16)
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(src) : "memory");
    else
      asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(s), "l"(src), "n"(B)
                   : "memory");
  }
}
TN_FN void tn_cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> TN_FN void tn_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
#endif

// ---------------------------------------------------------------------------
// bulk tensor copies (the Tensor Memory Accelerator) and their completion
// barriers (lowering/bulk_copy.py).
//
// tn_tmap is a tensor map: on the device the driver's encoding
// (cuTensorMapEncodeTiled), passed as a __grid_constant__ parameter; on the
// emulator the runtime's own (backends/cuda/tensormaps.py): word 0 the base
// address, word 1 rank | element bytes << 8 | swizzle bytes << 16, words 2-6
// the extents and 7-10 the byte strides of dims 1-4 (innermost first), word
// 11 the box extents of dims 0-3 (16 bits each), word 12 that of dim 4.
//
// A completion barrier (mbarrier, 8 bytes of shared memory) expects one
// arrival per phase: the thread that issues a group's copies announces their
// bytes (tn_mbar_expect) before issuing them and arrives when the group is
// committed; the phase completes once it has arrived and every byte landed.
// tn_tma_commit_wait<KEEP, M> is the loop IR's Barrier(keep=KEEP) for bulk
// copies: the group since the previous barrier is committed on barrier
// `issued % M`, then every group but the KEEP newest is waited for, phase
// parity (g / M) % 2 (M > the largest KEEP: the tma.phases obligation).
struct alignas(64) tn_tmap {
  tn_u64 w[16];
};
#ifdef TN_EMULATE
TN_FN void tn_mbar_init(unsigned bar, unsigned n) { tn_emu::mbar_init(0, bar, n); }
TN_FN void tn_mbar_init_fence() {}
TN_FN void tn_mbar_expect(unsigned bar, unsigned bytes) { tn_emu::mbar_expect(0, bar, bytes); }
TN_FN void tn_mbar_arrive(unsigned bar) { tn_emu::mbar_arrive(0, bar); }
TN_FN void tn_mbar_wait(unsigned bar, unsigned parity) { tn_emu::mbar_wait(0, bar, parity); }
// the box at coordinates c (innermost first) gathered as the device lays it
// out: dense, innermost fastest, zeros outside the tensor, 16-byte chunks
// swizzled by the destination's address bits (128-byte mode)
template <int R> TN_FN void tn_tma_load(unsigned dst, const tn_tmap* m, unsigned bar,
                                        const int (&c)[R]) {
  const tn_u64* w = m->w;
  const int rank = (int)(w[1] & 0xff), isz = (int)((w[1] >> 8) & 0xff);
  const int swz = (int)((w[1] >> 16) & 0xffff);
  if (rank != R) tn_emu::fail(TN_EMU_BAD_LAUNCH, 0, "a %d-d bulk copy through a %d-d tensor map", R, rank);
  if (swz != 128 || dst % 1024u)
    tn_emu::fail(TN_EMU_MEMORY_FAULT, 0, "a 128-byte swizzled bulk copy to shared address %#x "
                 "(needs 1024-byte alignment)", dst);
  long box[5], n = 1;
  for (int d = 0; d < R; ++d) {
    box[d] = d < 4 ? (long)((w[11] >> (16 * d)) & 0xffff) : (long)w[12];
    n *= box[d];
  }
  if (box[0] * isz != 128)
    tn_emu::fail(TN_EMU_BAD_LAUNCH, 0, "a 128-byte swizzled box row of %ld bytes", box[0] * isz);
  const int bytes = (int)(n * isz);
  unsigned char* img = (unsigned char*)malloc((size_t)bytes);
  const unsigned char* base = (const unsigned char*)(uintptr_t)w[0];
  for (long e = 0; e < n; ++e) {
    long rest = e, off = 0;
    bool in = true;
    for (int d = 0; d < R; ++d) {
      const long x = c[d] + rest % box[d];
      rest /= box[d];
      in = in && x >= 0 && x < (long)w[2 + d];
      off += d == 0 ? x * isz : x * (long)w[6 + d];
    }
    const unsigned a = dst + (unsigned)(e * isz);
    unsigned char* out = img + ((a ^ (((a >> 7) & 7u) << 4)) - dst);
    if (in)
      memcpy(out, base + off, (size_t)isz);
    else
      memset(out, 0, (size_t)isz);
  }
  tn_emu::tma_issue(0, bar, tn_emu::smem_ptr(0, dst, (unsigned)bytes), img, bytes);
  free(img);
}
#define TN_TMA_LOAD(R, ...)                                                             \
  {                                                                                     \
    const int tn_c[R] = {__VA_ARGS__};                                                  \
    tn_tma_load<R>(tn_dst, tn_m, tn_bar, tn_c);                                         \
  }
#else
TN_FN void tn_mbar_init(unsigned bar, unsigned n) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(n) : "memory");
}
// the barriers' initialization is visible to the async proxy (a block
// barrier follows)
TN_FN void tn_mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
TN_FN void tn_mbar_expect(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}
TN_FN void tn_mbar_arrive(unsigned bar) {
  asm volatile("{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [%0]; }" ::"r"(bar) : "memory");
}
TN_FN void tn_mbar_wait(unsigned bar, unsigned parity) {
  unsigned ok;
  do {
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; "
                 "selp.u32 %0, 1, 0, p; }"
                 : "=r"(ok) : "r"(bar), "r"(parity) : "memory");
  } while (!ok);
}
#define TN_TMA_LOAD(R, ...) TN_TMA_LOAD_##R(__VA_ARGS__)
#define TN_TMA_ASM(R, C) \
  "cp.async.bulk.tensor." #R "d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {" C "}], [%2];"
#define TN_TMA_LOAD_2(a, b) \
  asm volatile(TN_TMA_ASM(2, "%3, %4") ::"r"(tn_dst), "l"((tn_u64)tn_m), "r"(tn_bar), "r"(a), "r"(b) : "memory")
#define TN_TMA_LOAD_3(a, b, c)                                                                 \
  asm volatile(TN_TMA_ASM(3, "%3, %4, %5") ::"r"(tn_dst), "l"((tn_u64)tn_m), "r"(tn_bar), "r"(a), \
               "r"(b), "r"(c) : "memory")
#define TN_TMA_LOAD_4(a, b, c, d)                                                             \
  asm volatile(TN_TMA_ASM(4, "%3, %4, %5, %6") ::"r"(tn_dst), "l"((tn_u64)tn_m), "r"(tn_bar), \
               "r"(a), "r"(b), "r"(c), "r"(d) : "memory")
#define TN_TMA_LOAD_5(a, b, c, d, e)                                                              \
  asm volatile(TN_TMA_ASM(5, "%3, %4, %5, %6, %7") ::"r"(tn_dst), "l"((tn_u64)tn_m), "r"(tn_bar), \
               "r"(a), "r"(b), "r"(c), "r"(d), "r"(e) : "memory")
#endif
// the loop IR's Barrier(keep=KEEP) for bulk copies (above); thread 0 issues them
template <int KEEP, int M>
TN_FN void tn_tma_commit_wait(unsigned bars, unsigned& issued, unsigned& done) {
  if (threadIdx.x == 0) tn_mbar_arrive(bars + 8u * (issued % M));
  ++issued;
  while (done + KEEP < issued) {
    tn_mbar_wait(bars + 8u * (done % M), (done / M) & 1u);
    ++done;
  }
}

// the device faults on a misaligned vector access by itself; the host
// emulator must be told, since x86 loads most misaligned addresses silently
#ifdef TN_EMULATE
#define TN_VCHECK(p, B) tn_emu::require_aligned((p), tn_valign<(B)>::value)
#else
#define TN_VCHECK(p, B) ((void)0)
#endif

template <typename T, int V> TN_FN tn_pack<T, V> tn_vload(const T* p) {
  TN_VCHECK(p, (int)sizeof(T) * V);
  tn_pack<T, V> r;
  if constexpr (sizeof(T) * V == 32) {
    uint4 u[2];
    u[0] = reinterpret_cast<const uint4*>(p)[0];
    u[1] = reinterpret_cast<const uint4*>(p)[1];
    memcpy(&r, u, 32);
  } else if constexpr (sizeof(T) * V == 16) {
    uint4 u = *reinterpret_cast<const uint4*>(p);
    memcpy(&r, &u, 16);
  } else if constexpr (sizeof(T) * V == 8) {
    uint2 u = *reinterpret_cast<const uint2*>(p);
    memcpy(&r, &u, 8);
  } else if constexpr (sizeof(T) * V == 4) {
    unsigned u = *reinterpret_cast<const unsigned*>(p);
    memcpy(&r, &u, 4);
  } else {
    for (int i = 0; i < V; ++i) r.e[i] = p[i];
  }
  return r;
}

template <typename T, int V> TN_FN void tn_vstore(T* p, const tn_pack<T, V>& r) {
  TN_VCHECK(p, (int)sizeof(T) * V);
  if constexpr (sizeof(T) * V == 32) {
    uint4 u[2];
    memcpy(u, &r, 32);
    reinterpret_cast<uint4*>(p)[0] = u[0];
    reinterpret_cast<uint4*>(p)[1] = u[1];
  } else if constexpr (sizeof(T) * V == 16) {
    uint4 u;
    memcpy(&u, &r, 16);
    *reinterpret_cast<uint4*>(p) = u;
  } else if constexpr (sizeof(T) * V == 8) {
    uint2 u;
    memcpy(&u, &r, 8);
    *reinterpret_cast<uint2*>(p) = u;
  } else if constexpr (sizeof(T) * V == 4) {
    unsigned u;
    memcpy(&u, &r, 4);
    *reinterpret_cast<unsigned*>(p) = u;
  } else {
    for (int i = 0; i < V; ++i) p[i] = r.e[i];
  }
}

// Wide global accesses with an L2 policy (Schedule.cache_hints): the same
// values as tn_vload / tn_vstore, only the L2's choice of lines to evict
// differs. keep: evict_last (the program reads these lines again); last: the
// final read of lines read before (ld.global.cs, evicted first); stream: a
// store the program does not read back (st.global.cs). Groups of whole
// 16-byte pieces only; others, and the emulator, take the plain access.
#ifdef TN_EMULATE
template <typename T, int V> TN_FN tn_pack<T, V> tn_vload_keep(const T* p) { return tn_vload<T, V>(p); }
template <typename T, int V> TN_FN tn_pack<T, V> tn_vload_last(const T* p) { return tn_vload<T, V>(p); }
template <typename T, int V> TN_FN void tn_vstore_stream(T* p, const tn_pack<T, V>& r) { tn_vstore<T, V>(p, r); }
#else
// a wide load made of 16-byte pieces, each read by piece(address)
template <typename T, int V, typename F> TN_FN tn_pack<T, V> tn_vload_pieces(const T* p, F piece) {
  if constexpr (sizeof(T) * V % 16 != 0) {
    return tn_vload<T, V>(p);
  } else {
    constexpr int n = (int)(sizeof(T) * V / 16);
    uint4 u[n];
    #pragma unroll
    for (int i = 0; i < n; ++i) u[i] = piece(reinterpret_cast<const uint4*>(p) + i);
    tn_pack<T, V> r;
    memcpy(&r, u, sizeof(T) * V);
    return r;
  }
}
template <typename T, int V> TN_FN tn_pack<T, V> tn_vload_keep(const T* p) {
  return tn_vload_pieces<T, V>(p, [](const uint4* q) {
    unsigned long long pol;
    asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
    uint4 v;
    asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(q), "l"(pol));
    return v;
  });
}
template <typename T, int V> TN_FN tn_pack<T, V> tn_vload_last(const T* p) {
  return tn_vload_pieces<T, V>(p, [](const uint4* q) { return __ldcs(q); });
}
template <typename T, int V> TN_FN void tn_vstore_stream(T* p, const tn_pack<T, V>& r) {
  if constexpr (sizeof(T) * V % 16 != 0) {
    tn_vstore<T, V>(p, r);
  } else {
    constexpr int n = (int)(sizeof(T) * V / 16);
    uint4 u[n];
    memcpy(u, &r, sizeof(T) * V);
    #pragma unroll
    for (int i = 0; i < n; ++i) __stcs(reinterpret_cast<uint4*>(p) + i, u[i]);
  }
}
#endif
