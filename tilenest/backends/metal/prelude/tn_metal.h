// tilenest Metal prelude: the scalar semantics of the loop IR in the Metal
// Shading Language.
//
// The portable part is shared with CUDA: tn_scalar.h (integer and float
// arithmetic as semantics/numerics.py defines it) and tn_mathf.h (the
// transcendentals and the float <-> 64-bit integer conversions computed in
// float alone). Both live in backends/simt/prelude. This file defines what
// those headers ask of a dialect, in Metal's words, then adds what a Metal
// kernel needs beside them: bit casts through as_type, the status word as a
// device atomic, simdgroup shuffles and the packs of a wide group.
//
// Apple GPUs have no 64-bit float, so nothing here has an f64 overload: a
// program that needs one is refused before any text is written
// (backends/metal/emit.py). Kernels are built with fast math off, so float
// arithmetic is IEEE round-to-nearest per operation, as the contract needs.
#pragma once
#include <metal_stdlib>
using namespace metal;

typedef long tn_i64;
typedef ulong tn_u64;

#define TN_FN inline
#define TN_THREAD thread
#define TN_STATUS device atomic_int*

// what tn_mathf.h asks of its includer
#define TN_FMA(a, b, c) fma((a), (b), (c))
#define TN_AS_UINT(x) as_type<uint>(x)
#define TN_AS_FLOAT(u) as_type<float>(u)
#define TN_MATHF_U64 ulong
#define TN_MATHF_I64 long

// ---------------------------------------------------------------------------
// what tn_scalar.h needs: a float's bits and the status word

TN_FN uint tn_fbits(float x) { return as_type<uint>(x); }
TN_FN float tn_bitsf(uint b) { return as_type<float>(b); }

// the first error of a launch wins: the status word goes from 0 to `code`
// once; a later failure finds it nonzero and leaves it
TN_FN void tn_fail(device atomic_int* status, int code) {
  int expected = 0;
  while (!atomic_compare_exchange_weak_explicit(status, &expected, code, memory_order_relaxed,
                                                memory_order_relaxed)) {
    if (expected != 0) return;  // a weak exchange may fail spuriously: retry only then
  }
}

#include "tn_scalar.h"
#include "tn_mathf.h"

// ---------------------------------------------------------------------------
// 16-bit floats: Metal's own half and bfloat hold them (same bits as the
// portable tn_f16 / tn_bf16, which CUDA uses); arithmetic is in float

TN_FN half tn_half(uint b) { return as_type<half>((ushort)b); }
TN_FN bfloat tn_bfloat(uint b) { return as_type<bfloat>((ushort)b); }
TN_FN uint tn_hbits(half v) { return (uint)as_type<ushort>(v); }
TN_FN uint tn_hbits(bfloat v) { return (uint)as_type<ushort>(v); }
// exact: every half and every bfloat is a float (subnormals included)
TN_FN float tn_widen(half h) { return (float)h; }
TN_FN float tn_widen(bfloat b) { return as_type<float>(tn_hbits(b) << 16); }
// one rounding to nearest-even, by the integer code of tn_scalar.h (exact
// for subnormal results whatever the device's conversion does)
TN_FN half tn_narrow_f16(float x) { return tn_half(tn_to_f16(x).bits); }
TN_FN bfloat tn_narrow_bf16(float x) { return tn_bfloat(tn_to_bf16(x).bits); }

// ---------------------------------------------------------------------------
// bit casts: the bits of one register type read as another of the same width

template <typename D, typename S> TN_FN D tn_bitcast(S s) { return as_type<D>(s); }

// ---------------------------------------------------------------------------
// lane collectives: v from lane (this lane ^ l) of the simdgroup. Every lane
// of the simdgroup takes part (Metal's functions take no mask); the emitter
// uses them only for full simdgroups and l below the group's width.

#define TN_XOR_NATIVE(T) \
  TN_FN T tn_simd_xor(T v, int l) { return simd_shuffle_xor(v, (ushort)l); }
TN_XOR_NATIVE(int)
TN_XOR_NATIVE(uint)
TN_XOR_NATIVE(short)
TN_XOR_NATIVE(ushort)
TN_XOR_NATIVE(char)
TN_XOR_NATIVE(uchar)
TN_XOR_NATIVE(float)
#undef TN_XOR_NATIVE
// 64-bit values as two 32-bit halves (each lane reads both from one lane)
TN_FN ulong tn_simd_xor(ulong v, int l) {
  uint lo = simd_shuffle_xor((uint)v, (ushort)l), hi = simd_shuffle_xor((uint)(v >> 32), (ushort)l);
  return ((ulong)hi << 32) | (ulong)lo;
}
TN_FN long tn_simd_xor(long v, int l) { return (long)tn_simd_xor((ulong)v, l); }
TN_FN half tn_simd_xor(half v, int l) { return simd_shuffle_xor(v, (ushort)l); }
TN_FN bfloat tn_simd_xor(bfloat v, int l) { return tn_bfloat(simd_shuffle_xor((ushort)tn_hbits(v), (ushort)l)); }
TN_FN bool tn_simd_xor(bool v, int l) { return simd_shuffle_xor((uchar)(v ? 1 : 0), (ushort)l) != 0; }

// ---------------------------------------------------------------------------
// wide groups: V consecutive elements moved together. Metal packs are moved
// element by element here, so any address may take the wide path (the
// alignment tests hold for every pointer); the grouping still lets the
// compiler combine the accesses.

template <typename T, int V> struct tn_pack { T e[V]; };

#define TN_VMEM(SPACE)                                                              \
  template <typename T, int V> TN_FN tn_pack<T, V> tn_vload(const SPACE T* p) {     \
    tn_pack<T, V> r;                                                                \
    for (int i = 0; i < V; ++i) r.e[i] = p[i];                                      \
    return r;                                                                       \
  }                                                                                 \
  template <typename T, int V>                                                      \
  TN_FN void tn_vstore(SPACE T* p, thread const tn_pack<T, V>& r) {                 \
    for (int i = 0; i < V; ++i) p[i] = r.e[i];                                      \
  }                                                                                 \
  template <typename T> TN_FN bool tn_aligned(const SPACE T*, ulong) { return true; }
TN_VMEM(device)
#ifndef TN_EMULATE
// on the host emulator the address-space words are empty, so the three
// overloads would be one function defined three times: one serves all
TN_VMEM(threadgroup)
TN_VMEM(thread)
#endif
#undef TN_VMEM

// whether x is a multiple of m > 0 (for either sign of x)
TN_FN bool tn_multiple(long x, long m) { return x % m == 0; }
