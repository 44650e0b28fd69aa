/* tn_metal_shim.h -- run the Metal Shading Language that tilenest emits as host C++.
 *
 * The emulator compiles a generated MSL source with
 *     g++ -x c++ -std=c++14 -DTN_EMULATE -include tn_metal_shim.h SOURCE
 * This header is Metal's thin layer over the dialect-free runtime
 * (tn_runtime.h, which states the meaning of a launch). It supplies what the
 * Metal compiler would: the address-space words (`device`, `constant`,
 * `threadgroup`, `thread`, here plain host memory), the `kernel` marker,
 * Metal's scalar and vector types, `threadgroup_barrier` and
 * `simdgroup_barrier`, the simdgroup functions, the atomics of the status
 * word, `as_type` and the float math of namespace `metal`. Nothing here calls
 * a GPU compiler.
 *
 * The attributes of a kernel's parameters (`[[buffer(n)]]`,
 * `[[thread_position_in_threadgroup]]`, ...) are read by the emulator's
 * launcher, which passes the buffers from the caller's arguments and each
 * built-in value from the running thread (the tn_emu::msl_* functions
 * below); `[[threadgroup(0)]]` is the block's poisoned shared storage.
 * Attributes left in the text elsewhere are ignored by the host compiler.
 *
 * Simdgroup functions. Metal's take no lane mask: each is a rendezvous of
 * the whole simdgroup (the `lanes` consecutive threads of the profile; the
 * last simdgroup of a block may be shorter). Every lane of the simdgroup
 * must call the same function at the same time; a lane that exited, called
 * another function or waits at a barrier instead is an error. (Metal itself
 * lets a lane that returned early drop out; the emitter never relies on
 * it, so the emulator refuses it and a mask is never needed.) Reductions
 * (simd_sum, simd_product, simd_min, simd_max) combine the lanes' values
 * in a fixed tree: lane pairs (l, l ^ 1), then (l, l ^ 2), and so on, each
 * combination rounded in the value's own type; floating min and max ignore
 * a NaN operand (fmin / fmax).
 *
 * Simdgroup matrices (8x8). Metal leaves each lane's share of a matrix
 * unspecified and reaches a matrix only through whole-simdgroup calls, so
 * here every lane holds the whole matrix (row-major); a default-constructed
 * one holds poison. simdgroup_load, simdgroup_store, simdgroup_multiply and
 * simdgroup_multiply_accumulate are rendezvous like the simdgroup functions,
 * and every lane must pass the same address, row stride, origin and
 * transpose flag (else an error names the line). A load reads memory once
 * for the simdgroup and a store writes it once, from one lane's copy after
 * checking that every lane holds the same matrix. The product is
 *     d[r][c] = c[r][c] + a[r][0] * b[0][c] + ... + a[r][7] * b[7][c]
 * summed left to right, each product and each sum rounded in d's element
 * type (a and b widened to it first); simdgroup_multiply starts from the
 * first product. Metal does not promise that order: tilenest uses these
 * only for an `mma` whose policy admits any order.
 *
 * 16-bit floats: `half` is the compiler's _Float16 (computed in float and
 * rounded once, as on the device); `bfloat` is stored as its bits and
 * converts to and from float with round-to-nearest-even.
 */
#ifndef TN_METAL_SHIM_H
#define TN_METAL_SHIM_H

#define TN_EMU_BARRIER_NAME "threadgroup_barrier()"
#define TN_EMU_TRAP_NAME "a trap"
#define TN_EMU_OP_NAMES                                                                      \
    "simdgroup_barrier", "simd_shuffle", "simd_shuffle_up", "simd_shuffle_down",             \
    "simd_shuffle_xor", "simd_ballot", "simd_any", "simd_all", "simd_sum", "simd_min",       \
    "simd_max", "simd_and", "simd_or", "simd_xor",                                           \
    "simd_sum", "simd_product", "simd_min", "simd_max", "simdgroup_load", "simdgroup_store",  \
    "simdgroup_multiply_accumulate", "simdgroup_multiply"
#define TN_EMU_EXT_OP msl_reduce_op

#include "tn_runtime.h"

/* ---------------------------------------------------------------- words */
#define kernel
#define device
#define constant
#define threadgroup
#define thread

/* ---------------------------------------------------------------- scalars */
typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong; /* 64 bits on the host, as in Metal */
typedef _Float16 half;

/* Metal's bfloat: its bits; arithmetic widens to float. */
struct bfloat {
    unsigned short bits;
    bfloat() = default;
    bfloat(float f) {
        uint32_t u;
        memcpy(&u, &f, 4);
        if ((u & 0x7fffffffu) > 0x7f800000u) bits = (unsigned short)((u >> 16) | 0x40u);
        else bits = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
    operator float() const {
        uint32_t u = (uint32_t)bits << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
};

/* ---------------------------------------------------------------- vectors
 * Component access (.x .y .z .w), subscripts, element-wise arithmetic and
 * comparison-free conversions between vectors of one length: what tilenest's
 * kernels use of Metal's vectors. */
template <class T, int N> struct tn_msl_vec;
#define TN_VEC_OPS(N)                                                                        \
    T &operator[](int i) { return (&x)[i]; }                                                 \
    const T &operator[](int i) const { return (&x)[i]; }                                     \
    template <class U> explicit tn_msl_vec(const tn_msl_vec<U, N> &o) {                      \
        for (int i = 0; i < N; ++i) (*this)[i] = (T)o[i];                                    \
    }
template <class T> struct tn_msl_vec<T, 2> {
    T x, y;
    tn_msl_vec() = default;
    tn_msl_vec(T a) : x(a), y(a) {}
    tn_msl_vec(T a, T b) : x(a), y(b) {}
    TN_VEC_OPS(2)
};
template <class T> struct tn_msl_vec<T, 3> {
    T x, y, z;
    tn_msl_vec() = default;
    tn_msl_vec(T a) : x(a), y(a), z(a) {}
    tn_msl_vec(T a, T b, T c) : x(a), y(b), z(c) {}
    TN_VEC_OPS(3)
};
template <class T> struct tn_msl_vec<T, 4> {
    T x, y, z, w;
    tn_msl_vec() = default;
    tn_msl_vec(T a) : x(a), y(a), z(a), w(a) {}
    tn_msl_vec(T a, T b, T c, T d) : x(a), y(b), z(c), w(d) {}
    TN_VEC_OPS(4)
};
#undef TN_VEC_OPS
#define TN_VEC_BINOP(OP)                                                                     \
    template <class T, int N>                                                                \
    static inline tn_msl_vec<T, N> operator OP(tn_msl_vec<T, N> a, tn_msl_vec<T, N> b) {     \
        for (int i = 0; i < N; ++i) a[i] = a[i] OP b[i];                                     \
        return a;                                                                            \
    }                                                                                        \
    template <class T, int N>                                                                \
    static inline tn_msl_vec<T, N> operator OP(tn_msl_vec<T, N> a, T b) {                    \
        for (int i = 0; i < N; ++i) a[i] = a[i] OP b;                                        \
        return a;                                                                            \
    }
TN_VEC_BINOP(+)
TN_VEC_BINOP(-)
TN_VEC_BINOP(*)
TN_VEC_BINOP(/)
#undef TN_VEC_BINOP
#define TN_VECTORS(T)                                                                        \
    typedef tn_msl_vec<T, 2> T##2;                                                           \
    typedef tn_msl_vec<T, 3> T##3;                                                           \
    typedef tn_msl_vec<T, 4> T##4;
TN_VECTORS(char)
TN_VECTORS(uchar)
TN_VECTORS(short)
TN_VECTORS(ushort)
TN_VECTORS(int)
TN_VECTORS(uint)
TN_VECTORS(long)
TN_VECTORS(ulong)
TN_VECTORS(half)
TN_VECTORS(float)
#undef TN_VECTORS

/* ------------------------------------------------------------- memory flags */
enum class mem_flags : unsigned { mem_none = 0, mem_device = 1, mem_threadgroup = 2,
                                  mem_texture = 4, mem_threadgroup_imageblock = 8 };
static inline mem_flags operator|(mem_flags a, mem_flags b) {
    return (mem_flags)((unsigned)a | (unsigned)b);
}
enum memory_order { memory_order_relaxed, memory_order_seq_cst };

template <class T, int Cols, int Rows> struct simdgroup_matrix;

namespace tn_emu {

/* ------------------------------------------------------------ built-in values
 * A built-in kernel parameter's value for the running thread; it converts to
 * every type Metal allows for it (uint, ushort and their 2- and 3-vectors)
 * through msl_value. */
struct MslPos { unsigned x, y, z; };
static inline unsigned msl_as(const MslPos &p, unsigned *) { return p.x; }
static inline unsigned short msl_as(const MslPos &p, unsigned short *) { return (ushort)p.x; }
static inline uint2 msl_as(const MslPos &p, uint2 *) { return uint2(p.x, p.y); }
static inline uint3 msl_as(const MslPos &p, uint3 *) { return uint3(p.x, p.y, p.z); }
static inline ushort2 msl_as(const MslPos &p, ushort2 *) { return ushort2((ushort)p.x, (ushort)p.y); }
static inline ushort3 msl_as(const MslPos &p, ushort3 *) {
    return ushort3((ushort)p.x, (ushort)p.y, (ushort)p.z);
}
/* the value `p` as the parameter type V (the launcher's conversion) */
template <class V> static inline V msl_value(const MslPos &p) { return msl_as(p, (V *)nullptr); }
static inline MslPos msl_pos(const Index3 &v) { return MslPos{v.x, v.y, v.z}; }
static inline MslPos msl_threadgroup_position() { return msl_pos(cur_block_idx()); }
static inline MslPos msl_thread_position() { return msl_pos(cur_thread_idx()); }
static inline MslPos msl_threads_per_threadgroup() { return msl_pos(cur_block_dim()); }
static inline MslPos msl_threadgroups_per_grid() { return msl_pos(cur_grid_dim()); }
static inline MslPos msl_thread_position_in_grid() {
    const Index3 &b = cur_block_idx(), &d = cur_block_dim(), &t = cur_thread_idx();
    return MslPos{b.x * d.x + t.x, b.y * d.y + t.y, b.z * d.z + t.z};
}
static inline MslPos msl_thread_index() { return MslPos{(unsigned)S.cur->lin, 0, 0}; }
static inline MslPos msl_lane() { return MslPos{(unsigned)(S.cur->lin % S.lanes), 0, 0}; }
static inline MslPos msl_simdgroup() { return MslPos{(unsigned)(S.cur->lin / S.lanes), 0, 0}; }
static inline MslPos msl_simd_size() { return MslPos{(unsigned)S.lanes, 0, 0}; }

/* --------------------------------------------------------------- collectives */
/* every lane of the caller's simdgroup (the last one of a block may be short) */
static inline unsigned simd_mask() {
    const int base = S.cur->lin - S.cur->lin % S.lanes;
    const int n = std::min(S.lanes, S.nthreads - base);
    return n >= 32 ? 0xffffffffu : (1u << n) - 1u;
}

enum MslOp { OP_SIMD_SUM = OP_EXT, OP_SIMD_PRODUCT, OP_SIMD_MIN, OP_SIMD_MAX,
             OP_MATRIX_LOAD, OP_MATRIX_STORE, OP_MATRIX_MAC, OP_MATRIX_MUL };

/* A lane's operand of a reduction: its value, where the result goes, and the
 * function that combines the simdgroup's values (one per type and op). */
struct MslRed {
    const void *value;
    void *result;
    void (*reduce)(Fiber *warp, int wsize);
};

template <class T> static inline T msl_min(T a, T b) { return b < a ? b : a; }
template <class T> static inline T msl_max(T a, T b) { return a < b ? b : a; }
static inline float msl_min(float a, float b) { return fminf(a, b); }
static inline float msl_max(float a, float b) { return fmaxf(a, b); }
static inline half msl_min(half a, half b) { return (half)fminf((float)a, (float)b); }
static inline half msl_max(half a, half b) { return (half)fmaxf((float)a, (float)b); }

template <class T> static inline T msl_combine(int op, T a, T b) {
    switch (op) {
    case OP_SIMD_SUM: return (T)(a + b);
    case OP_SIMD_PRODUCT: return (T)(a * b);
    case OP_SIMD_MIN: return msl_min(a, b);
    default: return msl_max(a, b);
    }
}

/* The pairwise tree over the lanes (see the header comment). */
template <class T, int OP> static void msl_reduce_tree(Fiber *warp, int wsize) {
    T v[TN_EMU_MAX_LANES];
    for (int k = 0; k < wsize; ++k) v[k] = *(const T *)((MslRed *)(uintptr_t)warp[k].val)->value;
    for (int step = 1; step < wsize; step *= 2)
        for (int k = 0; k + step < wsize; k += 2 * step) v[k] = msl_combine<T>(OP, v[k], v[k + step]);
    for (int k = 0; k < wsize; ++k) *(T *)((MslRed *)(uintptr_t)warp[k].val)->result = v[0];
}

TN_RT void msl_reduce_op(Fiber *warp, int wsize, int op, int line) {
    MslRed *first = (MslRed *)(uintptr_t)warp[0].val;
    for (int k = 1; k < wsize; ++k)
        if (((MslRed *)(uintptr_t)warp[k].val)->reduce != first->reduce)
            fail(TN_EMU_COLLECTIVE_MISMATCH, line, "%s at line %d: lane %d passes a value of "
                 "another type than lane 0", op_names[op], line, k);
    first->reduce(warp, wsize);
#ifdef __SANITIZE_THREAD__
    __tsan_release(S.cur->token); /* the results written above, read by each lane on departure */
#endif
}

template <int OP, class T> static inline T msl_reduce(int line, T v) {
    T out;
    MslRed r{&v, &out, &msl_reduce_tree<T, OP>};
    collective(OP, line, simd_mask(), S.lanes, 0, (uint64_t)(uintptr_t)&r);
    return out;
}

template <class T> static inline T msl_shuffle(int op, int line, T v, unsigned arg) {
    static_assert(sizeof(T) <= 8, "a simdgroup shuffle of a value wider than 8 bytes");
    if (op == OP_SHFL_XOR && arg >= (unsigned)S.lanes)
        fail(TN_EMU_COLLECTIVE_MISMATCH, line, "simd_shuffle_xor at line %d: lane mask %u is "
             "not below the simdgroup's %d lanes", line, arg, S.lanes);
    if (op == OP_SHFL_IDX && arg >= (unsigned)S.lanes)
        fail(TN_EMU_COLLECTIVE_MISMATCH, line, "%s at line %d: lane %u is not below the "
             "simdgroup's %d lanes", op_names[op], line, arg, S.lanes);
    return from_bits<T>(collective(op, line, simd_mask(), S.lanes, (int)arg, to_bits(v)));
}

/* ------------------------------------------------------- simdgroup matrices */
/* The poison a fresh matrix element holds, of the launch's kind: NaN, a
 * large finite value (float: its largest; 16-bit: 65504), or bytes 0xa5. */
template <class T> static inline T msl_poison_value() {
    T v;
    if (S.cfg.poison == 2) memset(&v, 0xa5, sizeof v);
    else if (S.cfg.poison == 0) v = (T)NAN;
    else v = (T)(sizeof(T) == 4 ? 3.4028234663852886e38f : 65504.0f);
    return v;
}

/* A lane's part in a matrix call: the memory operand and the matrices. */
struct MslMat {
    int line;
    const void *addr;
    unsigned long stride, col0, row0;
    bool transpose;
    void *d;
    const void *a, *b, *c;
};

static inline const MslMat &msl_mat(Fiber *warp, int k) {
    return *(const MslMat *)((MslRed *)(uintptr_t)warp[k].val)->value;
}

/* Every lane names the same memory the same way. */
static inline void msl_same_memory(Fiber *warp, int wsize, const char *name) {
    const MslMat &m0 = msl_mat(warp, 0);
    for (int k = 1; k < wsize; ++k) {
        const MslMat &m = msl_mat(warp, k);
        if (m.addr != m0.addr || m.stride != m0.stride || m.col0 != m0.col0 ||
            m.row0 != m0.row0 || m.transpose != m0.transpose)
            fail(TN_EMU_COLLECTIVE_MISMATCH, m0.line, "%s at line %d: lane %d passes another "
                 "address, row stride, origin or transpose flag than lane 0", name, m0.line, k);
    }
}

/* Element (r, c) of a matrix at `m`'s memory operand. */
static inline unsigned long msl_at(const MslMat &m, int r, int c) {
    return m.transpose ? (m.row0 + c) * m.stride + m.col0 + r : (m.row0 + r) * m.stride + m.col0 + c;
}

template <class T, int C, int R> static void msl_matrix_load_all(Fiber *warp, int wsize) {
    msl_same_memory(warp, wsize, "simdgroup_load");
    const MslMat &m0 = msl_mat(warp, 0);
    const T *src = (const T *)m0.addr;
    simdgroup_matrix<T, C, R> got;
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) got.e[r][c] = src[msl_at(m0, r, c)];
    for (int k = 0; k < wsize; ++k) *(simdgroup_matrix<T, C, R> *)msl_mat(warp, k).d = got;
}

template <class T, int C, int R> static void msl_matrix_store_all(Fiber *warp, int wsize) {
    msl_same_memory(warp, wsize, "simdgroup_store");
    const MslMat &m0 = msl_mat(warp, 0);
    const simdgroup_matrix<T, C, R> &v = *(const simdgroup_matrix<T, C, R> *)m0.a;
    for (int k = 1; k < wsize; ++k)
        if (memcmp(msl_mat(warp, k).a, &v, sizeof v) != 0)
            fail(TN_EMU_COLLECTIVE_MISMATCH, m0.line, "simdgroup_store at line %d: lane %d "
                 "holds another matrix than lane 0", m0.line, k);
    T *dst = (T *)m0.addr;
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) dst[msl_at(m0, r, c)] = v.e[r][c];
}

/* d = a * b (+ c): each lane's own operands (see the header comment). */
template <class TD, class TA, class TB, class TC, int K, int R, int C, bool ACC>
static void msl_matrix_product_all(Fiber *warp, int wsize) {
    for (int k = 0; k < wsize; ++k) {
        const MslMat &m = msl_mat(warp, k);
        const simdgroup_matrix<TA, K, R> &a = *(const simdgroup_matrix<TA, K, R> *)m.a;
        const simdgroup_matrix<TB, C, K> &b = *(const simdgroup_matrix<TB, C, K> *)m.b;
        simdgroup_matrix<TD, C, R> out;
        for (int r = 0; r < R; ++r)
            for (int c = 0; c < C; ++c) {
                TD acc = ACC ? (TD)((const simdgroup_matrix<TC, C, R> *)m.c)->e[r][c]
                             : (TD)((TD)a.e[r][0] * (TD)b.e[0][c]);
                for (int i = ACC ? 0 : 1; i < K; ++i) {
                    const TD p = (TD)((TD)a.e[r][i] * (TD)b.e[i][c]);
                    acc = (TD)(acc + p);
                }
                out.e[r][c] = acc;
            }
        *(simdgroup_matrix<TD, C, R> *)m.d = out;
    }
}

template <class T, int C, int R>
static inline void msl_matrix_load(int line, simdgroup_matrix<T, C, R> &d, const T *src,
                                   unsigned long elements_per_row = C,
                                   ulong2 matrix_origin = ulong2(0ul),
                                   bool transpose_matrix = false) {
    MslMat m{line, src, elements_per_row, matrix_origin.x, matrix_origin.y, transpose_matrix,
             &d, nullptr, nullptr, nullptr};
    MslRed r{&m, nullptr, &msl_matrix_load_all<T, C, R>};
    collective(OP_MATRIX_LOAD, line, simd_mask(), S.lanes, 0, (uint64_t)(uintptr_t)&r);
}

template <class T, int C, int R>
static inline void msl_matrix_store(int line, const simdgroup_matrix<T, C, R> &a, T *dst,
                                    unsigned long elements_per_row = C,
                                    ulong2 matrix_origin = ulong2(0ul),
                                    bool transpose_matrix = false) {
    MslMat m{line, dst, elements_per_row, matrix_origin.x, matrix_origin.y, transpose_matrix,
             nullptr, &a, nullptr, nullptr};
    MslRed r{&m, nullptr, &msl_matrix_store_all<T, C, R>};
    collective(OP_MATRIX_STORE, line, simd_mask(), S.lanes, 0, (uint64_t)(uintptr_t)&r);
}

template <class TD, class TA, class TB, class TC, int K, int R, int C>
static inline void msl_matrix_mac(int line, simdgroup_matrix<TD, C, R> &d,
                                  const simdgroup_matrix<TA, K, R> &a,
                                  const simdgroup_matrix<TB, C, K> &b,
                                  const simdgroup_matrix<TC, C, R> &c) {
    MslMat m{line, nullptr, 0, 0, 0, false, &d, &a, &b, &c};
    MslRed r{&m, nullptr, &msl_matrix_product_all<TD, TA, TB, TC, K, R, C, true>};
    collective(OP_MATRIX_MAC, line, simd_mask(), S.lanes, 0, (uint64_t)(uintptr_t)&r);
}

template <class TD, class TA, class TB, int K, int R, int C>
static inline void msl_matrix_mul(int line, simdgroup_matrix<TD, C, R> &d,
                                  const simdgroup_matrix<TA, K, R> &a,
                                  const simdgroup_matrix<TB, C, K> &b) {
    MslMat m{line, nullptr, 0, 0, 0, false, &d, &a, &b, nullptr};
    MslRed r{&m, nullptr, &msl_matrix_product_all<TD, TA, TB, TD, K, R, C, false>};
    collective(OP_MATRIX_MUL, line, simd_mask(), S.lanes, 0, (uint64_t)(uintptr_t)&r);
}

static inline void msl_threadgroup_barrier(int line, mem_flags) { syncthreads_impl(line, 0); }
static inline void msl_simdgroup_barrier(int line, mem_flags) {
    collective(OP_SYNCWARP, line, simd_mask(), S.lanes, 0, 0);
}
static inline bool msl_all(int line, bool p) {
    return collective(OP_ALL, line, simd_mask(), S.lanes, 0, p) != 0;
}
static inline bool msl_any(int line, bool p) {
    return collective(OP_ANY, line, simd_mask(), S.lanes, 0, p) != 0;
}
static inline unsigned long long msl_ballot(int line, bool p) {
    return collective(OP_BALLOT, line, simd_mask(), S.lanes, 0, p);
}

} /* namespace tn_emu */

#define threadgroup_barrier(f) tn_emu::msl_threadgroup_barrier(__LINE__, f)
#define simdgroup_barrier(f) tn_emu::msl_simdgroup_barrier(__LINE__, f)
#define simd_sum(v) tn_emu::msl_reduce<tn_emu::OP_SIMD_SUM>(__LINE__, v)
#define simd_product(v) tn_emu::msl_reduce<tn_emu::OP_SIMD_PRODUCT>(__LINE__, v)
#define simd_min(v) tn_emu::msl_reduce<tn_emu::OP_SIMD_MIN>(__LINE__, v)
#define simd_max(v) tn_emu::msl_reduce<tn_emu::OP_SIMD_MAX>(__LINE__, v)
#define simd_shuffle(v, l) tn_emu::msl_shuffle(tn_emu::OP_SHFL_IDX, __LINE__, v, l)
#define simd_broadcast(v, l) tn_emu::msl_shuffle(tn_emu::OP_SHFL_IDX, __LINE__, v, l)
#define simd_shuffle_xor(v, m) tn_emu::msl_shuffle(tn_emu::OP_SHFL_XOR, __LINE__, v, m)
#define simd_shuffle_down(v, d) tn_emu::msl_shuffle(tn_emu::OP_SHFL_DOWN, __LINE__, v, d)
#define simd_shuffle_up(v, d) tn_emu::msl_shuffle(tn_emu::OP_SHFL_UP, __LINE__, v, d)
#define simd_all(p) tn_emu::msl_all(__LINE__, p)
#define simd_any(p) tn_emu::msl_any(__LINE__, p)
#define simd_ballot(p) tn_emu::msl_ballot(__LINE__, p)
#define simdgroup_load(...) tn_emu::msl_matrix_load(__LINE__, __VA_ARGS__)
#define simdgroup_store(...) tn_emu::msl_matrix_store(__LINE__, __VA_ARGS__)
#define simdgroup_multiply_accumulate(d, a, b, c) tn_emu::msl_matrix_mac(__LINE__, d, a, b, c)
#define simdgroup_multiply(d, a, b) tn_emu::msl_matrix_mul(__LINE__, d, a, b)

/* ---------------------------------------------------------------- simdgroup matrices */
template <class T, int Cols, int Rows> struct simdgroup_matrix {
    static_assert(Cols == 8 && Rows == 8, "Metal's simdgroup matrices are 8x8");
    T e[Rows][Cols]; /* the whole matrix, row-major, in every lane */
    simdgroup_matrix() {
        for (int r = 0; r < Rows; ++r)
            for (int c = 0; c < Cols; ++c) e[r][c] = tn_emu::msl_poison_value<T>();
    }
    explicit simdgroup_matrix(T diagonal) {
        for (int r = 0; r < Rows; ++r)
            for (int c = 0; c < Cols; ++c) e[r][c] = r == c ? diagonal : (T)0.0f;
    }
};
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;
typedef simdgroup_matrix<bfloat, 8, 8> simdgroup_bfloat8x8;
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
template <class T, int Cols, int Rows>
static inline simdgroup_matrix<T, Cols, Rows> make_filled_simdgroup_matrix(T value) {
    simdgroup_matrix<T, Cols, Rows> m;
    for (int r = 0; r < Rows; ++r)
        for (int c = 0; c < Cols; ++c) m.e[r][c] = value;
    return m;
}

/* ---------------------------------------------------------------- atomics
 * Relaxed host atomics on the word (TSan sees them as atomic, without
 * happens-before), as Metal's relaxed device atomics. */
struct atomic_int { int tn_v; };
struct atomic_uint { unsigned tn_v; };
#define TN_MSL_ATOMIC(A, T)                                                                  \
    static inline T atomic_load_explicit(volatile A *p, memory_order) {                     \
        return __atomic_load_n(&p->tn_v, __ATOMIC_RELAXED);                                  \
    }                                                                                        \
    static inline void atomic_store_explicit(volatile A *p, T v, memory_order) {            \
        __atomic_store_n(&p->tn_v, v, __ATOMIC_RELAXED);                                     \
    }                                                                                        \
    static inline T atomic_exchange_explicit(volatile A *p, T v, memory_order) {            \
        return __atomic_exchange_n(&p->tn_v, v, __ATOMIC_RELAXED);                           \
    }                                                                                        \
    static inline bool atomic_compare_exchange_weak_explicit(volatile A *p, T *expected,    \
                                                             T desired, memory_order,       \
                                                             memory_order) {                \
        return __atomic_compare_exchange_n(&p->tn_v, expected, desired, false,              \
                                           __ATOMIC_RELAXED, __ATOMIC_RELAXED);              \
    }                                                                                        \
    static inline T atomic_fetch_add_explicit(volatile A *p, T v, memory_order) {           \
        return __atomic_fetch_add(&p->tn_v, v, __ATOMIC_RELAXED);                            \
    }                                                                                        \
    static inline T atomic_fetch_or_explicit(volatile A *p, T v, memory_order) {            \
        return __atomic_fetch_or(&p->tn_v, v, __ATOMIC_RELAXED);                             \
    }                                                                                        \
    static inline T atomic_fetch_max_explicit(volatile A *p, T v, memory_order) {           \
        T old = __atomic_load_n(&p->tn_v, __ATOMIC_RELAXED);                                 \
        while (old < v && !__atomic_compare_exchange_n(&p->tn_v, &old, v, true,              \
                                                       __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {} \
        return old;                                                                          \
    }                                                                                        \
    static inline T atomic_fetch_min_explicit(volatile A *p, T v, memory_order) {           \
        T old = __atomic_load_n(&p->tn_v, __ATOMIC_RELAXED);                                 \
        while (old > v && !__atomic_compare_exchange_n(&p->tn_v, &old, v, true,              \
                                                       __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {} \
        return old;                                                                          \
    }
TN_MSL_ATOMIC(atomic_int, int)
TN_MSL_ATOMIC(atomic_uint, unsigned)
#undef TN_MSL_ATOMIC

/* ------------------------------------------------------------------- as_type */
template <class To, class From> static inline To as_type(From v) {
    static_assert(sizeof(To) == sizeof(From), "as_type between types of different size");
    To t;
    memcpy(&t, &v, sizeof t);
    return t;
}

/* ---------------------------------------------------------------- namespace metal
 * Everything above under Metal's namespace too (`metal::as_type`, and
 * `metal::simd_sum` through the alias of tn_emu), and Metal's float math:
 * templates, so that a source's `using namespace metal;` leaves the C++
 * float overloads the better match for unqualified calls (both compute in
 * float). */
namespace metal {
namespace tn_emu = ::tn_emu;
using ::as_type;
using ::mem_flags;
using ::memory_order;
using ::memory_order_relaxed;
using ::atomic_int;
using ::atomic_uint;
using ::atomic_load_explicit;
using ::atomic_store_explicit;
using ::atomic_exchange_explicit;
using ::atomic_compare_exchange_weak_explicit;
using ::atomic_fetch_add_explicit;
using ::simdgroup_matrix;
using ::simdgroup_half8x8;
using ::simdgroup_bfloat8x8;
using ::simdgroup_float8x8;
using ::make_filled_simdgroup_matrix;
#define TN_MSL_F1(F)                                                                         \
    template <class T> static inline T F(T x) { return (T)::F##f((float)x); }
#define TN_MSL_F2(F)                                                                         \
    template <class T> static inline T F(T x, T y) { return (T)::F##f((float)x, (float)y); }
TN_MSL_F1(exp) TN_MSL_F1(exp2) TN_MSL_F1(log) TN_MSL_F1(log2) TN_MSL_F1(sqrt)
TN_MSL_F1(sin) TN_MSL_F1(cos) TN_MSL_F1(tan) TN_MSL_F1(tanh) TN_MSL_F1(fabs)
TN_MSL_F1(floor) TN_MSL_F1(ceil) TN_MSL_F1(trunc) TN_MSL_F1(rint) TN_MSL_F1(round)
TN_MSL_F2(fmin) TN_MSL_F2(fmax) TN_MSL_F2(pow) TN_MSL_F2(fmod) TN_MSL_F2(atan2)
TN_MSL_F2(copysign)
#undef TN_MSL_F1
#undef TN_MSL_F2
template <class T> static inline T fma(T a, T b, T c) {
    return (T)::fmaf((float)a, (float)b, (float)c);
}
template <class T> static inline T rsqrt(T x) { return (T)(1.0f / ::sqrtf((float)x)); }
template <class T> static inline T abs(T x) { return x < (T)0 ? (T)-x : x; }
template <class T> static inline T min(T a, T b) { return tn_emu::msl_min(a, b); }
template <class T> static inline T max(T a, T b) { return tn_emu::msl_max(a, b); }
template <class T> static inline T clamp(T x, T lo, T hi) { return min(max(x, lo), hi); }
template <class T> static inline bool isnan(T x) { return x != x; }
template <class T> static inline bool isinf(T x) { return ::fabsf((float)x) == INFINITY; }
namespace precise { using metal::exp; using metal::log; using metal::sqrt; using metal::pow; }
} /* namespace metal */

#endif /* TN_METAL_SHIM_H */
