// tilenest float-only math: the narrow-dtype transcendentals and the exact
// float <-> integer conversions of the loop IR, with no double anywhere.
//
// Meaning. For f32 every function here is meant to be within 1 ulp of the
// exact value for every input (spec/values.md V-14): |result - y| < ulp(y),
// y the interpreter's value before its final rounding and ulp(y) the f32
// spacing in the binade of |y| (the subnormal spacing below the normal
// range); NaN, infinities and the sign of zero are the reference's exactly.
// The error analysis is per function below; the maxima measured on dense
// samples and on every input of each function's hardest range are in
// spec/lowering.md (tests/test_mathf.py; -m slow checks all 2^32 inputs).
// An f16/bf16 function is the f32 function on the widened argument, rounded
// once to the narrow dtype: with e < 1 the f32 error in f32 ulps, the narrow
// result is within 0.5 + e 2^-13 (f16) or 0.5 + e 2^-16 (bf16) of its own
// ulp (the narrow rounding adds half a narrow ulp; e f32 ulps are 2^-13 or
// 2^-16 of a narrow ulp in the same binade; when y and the f32 value lie in
// different binades the narrow rounding lands on the power of two between
// them, closer to y than the f32 value). The one exception would be the
// overflow threshold (an exact value just below it whose f32 value reaches
// it); the exhaustive 16-bit tests show no such input for the unary
// functions, nor for pow at the 16-bit exponents nearest the threshold.
//
// Conversions are exact: float -> integer truncates toward zero and
// saturates (NaN -> 0), 64-bit integers -> float round to nearest even; the
// _odd forms round to odd at 24 bits, which rounded once more to f16 or bf16
// is that narrow dtype's nearest-even rounding of the integer.
//
// Language. Plain C++14 that is also MSL: no double, no if constexpr, no
// library call, no pointer or reference parameters (multi-part results are
// small structs). The including file defines
//   TN_FN            the function qualifiers (CUDA: static __device__
//                    __forceinline__; MSL and host: static inline),
//   TN_FMA(a, b, c)  a fused multiply-add of floats (one rounding),
//   TN_AS_UINT(x), TN_AS_FLOAT(u)  float <-> uint bit casts,
// and may define TN_MATHF_U64 / TN_MATHF_I64, the 64-bit integer types
// (default unsigned long long / long long; MSL: ulong / long), and TN_DIV.
// The code relies on IEEE round-to-nearest float arithmetic with subnormals
// (no fast math, no flush to zero, no contraction of a*b+c into an fma);
// division (TN_DIV) is used only where an approximate quotient is corrected
// by an fma residual, so it need not be correctly rounded (tested with a
// division that is one ulp off).
//
// Names start with tnf_; the struct tnf_df is an unevaluated sum hi + lo
// (a double-float), tnf_dfk one with a power of two: (hi + lo) 2^k.
#pragma once

// float division; the includer may substitute its own (it need not be
// correctly rounded: every quotient here is corrected by an fma residual)
#ifndef TN_DIV
#define TN_DIV(a, b) ((a) / (b))
#endif

// 64-bit integers: MSL spells them ulong / long; the includer may say so
#ifndef TN_MATHF_U64
#define TN_MATHF_U64 unsigned long long
#define TN_MATHF_I64 long long
#endif
typedef TN_MATHF_U64 tnf_u64;
typedef TN_MATHF_I64 tnf_i64;

struct tnf_df {
  float hi, lo;
};
struct tnf_dfk {
  float hi, lo;
  int k;
};

// ---------------------------------------------------------------------------
// bits and exact building blocks

TN_FN float tnf_abs(float x) { return TN_AS_FLOAT(TN_AS_UINT(x) & 0x7fffffffu); }
TN_FN bool tnf_isnan(float x) { return (TN_AS_UINT(x) & 0x7fffffffu) > 0x7f800000u; }
TN_FN bool tnf_sign(float x) { return (TN_AS_UINT(x) >> 31) != 0u; }
TN_FN float tnf_copysign(float m, float s) {
  return TN_AS_FLOAT((TN_AS_UINT(m) & 0x7fffffffu) | (TN_AS_UINT(s) & 0x80000000u));
}
TN_FN float tnf_inf() { return TN_AS_FLOAT(0x7f800000u); }
TN_FN float tnf_nan() { return TN_AS_FLOAT(0x7fc00000u); }
// 2^k for -126 <= k <= 127
TN_FN float tnf_pow2(int k) { return TN_AS_FLOAT((unsigned)(k + 127) << 23); }
// x rounded to an integer, ties to even (exact for |x| < 2^22; larger x are integers)
TN_FN float tnf_rint(float x) {
  return tnf_abs(x) < 4194304.0f ? (x + 1.2582912e+07f) - 1.2582912e+07f : x;
}
// s + e = a + b exactly (Knuth)
TN_FN tnf_df tnf_two_sum(float a, float b) {
  float s = a + b, bb = s - a;
  tnf_df r = {s, (a - (s - bb)) + (b - bb)};
  return r;
}
// the same when |a| >= |b| or a = 0 (Dekker)
TN_FN tnf_df tnf_fast_two_sum(float a, float b) {
  float s = a + b;
  tnf_df r = {s, b - (s - a)};
  return r;
}
// p + e = a b exactly (no underflow)
TN_FN tnf_df tnf_two_prod(float a, float b) {
  float p = a * b;
  tnf_df r = {p, TN_FMA(a, b, -p)};
  return r;
}

// RN((h + l) 2^k), one rounding, for h > 0 normal, |l| < h, any k: also when
// the result is subnormal (rounded as an integer multiple of 2^-149), zero or
// infinite.
TN_FN float tnf_scale(float h, float l, int k) {
  tnf_df n = tnf_fast_two_sum(h, l);  // |l| <= ulp(h) / 2 from here
  int eh = (int)((TN_AS_UINT(n.hi) >> 23) & 0xffu) - 127;
  float sc = tnf_pow2(-eh);
  h = n.hi * sc;  // in [1, 2)
  l = n.lo * sc;
  k += eh;
  if (k > 128) return tnf_inf();
  if (k >= -126) {  // h 2^k is exact, fma rounds once (subnormal results too)
    int k1 = k > 127 ? 127 : k;
    float s = tnf_pow2(k1);
    float y = TN_FMA(l, s, h * s);
    return k > 127 ? y * 2.0f : y;
  }
  // subnormal: round (H + l 2^23) / 2^sh to an integer, H = h 2^23, |l 2^23| <= 1/2
  int sh = -126 - k;
  if (sh > 25) return 0.0f;
  unsigned H = (TN_AS_UINT(h) & 0x7fffffu) | 0x800000u;
  unsigned q = H >> sh, rem = H & ((1u << sh) - 1u), half = 1u << (sh - 1);
  bool up = rem > half || (rem == half && (l > 0.0f || (l == 0.0f && (q & 1u) != 0u)));
  return TN_AS_FLOAT(q + (up ? 1u : 0u));
}

// ---------------------------------------------------------------------------
// exponentials

// e^(r + d) - 1 as hi + lo for |r| <= 0.35, |d| <= 2^-20: r + r^2/2 exactly
// (two_prod), r^3 times the Taylor polynomial to r^5 / 8! (truncation below
// 2^-30 relative), d e^r to first order.
TN_FN tnf_df tnf_expm1_core(float r, float d) {
  tnf_df sq = tnf_two_prod(r, r);
  float q = 2.4801588e-05f;              // 1/40320
  q = TN_FMA(q, r, 0.0001984127f);      // 1/5040
  q = TN_FMA(q, r, 0.0013888889f);      // 1/720
  q = TN_FMA(q, r, 0.008333334f);       // 1/120
  q = TN_FMA(q, r, 0.041666668f);       // 1/24
  q = TN_FMA(q, r, 0.16666667f);       // 1/6
  float c = (sq.hi * r) * q;
  tnf_df s = tnf_two_sum(r, 0.5f * sq.hi);
  float lo = s.lo + (0.5f * sq.lo + (c + TN_FMA(d, r, d)));
  return tnf_fast_two_sum(s.hi, lo);
}

// x + xl = k ln2 + r + d, k = rint(x log2e); returns t = e^(r + d) - 1 and k,
// for |x| <= 105. ln2 in a 16-bit head (k ln2_hi exact, one fma) and a tail;
// d holds the rounding error of r (recovered by a second fma) and xl.
TN_FN tnf_dfk tnf_exp_reduce(float x, float xl) {
  float kf = TN_FMA(x, 1.442695f, 1.2582912e+07f) - 1.2582912e+07f;
  float nk = -kf;
  float r1 = TN_FMA(nk, 0.69314575f, x);
  float r = TN_FMA(nk, 1.4286068e-06f, r1);
  float d = TN_FMA(nk, 1.4286068e-06f, r1 - r) + xl;
  tnf_df t = tnf_expm1_core(r, d);
  tnf_dfk o = {t.hi, t.lo, (int)kf};
  return o;
}
// 1 + t as a normalized double-float (|t| < 1/2)
TN_FN tnf_df tnf_one_plus(tnf_df t) {
  tnf_df h = tnf_fast_two_sum(1.0f, t.hi);
  h.lo = h.lo + t.lo;
  return h;
}

// e^x: the CUDA prelude's and the LLVM backend's exp_f32 formula step for
// step (so the targets agree bitwise): measured below 0.9 ulp exhaustively.
TN_FN float tnf_exp(float x) {
  if (tnf_isnan(x)) return x + x;
  float xc = x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x);
  float k = TN_FMA(xc, 1.442695f, 1.2582912e+07f) - 1.2582912e+07f;
  float nk = -k;
  float r1 = TN_FMA(nk, 0.69314575f, xc);
  float r = TN_FMA(nk, 1.4286068e-06f, r1);
  float d = TN_FMA(nk, 1.4286068e-06f, r1 - r);
  float q = 0.0013814529f;
  q = TN_FMA(q, r, 0.00836875f);
  q = TN_FMA(q, r, 0.041668393f);
  q = TN_FMA(q, r, 0.1666652f);
  q = TN_FMA(q, r, 0.49999994f);
  float t = r + TN_FMA(r * r, q, d);
  int ki = (int)k;
  bool big = ki > 127, tiny = ki < -149;
  int k1 = big ? 127 : (tiny ? -149 : ki);
  if (tiny) t = (t - 1.0f) * 0.5f;
  unsigned bits = k1 < -126 ? (1u << (unsigned)(k1 + 149)) : ((unsigned)(k1 + 127) << 23);
  float sc = TN_AS_FLOAT(bits);
  float y = TN_FMA(t, sc, sc);
  return big ? y * 2.0f : y;
}

// 2^x = 2^k e^(r ln2), k = rint(x), r = x - k exact; r ln2 as a double-float
TN_FN float tnf_exp2(float x) {
  if (tnf_isnan(x)) return x + x;
  if (x >= 128.0f) return tnf_inf();
  if (x < -152.0f) return 0.0f;
  float kf = tnf_rint(x), r = x - kf;
  tnf_df p = tnf_two_prod(r, 0.6931472f);
  tnf_df t = tnf_expm1_core(p.hi, p.lo + r * -1.9046542e-09f);
  tnf_df h = tnf_one_plus(t);
  return tnf_scale(h.hi, h.lo, (int)kf);
}

// e^x - 1 = 2^k (1 + t) - 1, summed exactly with two_sum, one final rounding
TN_FN float tnf_expm1(float x) {
  if (tnf_isnan(x)) return x + x;
  if (tnf_abs(x) < 2.9802322e-08f) return x;  // x + x^2/2 rounds to x
  if (x < -17.5f) return -1.0f;         // e^x < 2^-25: rounds to -1
  if (x > 89.0f) return tnf_inf();
  tnf_dfk e = tnf_exp_reduce(x, 0.0f);
  if (e.k == 0) return e.hi + e.lo;
  tnf_df t = {e.hi, e.lo};
  tnf_df h = tnf_one_plus(t);
  if (e.k > 127) {  // the -1 is far below the result's ulp
    float s = tnf_pow2(127);
    return TN_FMA(h.lo, s, h.hi * s) * 2.0f;
  }
  float s = tnf_pow2(e.k);
  tnf_df a = tnf_two_sum(h.hi * s, -1.0f);
  return a.hi + (a.lo + h.lo * s);
}

// 1 / (1 + e^-x): the quotient of double-floats, one final rounding; for
// x < 0 it is e^x / (1 + e^x), scaled by 2^k only at the end (subnormal
// results round once)
TN_FN float tnf_sigmoid(float x) {
  if (tnf_isnan(x)) return x + x;
  if (x >= 0.0f) {
    float a = x > 30.0f ? 30.0f : x;
    tnf_dfk e = tnf_exp_reduce(-a, 0.0f);
    tnf_df t = {e.hi, e.lo};
    tnf_df h = tnf_one_plus(t);
    float s = tnf_pow2(e.k);
    tnf_df den = tnf_fast_two_sum(1.0f, h.hi * s);
    den.lo = den.lo + h.lo * s;
    float q = TN_DIV(1.0f, den.hi);
    float res = TN_FMA(-q, den.hi, 1.0f) - q * den.lo;
    return TN_FMA(q, res, q);
  }
  if (x < -104.0f) return 0.0f;
  tnf_dfk e = tnf_exp_reduce(x, 0.0f);
  tnf_df t = {e.hi, e.lo};
  tnf_df h = tnf_one_plus(t);
  tnf_df den = {1.0f, 0.0f};
  if (e.k >= -60) {
    float s = tnf_pow2(e.k);
    den = tnf_fast_two_sum(1.0f, h.hi * s);
    den.lo = den.lo + h.lo * s;
  }
  float q = TN_DIV(h.hi, den.hi);
  float res = (TN_FMA(-q, den.hi, h.hi) + h.lo) - q * den.lo;
  return tnf_scale(q, TN_DIV(res, den.hi), e.k);
}

// tanh |x| = E / (E + 2), E = e^(2|x|) - 1 as a double-float
TN_FN float tnf_tanh(float x) {
  if (tnf_isnan(x)) return x + x;
  float a = tnf_abs(x);
  if (a < 0.00024414062f) return x;                            // x - x^3/3 rounds to x
  if (a > 9.1f) return tnf_copysign(1.0f, x);            // 1 - 2e^-2a rounds to 1
  tnf_dfk e = tnf_exp_reduce(2.0f * a, 0.0f);
  tnf_df E = {e.hi, e.lo};
  if (e.k != 0) {
    tnf_df h = tnf_one_plus(E);
    float s = tnf_pow2(e.k);
    E = tnf_two_sum(h.hi * s, -1.0f);
    E.lo = E.lo + h.lo * s;
  }
  tnf_df den = tnf_two_sum(E.hi, 2.0f);
  den.lo = den.lo + E.lo;
  float q = TN_DIV(E.hi, den.hi);
  float res = (TN_FMA(-q, den.hi, E.hi) + E.lo) - q * den.lo;
  return tnf_copysign(q + TN_DIV(res, den.hi), x);
}

// ---------------------------------------------------------------------------
// logarithms

// x = 2^k m, m in [sqrt(1/2), sqrt 2), for x > 0 finite (subnormals too);
// returns log(m) as hi + lo (relative error below 2^-34) and k.
// log m = 2 atanh(s) = 2s + 2s^3/3 + 2s^5 Q(s^2), s = f / (2 + f), f = m - 1
// exact; s as a double-float, 2s^3/3 as a double-float, the rest in float.
TN_FN tnf_dfk tnf_log_core(float x) {
  unsigned b = TN_AS_UINT(x);
  int k = 0;
  if (b < 0x00800000u) {
    b = TN_AS_UINT(x * 8388608.0f);
    k = -23;
  }
  int eb = ((int)b - 0x3f3504f3) >> 23;  // floor(log2(x / sqrt(1/2)))
  float m = TN_AS_FLOAT(b - ((unsigned)eb << 23));
  k += eb;
  float f = m - 1.0f;
  tnf_df u = tnf_fast_two_sum(2.0f, f);
  float rcp = TN_DIV(1.0f, u.hi);  // one division: s = sh + sl from its residual
  float sh = f * rcp;
  float sl = (TN_FMA(-sh, u.hi, f) - sh * u.lo) * rcp;
  tnf_df z = tnf_two_prod(sh, sh);
  tnf_df a = tnf_two_prod(sh, z.hi);                                  // sh^3
  float small = a.lo + (sh * z.lo + 3.0f * z.hi * sl);                 // s^3 - a.hi
  float bh = a.hi * 0.6666667f;                                    // 2/3 head
  float bl = TN_FMA(a.hi, 0.6666667f, -bh) + (a.hi * -1.9868216e-08f + small * 0.6666667f);
  float zz = z.hi;
  float q = 0.06666667f;                  // 1/15
  q = TN_FMA(q, zz, 0.07692308f);         // 1/13
  q = TN_FMA(q, zz, 0.09090909f);         // 1/11
  q = TN_FMA(q, zz, 0.11111111f);         // 1/9
  q = TN_FMA(q, zz, 0.14285715f);         // 1/7
  q = TN_FMA(q, zz, 0.2f);         // 1/5
  float t5 = (2.0f * sh) * (zz * zz) * q;
  tnf_df hs = tnf_two_sum(2.0f * sh, bh);
  float lo = hs.lo + (2.0f * sl + (bl + t5));
  tnf_df r = tnf_fast_two_sum(hs.hi, lo);
  tnf_dfk o = {r.hi, r.lo, k};
  return o;
}

// NaN, negative, zero and infinite arguments of log, log2 (0 for a finite x > 0)
TN_FN float tnf_log_special(float x) {
  if (tnf_isnan(x)) return x + x;
  if (x == 0.0f) return -tnf_inf();
  if (x < 0.0f) return tnf_nan();
  return x;  // +inf
}
TN_FN bool tnf_log_plain(float x) { return x > 0.0f && x < tnf_inf(); }

// log x = k ln2 + log m: k ln2_hi exact (16-bit head), two_sum, one rounding
TN_FN float tnf_log(float x) {
  if (!tnf_log_plain(x)) return tnf_log_special(x);
  tnf_dfk L = tnf_log_core(x);
  float kf = (float)L.k;
  tnf_df s = tnf_two_sum(kf * 0.69314575f, L.hi);
  return s.hi + (s.lo + (L.lo + kf * 1.4286068e-06f));
}

// log2 x as a double-float (k + log m / ln2), for x > 0 finite
TN_FN tnf_df tnf_log2_df(float x) {
  tnf_dfk L = tnf_log_core(x);
  float ph = L.hi * 1.442695f;
  float pl = TN_FMA(L.hi, 1.442695f, -ph) + (L.hi * 1.925963e-08f + L.lo * 1.442695f);
  tnf_df s = tnf_two_sum((float)L.k, ph);
  return tnf_fast_two_sum(s.hi, s.lo + pl);
}
TN_FN float tnf_log2(float x) {
  if (!tnf_log_plain(x)) return tnf_log_special(x);
  tnf_df r = tnf_log2_df(x);
  return r.hi + r.lo;
}

// log(1 + x) = log(u) + log(1 + d/u), u + d = 1 + x exactly (two_sum)
TN_FN float tnf_log1p(float x) {
  if (tnf_isnan(x)) return x + x;
  if (tnf_abs(x) < 2.9802322e-08f) return x;  // x - x^2/2 rounds to x
  if (x == -1.0f) return -tnf_inf();
  if (x < -1.0f) return tnf_nan();
  if (x == tnf_inf()) return x;
  tnf_df u = tnf_two_sum(1.0f, x);
  tnf_dfk L = tnf_log_core(u.hi);
  float dh = TN_DIV(u.lo, u.hi);                 // d/u as dh + dl
  float dl = TN_DIV(TN_FMA(-dh, u.hi, u.lo), u.hi);
  float kf = (float)L.k;
  tnf_df s = tnf_two_sum(kf * 0.69314575f, L.hi);
  tnf_df c = tnf_two_sum(s.hi, dh);  // log(1 + d/u) = dh + (dl - dh^2/2) to 2^-48
  float lo = (s.lo + c.lo) + (L.lo + (kf * 1.4286068e-06f + TN_FMA(-0.5f * dh, dh, dl)));
  return c.hi + lo;
}

// ---------------------------------------------------------------------------
// pow: 2^(y log2|x|) with log2 and the product in double-float arithmetic,
// and C99's special cases (as numpy's power)

// whether y is an integer (0: no, 1: even, 2: odd)
TN_FN int tnf_parity(float y) {
  float a = tnf_abs(y);
  if (a >= 1.6777216e+07f) return 1;
  int i = (int)a;
  if ((float)i != a) return 0;
  return (i & 1) != 0 ? 2 : 1;
}

TN_FN float tnf_pow(float x, float y) {
  if (y == 0.0f || x == 1.0f) return 1.0f;
  if (tnf_isnan(x) || tnf_isnan(y)) return x + y;
  int par = tnf_parity(y);
  bool odd = par == 2;
  float ax = tnf_abs(x);
  if (tnf_abs(y) == tnf_inf()) {
    if (ax == 1.0f) return 1.0f;
    return (ax > 1.0f) == (y > 0.0f) ? tnf_inf() : 0.0f;
  }
  if (x == 0.0f || ax == tnf_inf()) {
    bool big = (x == 0.0f) == (y < 0.0f);  // 0^-y and inf^y are infinite
    float r = big ? tnf_inf() : 0.0f;
    return tnf_sign(x) && odd ? -r : r;
  }
  if (x < 0.0f && par == 0) return tnf_nan();
  tnf_df T = tnf_log2_df(ax);
  float wh = y * T.hi;
  float r;
  if (!(tnf_abs(wh) < 300.0f)) {
    r = wh > 0.0f ? tnf_inf() : 0.0f;
  } else {
    float wl = TN_FMA(y, T.hi, -wh) + y * T.lo;
    tnf_df w = tnf_fast_two_sum(wh, wl);
    if (w.hi >= 129.0f) {
      r = tnf_inf();
    } else if (w.hi <= -152.0f) {
      r = 0.0f;
    } else {
      float kf = tnf_rint(w.hi);
      tnf_df f = tnf_two_sum(w.hi - kf, w.lo);
      tnf_df p = tnf_two_prod(f.hi, 0.6931472f);
      float pl = p.lo + (f.hi * -1.9046542e-09f + f.lo * 0.6931472f);
      tnf_df t = tnf_expm1_core(p.hi, pl);
      tnf_df h = tnf_one_plus(t);
      r = tnf_scale(h.hi, h.lo, (int)kf);
    }
  }
  return x < 0.0f && odd ? -r : r;
}

// ---------------------------------------------------------------------------
// rsqrt: 1/sqrt(x), a Newton iterate corrected once in double-float

TN_FN float tnf_rsqrt(float x) {
  if (tnf_isnan(x)) return x + x;
  if (x == 0.0f) return tnf_copysign(tnf_inf(), x);
  if (x < 0.0f) return tnf_nan();
  if (x == tnf_inf()) return 0.0f;
  float sc = 1.0f;
  if (x < 7.888609e-31f) {  // subnormal or tiny: 1/sqrt(x 2^48) 2^24
    x = x * 2.8147498e+14f;
    sc = 1.6777216e+07f;
  } else if (x > 1.2676506e+30f) {  // keeps y^2 normal
    x = x * 3.5527137e-15f;
    sc = 5.9604645e-08f;
  }
  float y = TN_AS_FLOAT(0x5f375a86u - (TN_AS_UINT(x) >> 1));
  float hx = 0.5f * x;
  for (int i = 0; i < 3; ++i) y = y * TN_FMA(-hx * y, y, 1.5f);
  // e = 1 - x y^2 to about 2^-48: y^2 exact, x y^2 exact, 1 - (head) exact
  tnf_df y2 = tnf_two_prod(y, y);
  tnf_df p = tnf_two_prod(x, y2.hi);
  float e = ((1.0f - p.hi) - p.lo) - x * y2.lo;
  return TN_FMA(y, 0.5f * e, y) * sc;  // y (1 + e/2), e^2 below 2^-40
}

// ---------------------------------------------------------------------------
// sin, cos: exact reduction by 2/pi (Payne-Hanek over 256 bits of 2/pi),
// then polynomials on |y| <= pi/4 with y a double-float

// bits 32 i - 63 .. 32 i - 32 of 2/pi (bit j has weight 2^-j; words 0 and 1
// are the zeros above the binary point)
TN_FN unsigned tnf_2opi_word(int i) {
  switch (i) {
    case 2: return 0xa2f9836eu;
    case 3: return 0x4e441529u;
    case 4: return 0xfc2757d1u;
    case 5: return 0xf534ddc0u;
    case 6: return 0xdb629599u;
    case 7: return 0x3c439041u;
    case 8: return 0xfe5163abu;
    case 9: return 0xdebbc561u;
    default: return 0u;
  }
}
TN_FN unsigned tnf_shl_or(unsigned a, unsigned b, int o) {
  return o == 0 ? a : ((a << o) | (b >> (32 - o)));
}

// |x| = (q + r) pi/2, |r| <= 1/2; returns r pi/2 as hi + lo and q mod 4, for
// finite x. Below pi/4 nothing is reduced.
TN_FN tnf_dfk tnf_trig_reduce(float x) {
  float a = tnf_abs(x);
  if (a < 0.7853982f) {
    tnf_dfk o = {a, 0.0f, 0};
    return o;
  }
  unsigned b = TN_AS_UINT(a);
  tnf_u64 m = (b & 0x7fffffu) | 0x800000u;
  int s = (int)(b >> 23) - 150;  // a = m 2^s
  // bits j0 .. j0 + 95 of 2/pi, j0 = s - 1: a (2/pi) mod 4 = m W 2^-94 mod 4
  int pos = s - 1 + 63;  // the padded bit position of j0
  int w = pos >> 5, o = pos & 31;
  unsigned w0 = tnf_2opi_word(w), w1 = tnf_2opi_word(w + 1), w2 = tnf_2opi_word(w + 2),
           w3 = tnf_2opi_word(w + 3);
  unsigned a0 = tnf_shl_or(w0, w1, o), a1 = tnf_shl_or(w1, w2, o), a2 = tnf_shl_or(w2, w3, o);
  tnf_u64 p0 = m * a2, p1 = m * a1, p2 = m * a0;
  tnf_u64 t1 = p1 + (p0 >> 32);
  tnf_u64 t2 = p2 + (t1 >> 32);  // product bits 64 .. 119
  tnf_u64 lo64 = (t1 << 32) | (p0 & (tnf_u64)0xffffffffu);
  int q = (int)((t2 >> 30) & (tnf_u64)3u);
  // the fraction, bits 93 .. 0, in four chunks of 24, 24, 24 and 22 bits
  int c0 = (int)((t2 >> 6) & (tnf_u64)0xffffffu);
  int c1 = (int)(((t2 << 18) | (lo64 >> 46)) & (tnf_u64)0xffffffu);
  int c2 = (int)((lo64 >> 22) & (tnf_u64)0xffffffu);
  int c3 = (int)(lo64 & (tnf_u64)0x3fffffu);
  if ((c0 & 0x800000) != 0) {  // fraction >= 1/2: r = fraction - 1
    q = (q + 1) & 3;
    c0 -= 0x1000000;
  }
  tnf_df r = tnf_two_sum((float)c0 * 5.9604645e-08f, (float)c1 * 3.5527137e-15f);
  r = tnf_fast_two_sum(r.hi, r.lo + ((float)c2 * 2.1175824e-22f + (float)c3 * 5.04871e-29f));
  float yh = r.hi * 1.5707964f;
  float yl = TN_FMA(r.hi, 1.5707964f, -yh) + (r.hi * -4.371139e-08f + r.lo * 1.5707964f);
  tnf_df y = tnf_fast_two_sum(yh, yl);
  tnf_dfk out = {y.hi, y.lo, q};
  return out;
}
// sin(yh + yl), |y| <= pi/4 (Taylor to y^11): y - y^3/6 in double-float
// (two-products), y^5 (1/5! - ...) in float
TN_FN float tnf_sin_poly(float yh, float yl) {
  tnf_df z = tnf_two_prod(yh, yh);
  float p = -2.5052108e-08f;              // -1/11!
  p = TN_FMA(p, z.hi, 2.7557319e-06f);    // 1/9!
  p = TN_FMA(p, z.hi, -1.984127e-04f);    // -1/7!
  p = TN_FMA(p, z.hi, 0.008333334f);      // 1/5!
  tnf_df y3 = tnf_two_prod(yh, z.hi);
  y3.lo = y3.lo + yh * z.lo;
  tnf_df t = tnf_two_prod(y3.hi, -0.16666667f);  // -1/6 = -0.16666667f + 4.967054e-09f
  t.lo = t.lo + (y3.hi * 4.967054e-09f + y3.lo * -0.16666667f);
  float rest = (y3.hi * z.hi) * p;
  tnf_df s = tnf_two_sum(yh, t.hi);
  return s.hi + (s.lo + (t.lo + (rest + TN_FMA(-0.5f * z.hi, yl, yl))));
}
// cos(yh + yl), |y| <= pi/4: 1 - y^2/2 in double-float, Taylor to y^14
TN_FN float tnf_cos_poly(float yh, float yl) {
  tnf_df z = tnf_two_prod(yh, yh);
  float p = -1.1470745e-11f;                // -1/14!
  p = TN_FMA(p, z.hi, 2.0876756e-09f);      // 1/12!
  p = TN_FMA(p, z.hi, -2.755732e-07f);     // -1/10!
  p = TN_FMA(p, z.hi, 2.4801588e-05f);      // 1/8!
  p = TN_FMA(p, z.hi, -0.0013888889f);     // -1/6!
  p = TN_FMA(p, z.hi, 0.041666668f);       // 1/4!
  tnf_df s = tnf_fast_two_sum(1.0f, -0.5f * z.hi);
  float lo = s.lo + (-0.5f * z.lo + ((z.hi * z.hi) * p - yh * yl));
  return s.hi + lo;
}
TN_FN float tnf_sin(float x) {
  if (!(tnf_abs(x) < tnf_inf())) return x - x;  // NaN for NaN and infinities
  if (tnf_abs(x) < 0.00024414062f) return x;          // x - x^3/6 rounds to x
  tnf_dfk y = tnf_trig_reduce(x);
  float v = (y.k & 1) != 0 ? tnf_cos_poly(y.hi, y.lo) : tnf_sin_poly(y.hi, y.lo);
  if ((y.k & 2) != 0) v = -v;
  return tnf_sign(x) ? -v : v;
}
TN_FN float tnf_cos(float x) {
  if (!(tnf_abs(x) < tnf_inf())) return x - x;
  if (tnf_abs(x) < 0.00024414062f) return 1.0f;  // 1 - x^2/2 rounds to 1
  tnf_dfk y = tnf_trig_reduce(x);
  float v = (y.k & 1) != 0 ? tnf_sin_poly(y.hi, y.lo) : tnf_cos_poly(y.hi, y.lo);
  return ((y.k + 1) & 2) != 0 ? -v : v;
}

// ---------------------------------------------------------------------------
// atan2: one of atan(a/b), pi/4 + atan((a-b)/(a+b)), pi/2 - atan(b/a) with
// the argument within tan(pi/8) of 0, quadrants added in double-float

// atan(u) as hi + lo for u = uh + ul, |u| <= 0.415: u - u^3/3 in
// double-float (two-products), u^5 P2(u^2) in float (P2 a degree-4 fit of
// (atan(u)/u - 1 + u^2/3) / u^4, error below 2^-26 of P2's size)
TN_FN tnf_df tnf_atan_small(float uh, float ul) {
  tnf_df z = tnf_two_prod(uh, uh);
  float t = z.hi - 0.086f;
  float p = 0.054161564f;
  p = TN_FMA(p, t, -0.06911956f);
  p = TN_FMA(p, t, 0.090688534f);
  p = TN_FMA(p, t, -0.12558338f);
  p = TN_FMA(p, t, 0.18848215f);
  tnf_df u3 = tnf_two_prod(uh, z.hi);
  u3.lo = u3.lo + uh * z.lo;
  tnf_df c = tnf_two_prod(u3.hi, -0.33333334f);  // -1/3 = -0.33333334f + 9.934108e-09f
  c.lo = c.lo + (u3.hi * 9.934108e-09f + u3.lo * -0.33333334f);
  float rest = (u3.hi * z.hi) * p;
  tnf_df s = tnf_two_sum(uh, c.hi);
  tnf_df r = {s.hi, s.lo + (c.lo + (rest + TN_FMA(-z.hi, ul, ul)))};
  return r;
}
// x = m 2^k, m in [1, 2), for x > 0 finite (subnormals too): {m, 0, k}
TN_FN tnf_dfk tnf_split(float x) {
  int e = 0;
  if (x < 1.17549435e-38f) {
    x = x * 16777216.0f;
    e = -24;
  }
  unsigned b = TN_AS_UINT(x);
  tnf_dfk o = {TN_AS_FLOAT((b & 0x7fffffu) | 0x3f800000u), 0.0f, (int)(b >> 23) - 127 + e};
  return o;
}
// (nh + nl) / (dh + dl) as a double-float
TN_FN tnf_df tnf_div_df(float nh, float nl, float dh, float dl) {
  float q = TN_DIV(nh, dh);
  float r = (TN_FMA(-q, dh, nh) + nl) - q * dl;
  tnf_df o = {q, TN_DIV(r, dh)};
  return o;
}

TN_FN float tnf_atan2(float y, float x) {
  if (tnf_isnan(x) || tnf_isnan(y)) return x + y;
  const float pi = 3.1415927f, pio2 = 1.5707964f, pio4 = 0.7853982f;
  bool xneg = tnf_sign(x);
  float a = tnf_abs(y), b = tnf_abs(x);
  float v;
  if (a == 0.0f) {
    v = xneg ? pi : 0.0f;
  } else if (b == 0.0f) {
    v = pio2;
  } else if (a == tnf_inf() || b == tnf_inf()) {
    if (a == b) v = xneg ? 2.3561945f : pio4;
    else v = a == tnf_inf() ? pio2 : (xneg ? pi : 0.0f);
  } else if (a < b * 1.4901161e-08f) {
    // atan(a/b) = a/b to 2^-52, the quotient of the significands scaled
    // once (subnormal results too); pi - a/b rounds to pi
    tnf_dfk sa = tnf_split(a), sb = tnf_split(b);
    tnf_df u = tnf_div_df(sa.hi, 0.0f, sb.hi, 0.0f);
    v = xneg ? pi : tnf_scale(u.hi, u.lo, sa.k - sb.k);
  } else {
    if (a > 1.8446744e+19f || b > 1.8446744e+19f) {
      a *= 5.421011e-20f;
      b *= 5.421011e-20f;
    } else if (a < 5.421011e-20f && b < 5.421011e-20f) {
      a *= 1.8446744e+19f;
      b *= 1.8446744e+19f;
    }
    int n;  // the base n pi/4
    float sg;
    tnf_df u;
    if (a < 0.41421366f * b) {         // a/b < tan(pi/8)
      u = tnf_div_df(a, 0.0f, b, 0.0f);
      n = 0;
      sg = 1.0f;
    } else if (b < 0.41421366f * a) {  // b/a < tan(pi/8)
      u = tnf_div_df(b, 0.0f, a, 0.0f);
      n = 2;
      sg = -1.0f;
    } else {
      tnf_df num = tnf_two_sum(a, -b), den = tnf_two_sum(a, b);
      u = tnf_div_df(num.hi, num.lo, den.hi, den.lo);
      n = 1;
      sg = 1.0f;
    }
    if (xneg) {
      n = 4 - n;
      sg = -sg;
    }
    tnf_df at = tnf_atan_small(u.hi, u.lo);
    float nf = (float)n;
    tnf_df s = tnf_two_sum(nf * 0.785398f, sg * at.hi);
    v = s.hi + (s.lo + (nf * 1.5695824e-07f + sg * at.lo));
  }
  return tnf_copysign(v, y);
}

// ---------------------------------------------------------------------------
// erf: x P(x^2) below 3/4 (the first two Taylor terms in double-float), and
// 1 - e^(-x^2) G(x) on [3/4, 4) with G ~ erfc(x) e^(x^2) fitted on five pieces
// (G = g0 + t R(t), t = x - the piece's middle); 1 from 4 on

TN_FN float tnf_erf(float x) {
  if (tnf_isnan(x)) return x + x;
  float a = tnf_abs(x);
  if (a >= 4.0f) return tnf_copysign(1.0f, x);  // erfc(4) < 2^-25
  if (a == 0.0f) return x;
  float v;
  if (a < 1.5258789e-05f) {  // 2/sqrt(pi) x, in the scale 2^64 and rounded once
    float X = a * 1.8446744e+19f;
    tnf_df p = tnf_two_prod(X, 1.1283792f);
    v = tnf_scale(p.hi, p.lo + X * -5.8635383e-08f, -64);
  } else if (a < 0.75f) {
    tnf_df z = tnf_two_prod(a, a);
    float t = z.hi - 0.5f;
    float r = 1.1704147e-06f;
    r = TN_FMA(r, t, -1.0801638e-05f);
    r = TN_FMA(r, t, 8.875593e-05f);
    r = TN_FMA(r, t, -0.000647252f);
    r = TN_FMA(r, t, 0.0041053435f);
    r = TN_FMA(r, t, -0.022227414f);
    r = TN_FMA(r, t, 0.10061106f);
    tnf_df c1 = tnf_two_prod(-0.37612638f, z.hi);
    float c1l = c1.lo + (-0.37612638f * z.lo + -1.0257194e-08f * z.hi);
    tnf_df P = tnf_two_sum(1.1283792f, c1.hi);
    float pl = P.lo + (-5.8635383e-08f + (c1l + (z.hi * z.hi) * r));
    tnf_df y = tnf_two_prod(a, P.hi);
    v = y.hi + (y.lo + a * pl);
  } else {
    float m, g0, g1, c[8];
    if (a < 1.0f) {
      m = 0.875f; g0 = 0.46431157f; g1 = 1.3273547e-08f;
      c[0] = -0.3158339f; c[1] = 0.18795693f; c[2] = -0.1009144f; c[3] = 0.049828418f;
      c[4] = -0.022925565f; c[5] = 0.009922662f; c[6] = -0.004090522f; c[7] = 0.001598865f;
    } else if (a < 1.5f) {
      m = 1.25f; g0 = 0.36782292f; g1 = 1.1368355e-09f;
      c[0] = -0.20882188f; c[1] = 0.10679557f; c[2] = -0.05021829f; c[3] = 0.022011375f;
      c[4] = -0.0090805385f; c[5] = 0.0035526417f; c[6] = -0.0013489339f; c[7] = 0.0004825039f;
    } else if (a < 2.0f) {
      m = 1.75f; g0 = 0.28497222f; g1 = 1.4078199e-08f;
      c[0] = -0.13097635f; c[1] = 0.05576363f; c[2] = -0.022259999f; c[3] = 0.008404321f;
      c[4] = -0.0030207497f; c[5] = 0.0010391173f; c[6] = -0.00034831977f; c[7] = 0.00011109466f;
    } else if (a < 2.75f) {
      m = 2.375f; g0 = 0.2205057f; g1 = -7.3102666e-09f;
      c[0] = -0.08097713f; c[1] = 0.02818501f; c[2] = -0.009358494f; c[3] = 0.0029793065f;
      c[4] = -0.0009128579f; c[5] = 0.00027019667f; c[6] = -7.935365e-05f; c[7] = 2.2112315e-05f;
    } else {
      m = 3.375f; g0 = 0.16063108f; g1 = -7.372741e-09f;
      c[0] = -0.04411946f; c[1] = 0.011727899f; c[2] = -0.003025212f; c[3] = 0.0007589363f;
      c[4] = -0.00018538139f; c[5] = 4.422419e-05f; c[6] = -1.0799365e-05f; c[7] = 2.4723622e-06f;
    }
    float t = a - m;  // exact
    float r = c[7];
    for (int i = 6; i >= 0; --i) r = TN_FMA(r, t, c[i]);
    float gl = g1 + t * r;
    tnf_df z = tnf_two_prod(a, a);
    tnf_dfk e = tnf_exp_reduce(-z.hi, -z.lo);
    tnf_df et = {e.hi, e.lo};
    tnf_df h = tnf_one_plus(et);
    float ph = h.hi * g0;
    float pl = TN_FMA(h.hi, g0, -ph) + (h.hi * gl + h.lo * g0);
    float s = tnf_pow2(e.k);
    tnf_df o = tnf_fast_two_sum(1.0f, -(ph * s));
    v = o.hi + (o.lo - pl * s);
  }
  return tnf_copysign(v, x);
}

// ---------------------------------------------------------------------------
// conversions

// x truncated toward zero and saturated to [lo, hi] (NaN -> 0): the loop IR's
// float -> integer cast for any integer type T (64-bit included), from the bits
template <typename T> TN_FN T tnf_f2i(float x, T lo, T hi) {
  if (tnf_isnan(x)) return (T)0;
  if (x <= (float)lo) return lo;
  if (x >= (float)hi) return hi;  // hi rounds up to a power of two where inexact
  unsigned b = TN_AS_UINT(x);
  int e = (int)((b >> 23) & 0xffu) - 127;
  if (e < 0) return (T)0;
  tnf_u64 m = (b & 0x7fffffu) | 0x800000u;
  tnf_u64 mag = e >= 23 ? m << (e - 23) : m >> (23 - e);
  return (b >> 31) != 0u ? (T)((tnf_u64)0u - mag) : (T)mag;
}

// the unsigned 64-bit m as a float: nearest even, or to odd at 24 bits
TN_FN float tnf_u64_to_f32(tnf_u64 m, bool odd) {
  if (m == (tnf_u64)0u) return 0.0f;
  int n = 0;
  if ((m >> 32) == (tnf_u64)0u) { m <<= 32; n += 32; }
  if ((m >> 48) == (tnf_u64)0u) { m <<= 16; n += 16; }
  if ((m >> 56) == (tnf_u64)0u) { m <<= 8; n += 8; }
  if ((m >> 60) == (tnf_u64)0u) { m <<= 4; n += 4; }
  if ((m >> 62) == (tnf_u64)0u) { m <<= 2; n += 2; }
  if ((m >> 63) == (tnf_u64)0u) { m <<= 1; n += 1; }
  unsigned mant = (unsigned)(m >> 40);  // 24 bits, leading one included
  tnf_u64 rest = m & (tnf_u64)0xffffffffffu, half = (tnf_u64)0x8000000000u;
  if (odd) {
    if (rest != (tnf_u64)0u) mant |= 1u;
  } else if (rest > half || (rest == half && (mant & 1u) != 0u)) {
    mant += 1u;  // 2^24 carries into the exponent below
  }
  return TN_AS_FLOAT(((unsigned)(63 - n + 127) << 23) + (mant - 0x800000u));
}
TN_FN float tnf_i64_to_f32(tnf_i64 v, bool odd) {
  bool neg = v < 0;
  float r = tnf_u64_to_f32(neg ? (tnf_u64)0u - (tnf_u64)v : (tnf_u64)v, odd);
  return neg ? -r : r;
}
