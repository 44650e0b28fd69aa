/* tn_cuda_shim.h -- run the CUDA C++ that tilenest emits as host C++.
 *
 * The emulator compiles a generated CUDA source with
 *     g++ -x c++ -std=c++17 -DTN_EMULATE -include tn_cuda_shim.h SOURCE
 * This header is CUDA's thin layer over the dialect-free runtime
 * (tn_runtime.h, which states the meaning of a launch): it supplies what
 * nvcc would -- the CUDA qualifiers, the index builtins, the barriers and
 * warp collectives under their CUDA names, atomics and intrinsics -- and
 * emulates NVIDIA's own instructions as the runtime's extension collectives
 * and per-thread state: ldmatrix, mma.sync and wgmma (by the PTX fragment
 * layouts) and cp.async (each copy pending until a wait orders it).
 * The launch's limits (32 lanes, 1024 threads, the shared-memory bytes) are
 * the CUDA profile's, passed by the emulator at each launch.
 */
#ifndef TN_CUDA_SHIM_H
#define TN_CUDA_SHIM_H

#define TN_EMU_BARRIER_NAME "__syncthreads()"
#define TN_EMU_TRAP_NAME "__trap()"
#define TN_EMU_OP_NAMES                                                                      \
    "__syncwarp", "__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync",    \
    "__ballot_sync", "__any_sync", "__all_sync", "__reduce_add_sync", "__reduce_min_sync",   \
    "__reduce_max_sync", "__reduce_and_sync", "__reduce_or_sync", "__reduce_xor_sync",       \
    "ldmatrix.x4", "ldmatrix.x4.trans", "mma.m16n8k16.bf16", "mma.m16n8k16.f16",             \
    "wgmma.m64nNk16.bf16", "wgmma.m64nNk16.f16", "mma.m16n8k32.fp8", "wgmma.m64nNk32.fp8"
#define TN_EMU_EXT_OP matrix_op
#define TN_EMU_BLOCK_START cuda_block_start
#define TN_EMU_THREAD_EXIT cuda_thread_exit
#define TN_EMU_FIBER_EXT CudaFiber

#include <cstdint>

namespace tn_emu {

/* An asynchronous copy (cp.async) issued and not yet complete: its source
 * bytes, read at issue, land in `dst` when a wait orders its group. */
struct AsyncCopy {
    void *dst;
    int bytes;
    int group;           /* the fiber's commit count at issue */
    alignas(16) unsigned char data[32];
};
enum { ASYNC_MAX = 64 };  /* pending copies per thread; the oldest completes early past it */

/* A shared-memory range [lo, hi) that the wgmma number `seq` of warp `warp`
 * reads (see wgmma_reads_at). */
struct WgRead {
    int warp, seq;
    uint32_t lo, hi;
};
enum { WG_READS_MAX = 256 };

/* A thread's NVIDIA state: its asynchronous-copy and wgmma groups, and the
 * wgmma reads not ordered before it: those still queued when their threads
 * arrived on the completion barrier whose phase it last waited for (dropped
 * at a block barrier once complete). */
struct CudaFiber {
    int committed;       /* cp.async groups committed */
    int wg_committed;    /* wgmma groups committed */
    int npending;
    AsyncCopy pending[ASYNC_MAX];  /* oldest first */
    int nunordered;
    WgRead unordered[WG_READS_MAX];
};

} /* namespace tn_emu */

#include "tn_runtime.h"

/* ---------------------------------------------------------------- qualifiers */
#define __global__
#define __device__
#define __host__
#define __shared__
#define __constant__
#define __managed__
#define __grid_constant__
#define __forceinline__ __inline__ __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
#define __cluster_dims__(...)
/* __restrict__ is a GNU keyword already. */

/* --------------------------------------------------------------- vector types */
typedef tn_emu::Index3 uint3;
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
    constexpr operator uint3() const { return uint3{x, y, z}; }
};

#define TN_VEC2(N, T, A) struct __attribute__((aligned(A))) N { T x, y; }; \
    static inline N make_##N(T a, T b) { return N{a, b}; }
#define TN_VEC3(N, T) struct N { T x, y, z; }; \
    static inline N make_##N(T a, T b, T c) { return N{a, b, c}; }
#define TN_VEC4(N, T, A) struct __attribute__((aligned(A))) N { T x, y, z, w; }; \
    static inline N make_##N(T a, T b, T c, T d) { return N{a, b, c, d}; }
TN_VEC2(float2, float, 8)
TN_VEC3(float3, float)
TN_VEC4(float4, float, 16)
TN_VEC2(int2, int, 8)
TN_VEC3(int3, int)
TN_VEC4(int4, int, 16)
TN_VEC2(uint2, unsigned int, 8)
TN_VEC4(uint4, unsigned int, 16)
TN_VEC2(double2, double, 16)
TN_VEC2(longlong2, long long, 16)
TN_VEC2(ulonglong2, unsigned long long, 16)
TN_VEC4(char4, signed char, 4)
TN_VEC4(uchar4, unsigned char, 4)
static inline uint3 make_uint3(unsigned int a, unsigned int b, unsigned int c) { return uint3{a, b, c}; }
#undef TN_VEC2
#undef TN_VEC3
#undef TN_VEC4

/* ------------------------------------------------------- NVIDIA emulation */
namespace tn_emu {

/* NVIDIA's collectives, the runtime's extension ops (names in TN_EMU_OP_NAMES) */
enum CudaOp { OP_LDSM = OP_EXT, OP_LDSM_T, OP_MMA_BF16, OP_MMA_F16, OP_WGMMA_BF16, OP_WGMMA_F16,
              OP_MMA_FP8, OP_WGMMA_FP8 };

/* The queue is the emulator's own memory, reused by every block's threads:
 * it is copied word by word here (uninstrumented, and through volatile so
 * that the compiler makes no memcpy call of it, which TSan would see); the
 * kernel's own accesses -- the source read, the shared-memory write -- stay
 * in the prelude, where TSan sees them. */
typedef uint32_t __attribute__((__may_alias__)) async_word;
TN_RT void async_words(void *dst, const void *src, int bytes) {
    volatile async_word *d = (volatile async_word *)dst;
    const volatile async_word *s = (const volatile async_word *)src;
    for (int k = 0; k < bytes / 4; ++k) d[k] = s[k];
}

/* A wgmma a warp issued and nobody has waited for yet (see wgmma_compute):
 * its shape, descriptors, the warp's index in its warpgroup, each lane's
 * accumulator registers with a digest of their values, and its group (the
 * lanes' commit count at issue); with A in registers (kind bit 16), each
 * lane's four A registers as they were at issue and where they are. */
struct WgPending {
    int kind;  /* 0 f16, 1 bf16, 2 + (a e5m2) + 2 (b e5m2): FP8 (else e4m3fn);
                  + 8: a 16-bit B read K-major; + 16: a 16-bit A in registers */
    int n, wg, line, group;
    int seq;   /* its number among its warp's wgmmas (wg_issued) */
    uint64_t da, db;
    float *d[32];
    uint64_t dsum[32];     /* digest of each lane's accumulator as this wgmma reads it */
    const void *ra_at[32];  /* register A: each lane's registers */
    uint32_t ra[32][4];     /* register A: their values at issue */
};
enum { WG_MAX = 64 };  /* pending wgmmas per warp */
struct WgQueue {
    int n;
    WgPending items[WG_MAX];  /* oldest first */
    long sync;                /* TSan: completions happen before later waits */
};
enum { WG_WARPS = 32 };  /* warps of a CUDA block (1024 threads) */
static WgQueue wgq[WG_WARPS];  /* each warp's issued, not yet complete wgmmas */
static int wg_issued[WG_WARPS], wg_completed[WG_WARPS];  /* each warp's wgmmas so far */

/* ------------------------------------------------------ tensor-core fragments
 * ldmatrix and mma.sync are warp collectives whose operands are per-lane
 * arrays: each lane deposits a pointer to its MatLane, and the lane that
 * completes the rendezvous computes the whole warp's result by the PTX ISA's
 * fragment layouts (lane l: group g = l / 4, thread-in-group q = l % 4):
 *   ldmatrix.x4 -- lane 8i + r gives the address of row r of matrix i; lane
 *     l receives in register i row g, columns 2q, 2q+1 of matrix i (with
 *     .trans: rows 2q, 2q+1 of column g), low half first;
 *   mma.m16n8k16.row.col -- A 16x16: a0 (g, 2q+e), a1 (g+8, 2q+e),
 *     a2 (g, 2q+8+e), a3 (g+8, 2q+8+e); B 16x8: b0 (2q+e, g), b1 (2q+8+e, g);
 *     C/D 16x8 f32: d0 (g, 2q), d1 (g, 2q+1), d2 (g+8, 2q), d3 (g+8, 2q+1);
 *   mma.m16n8k32.row.col with FP8 operands -- byte e of each register:
 *     A 16x32: a0 (g, 4q+e), a1 (g+8, 4q+e), a2 (g, 4q+16+e), a3 (g+8, 4q+16+e);
 *     B 32x8: b0 (4q+e, g), b1 (4q+16+e, g); C/D as above.
 * The arithmetic models the tensor cores' accumulation: the products are
 * exact, each output is c + the 16 products summed in double, then rounded
 * toward zero to f32 (the hardware truncates; V-22 admits faithful rounding),
 * except that a sum beyond f32's range is the infinity of its sign, not the
 * largest finite value: an H100 gave -inf for (-1.13e38 * 3.16) in one
 * instruction and + 2.95e38 in the next, and the exact -6.13e37 with both in
 * one (the instruction's own sum is wider). */
struct MatLane {
    const void *src;     /* ldmatrix: this lane's row address */
    unsigned *regs;      /* ldmatrix: the four registers it receives */
    float *d;            /* mma: accumulator fragment (read and written) */
    const unsigned *a;   /* mma, and wgmma with A in registers: A fragment (4 registers) */
    const unsigned *b;   /* mma: B fragment (2 registers) */
    uint64_t da, db;     /* wgmma: the shared-memory matrix descriptors of A and B */
    int n;               /* wgmma: columns of the tile; FP8 mma: bit 0 (1) a (b) is e5m2 */
    int wg;              /* wgmma: this warp's index in its warpgroup */
    int kind;            /* wgmma: the operand kind (WgPending::kind) */
    int warp;            /* wgmma: this warp's index in the block */
    int group;           /* wgmma: the lane's committed wgmma groups */
};


static inline float half_bits_to_float(unsigned h, bool bf) {
    if (bf) { uint32_t u = h << 16; float f; memcpy(&f, &u, 4); return f; }
    unsigned sgn = h >> 15 & 1u, ex = h >> 10 & 31u, man = h & 1023u;
    float v;
    if (ex == 0) v = std::ldexp((float)man, -24);
    else if (ex == 31) v = man ? NAN : INFINITY;
    else v = std::ldexp((float)(man | 1024u), (int)ex - 25);
    return sgn ? -v : v;
}

/* an FP8 code's value (e4m3fn, or e5m2) */
static inline float fp8_bits_to_float(unsigned v, bool e5m2) {
    unsigned sgn = v >> 7 & 1u;
    float r;
    if (e5m2) {
        unsigned ex = v >> 2 & 31u, man = v & 3u;
        r = ex == 31 ? (man ? NAN : INFINITY)
            : ex ? std::ldexp((float)(4u + man), (int)ex - 17) : std::ldexp((float)man, -16);
    } else {
        unsigned ex = v >> 3 & 15u, man = v & 7u;
        r = (v & 0x7fu) == 0x7fu ? NAN
            : ex ? std::ldexp((float)(8u + man), (int)ex - 10) : std::ldexp((float)man, -9);
    }
    return sgn ? -r : r;
}

static inline float toward_zero(double x) {
    float f = (float)x;  /* to nearest: beyond the range, the infinity */
    if (std::isfinite(f) && std::fabs((double)f) > std::fabs(x)) f = std::nextafter(f, 0.0f);
    return f;
}

/* wgmma.mma_async m64nNk16 (f32 += f16/bf16 x f16/bf16, A K-major and B
 * MN-major ("transposed")) and m64nNk32 (f32 += FP8 x FP8, both K-major: the
 * instruction has no transpose for 8-bit types) in shared memory, each described by a matrix
 * descriptor: start address, leading and stride byte offsets in 16-byte
 * units, 14 bits each, and the swizzle mode in bits 62-63) is a collective of
 * the warpgroup's four warps; each warp's result rows depend on its own 16 rows
 * of A and all of B, so the emulator runs it as a collective of each warp
 * (the descriptors uniform over the warp) computing rows 16 wg .. 16 wg + 15.
 * Operand element addresses follow the canonical layouts of the 128-byte
 * swizzle mode, the only one emulated: A (r, k): start + (r % 8) 128 +
 * (r / 8) SBO + s k (s the element size); 16-bit B (k, j) MN-major: start +
 * 2 (j % 64) + (j / 64) LBO + (k % 8) 128 + (k / 8) SBO; K-major B (FP8
 * always, 16-bit with kind bit 8), stored N x K: start + (j % 8) 128 +
 * (j / 8) SBO + s k; then the swizzle of the address
 * itself, bits 4-6 XOR bits 7-9.
 * The accumulator of lane l is d[4 q + 2 h + e] = D(16 wg + l / 4 + 8 h,
 * 8 q + 2 (l % 4) + e). Like the device, the emulator runs it asynchronously:
 * issuing queues it on the warp; tn_wgmma_commit closes the thread's group;
 * a wait_group N by any lane runs, oldest first, the warp's wgmmas of all
 * but its N newest groups, reading the operands then -- the latest moment
 * the hardware may -- so that shared memory overwritten before the wait is
 * seen as the wrong operand it would be. A thread that exits with its warp's
 * wgmmas pending is an error. Arithmetic as for mma.sync.
 * The register-A form (16-bit operands; kind bit 16) takes A from the lanes'
 * registers instead of a descriptor: lane l of warp wg holds rows 16 wg + g
 * and 16 wg + g + 8 of the 64 x 16 step, in mma.m16n8k16's layout -- a0 (g,
 * 2q+e), a1 (g+8, 2q+e), a2 (g, 2q+8+e), a3 (g+8, 2q+8+e), e the half of the
 * register (low first). Their values at issue are the operand.
 * The device reads the accumulator and A registers of a wgmma at some moment
 * before the wait that completes it, so writing them in between (other than
 * by the wgmmas of the same accumulator, which chain in order) is undefined:
 * at its run a wgmma whose accumulator (a digest of its values) or A
 * registers differ from what it was issued with is an error. */
static inline uint32_t swizzle128(uint32_t a) { return a ^ (((a >> 7) & 7u) << 4); }

/* mma.m16n8k16's 16-bit A fragment (also wgmma's register A, per warp): the
 * row and column of the element in half e of register r of lane l */
static inline int afrag_row(int l, int r) { return l / 4 + 8 * (r & 1); }
static inline int afrag_col(int l, int r, int e) { return 2 * (l % 4) + 8 * (r >> 1) + e; }

/* a digest of the n floats at d (their bits; FNV-1a) */
static inline uint64_t digest(const float *d, int n) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < n; ++i) {
        uint32_t u;
        memcpy(&u, d + i, 4);
        h = (h ^ u) * 1099511628211ull;
    }
    return h;
}

static float wgmma_operand(uint32_t addr, int kind, int which, int line) {
    kind &= 7;  /* bit 8: a 16-bit B read K-major (the layout, not the type) */
    const int size = kind >= 2 ? 1 : 2;
    if ((uint64_t)addr + size > TN_EMU_SMEM_STORAGE)
        fail(TN_EMU_MEMORY_FAULT, line, "wgmma at line %d reads shared address %u, outside the "
             "block's shared memory", line, addr);
    if (kind >= 2)  /* operand `which` (0 a, 1 b) is e5m2 where its kind bit is set */
        return fp8_bits_to_float(tn_smem[addr], (kind - 2) >> which & 1);
    uint16_t h;
    memcpy(&h, tn_smem + addr, 2);
    return half_bits_to_float(h, kind == 1);
}

/* Issue (the warp's rendezvous completed): check the operands and queue the
 * wgmma on the warp; it runs when a lane's wait retires its group. */
static void wgmma_issue(MatLane *const *ln, int line, int warp) {
    const int n = ln[0]->n;
    const uint64_t da = ln[0]->da, db = ln[0]->db;
    const bool ra = ln[0]->kind & 16;
    for (int k = 1; k < 32; ++k)
        if (ln[k]->n != n || ln[k]->da != da || ln[k]->db != db || ln[k]->wg != ln[0]->wg ||
            ln[k]->group != ln[0]->group || ln[k]->kind != ln[0]->kind)
            fail(TN_EMU_COLLECTIVE_MISMATCH, line, "wgmma at line %d: lane %d's shape, "
                 "descriptors or commit count differ from lane 0's (they are uniform over the "
                 "warpgroup)", line, k);
    if (n < 8 || n > 256 || n % 8)
        fail(TN_EMU_COLLECTIVE_MISMATCH, line, "wgmma at line %d: n = %d is not a multiple of "
             "8 in 8..256", line, n);
    const uint64_t descs[2] = {db, da};
    for (int i = 0; i < (ra ? 1 : 2); ++i)  /* A in registers has no descriptor */
        if ((descs[i] >> 62) != 1u)
            fail(TN_EMU_COLLECTIVE_MISMATCH, line, "wgmma at line %d: descriptor %#llx uses "
                 "swizzle mode %u; the emulator has the 128-byte mode (1) only", line,
                 (unsigned long long)descs[i], (unsigned)(descs[i] >> 62));
    WgQueue &q = wgq[warp];
    if (q.n == WG_MAX)
        fail(TN_EMU_COLLECTIVE_MISMATCH, line, "wgmma at line %d: warp %d has %d wgmmas pending; "
             "a wgmma wait_group is missing", line, warp, WG_MAX);
    WgPending &p = q.items[q.n++];
    p.kind = ln[0]->kind;
    p.n = n;
    p.wg = ln[0]->wg;
    p.line = line;
    p.group = ln[0]->group;
    p.seq = wg_issued[warp]++;
    p.da = da;
    p.db = db;
    for (int k = 0; k < 32; ++k) {
        p.d[k] = ln[k]->d;
        p.dsum[k] = digest(ln[k]->d, n / 2);
        p.ra_at[k] = ra ? ln[k]->a : nullptr;
        if (ra) memcpy(p.ra[k], ln[k]->a, sizeof p.ra[k]);
    }
}

/* The shared-window byte addresses a queued wgmma reads: element (i, k) of
 * its warp's 16 rows of `a`, element (k, j) of `b` (the descriptors' canonical
 * layouts, then the 128-byte address swizzle). */
struct WgOperands {
    bool fp8, kmajor_b;
    int depth, size;
    uint32_t a0, asbo, b0, blbo, bsbo;
    explicit WgOperands(const WgPending &p)
        : fp8((p.kind & 7) >= 2), kmajor_b(fp8 || (p.kind & 8)), depth(fp8 ? 32 : 16),
          size(fp8 ? 1 : 2), a0((uint32_t)(p.da & 0x3fffu) << 4),
          asbo((uint32_t)(p.da >> 32 & 0x3fffu) << 4), b0((uint32_t)(p.db & 0x3fffu) << 4),
          blbo((uint32_t)(p.db >> 16 & 0x3fffu) << 4),
          bsbo((uint32_t)(p.db >> 32 & 0x3fffu) << 4) {}
    uint32_t a(int wg, int i, int k) const {
        const int r = 16 * wg + i;
        return swizzle128(a0 + (r % 8) * 128u + (r / 8) * asbo + size * k);
    }
    uint32_t b(int j, int k) const {
        return swizzle128(kmajor_b ? b0 + (j % 8) * 128u + (j / 8) * bsbo + size * k
                                   : b0 + 2u * (j % 64) + (j / 64) * blbo + (k % 8) * 128u +
                                         (k / 8) * bsbo);
    }
};

/* Run one queued wgmma: check that its lanes' accumulator and A registers
 * are as it was issued with, read its shared operands now (the latest moment
 * the hardware may read them) and update the lanes' registers. */
static __attribute__((noinline)) void wgmma_run(const WgPending &p) {
    const int n = p.n, line = p.line, wg = p.wg;
    const bool ra = p.kind & 16;
    for (int l = 0; l < 32; ++l) {
        if (digest(p.d[l], n / 2) != p.dsum[l])
            fail(TN_EMU_ASYNC_PROTOCOL, line, "wgmma at line %d: lane %d of warp %d of the "
                 "warpgroup wrote its accumulator registers after issuing it and before the "
                 "wgmma wait_group that completes it (undefined on the device)", line, l, wg);
        uint32_t now[4];
        if (ra && (memcpy(now, p.ra_at[l], sizeof now), memcmp(now, p.ra[l], sizeof now)))
            fail(TN_EMU_ASYNC_PROTOCOL, line, "wgmma at line %d: lane %d of warp %d of the "
                 "warpgroup wrote its A registers after issuing it and before the wgmma "
                 "wait_group that completes it (undefined on the device)", line, l, wg);
    }
    const WgOperands op(p);
    const int depth = op.depth;
    float A[16][32];
    if (ra)  /* the lanes' registers: rows g + 8 (r & 1), columns 2q + 8 (r >> 1) + e */
        for (int l = 0; l < 32; ++l)
            for (int r = 0; r < 4; ++r)
                for (int e = 0; e < 2; ++e)
                    A[afrag_row(l, r)][afrag_col(l, r, e)] =
                        half_bits_to_float(p.ra[l][r] >> (16 * e) & 0xffffu, (p.kind & 7) == 1);
    else
        for (int i = 0; i < 16; ++i)
            for (int k = 0; k < depth; ++k)
                A[i][k] = wgmma_operand(op.a(wg, i, k), p.kind, 0, line);
    for (int j = 0; j < n; ++j) {
        float b[32];
        for (int k = 0; k < depth; ++k)
            b[k] = wgmma_operand(op.b(j, k), p.kind, 1, line);
        for (int i = 0; i < 16; ++i) {
            const int l = 4 * (i % 8) + (j % 8) / 2;
            float *c = &p.d[l][4 * (j / 8) + 2 * (i / 8) + j % 2];
            double s = *c;
            for (int k = 0; k < depth; ++k) s += (double)A[i][k] * (double)b[k];
            *c = toward_zero(s);
        }
    }
}

/* The ranges of the shared window a queued wgmma of warp `warp` reads (b's,
 * then a's rows unless A is in registers), their number returned: from the
 * least to past the greatest byte address (each operand tile lies within its
 * own 1024-byte atoms, so a range covers no other version of a ring). */
static int wgmma_reads_at(const WgPending &p, int warp, WgRead out[2]) {
    const WgOperands op(p);
    const bool ra = p.kind & 16;
    uint32_t alo = ~0u, ahi = 0, blo = ~0u, bhi = 0;
    for (int k = 0; k < op.depth; ++k) {
        for (int i = 0; i < 16 && !ra; ++i) {
            const uint32_t x = op.a(p.wg, i, k);
            alo = x < alo ? x : alo;
            ahi = x + op.size > ahi ? x + op.size : ahi;
        }
        for (int j = 0; j < p.n; ++j) {
            const uint32_t x = op.b(j, k);
            blo = x < blo ? x : blo;
            bhi = x + op.size > bhi ? x + op.size : bhi;
        }
    }
    out[0] = WgRead{warp, p.seq, blo, bhi};
    out[1] = WgRead{warp, p.seq, alo, ahi};
    return ra ? 1 : 2;
}


/* The data movement and arithmetic, instrumented under TSan (the completing
 * lane's reads of shared memory are real accesses); `matrix_op` below is the
 * bookkeeping around it. */
static __attribute__((noinline)) void matrix_compute(MatLane *const *ln, int op, int line) {
    if (op == OP_WGMMA_BF16 || op == OP_WGMMA_F16 || op == OP_WGMMA_FP8) {
        wgmma_issue(ln, line, ln[0]->warp);
        return;
    }
    if (op == OP_LDSM || op == OP_LDSM_T) {
        for (int k = 0; k < 32; ++k) {
            const unsigned char *p = (const unsigned char *)ln[k]->src;
            if (p < tn_smem || p + 16 > tn_smem + TN_EMU_SMEM_STORAGE)
                fail(TN_EMU_MEMORY_FAULT, line, "ldmatrix at line %d: lane %d's row address %p "
                     "is not in shared memory", line, k, (const void *)p);
            if ((uintptr_t)p & 15u)
                fail(TN_EMU_MEMORY_FAULT, line, "ldmatrix at line %d: lane %d's row address %p "
                     "is not 16-byte aligned", line, k, (const void *)p);
        }
        for (int l = 0; l < 32; ++l)
            for (int i = 0; i < 4; ++i) {
                uint16_t lo, hi;
                const uint16_t *row;
                if (op == OP_LDSM) {
                    row = (const uint16_t *)ln[8 * i + l / 4]->src;
                    lo = row[2 * (l % 4)];
                    hi = row[2 * (l % 4) + 1];
                } else {
                    lo = ((const uint16_t *)ln[8 * i + 2 * (l % 4)]->src)[l / 4];
                    hi = ((const uint16_t *)ln[8 * i + 2 * (l % 4) + 1]->src)[l / 4];
                }
                ln[l]->regs[i] = (unsigned)lo | (unsigned)hi << 16;
            }
        return;
    }
    if (op == OP_MMA_FP8) {
        const bool a5 = ln[0]->n & 1, b5 = ln[0]->n & 2;
        float A8[16][32], B8[32][8];
        double C8[16][8];
        for (int l = 0; l < 32; ++l) {
            int g = l / 4, q = l % 4;
            for (int e = 0; e < 4; ++e) {
                for (int r = 0; r < 4; ++r)
                    A8[g + 8 * (r & 1)][4 * q + 16 * (r >> 1) + e] =
                        fp8_bits_to_float(ln[l]->a[r] >> (8 * e) & 0xffu, a5);
                for (int r = 0; r < 2; ++r)
                    B8[4 * q + 16 * r + e][g] = fp8_bits_to_float(ln[l]->b[r] >> (8 * e) & 0xffu, b5);
            }
            for (int e = 0; e < 2; ++e) {
                C8[g][2 * q + e] = ln[l]->d[e];
                C8[g + 8][2 * q + e] = ln[l]->d[2 + e];
            }
        }
        for (int l = 0; l < 32; ++l) {
            int g = l / 4, q = l % 4;
            for (int h = 0; h < 2; ++h)
                for (int e = 0; e < 2; ++e) {
                    int i = g + 8 * h, j = 2 * q + e;
                    double s = C8[i][j];
                    for (int k = 0; k < 32; ++k) s += (double)A8[i][k] * (double)B8[k][j];
                    ln[l]->d[2 * h + e] = toward_zero(s);
                }
        }
        return;
    }
    const bool bf = op == OP_MMA_BF16;
    float A[16][16], B[16][8];
    double C[16][8];
    for (int l = 0; l < 32; ++l) {
        int g = l / 4, q = l % 4;
        for (int e = 0; e < 2; ++e) {
            for (int r = 0; r < 4; ++r) {
                unsigned w = ln[l]->a[r] >> (16 * e) & 0xffffu;
                A[afrag_row(l, r)][afrag_col(l, r, e)] = half_bits_to_float(w, bf);
            }
            for (int r = 0; r < 2; ++r)
                B[2 * q + 8 * r + e][g] = half_bits_to_float(ln[l]->b[r] >> (16 * e) & 0xffffu, bf);
            C[g][2 * q + e] = ln[l]->d[e];
            C[g + 8][2 * q + e] = ln[l]->d[2 + e];
        }
    }
    float D[16][8];
    for (int i = 0; i < 16; ++i)
        for (int j = 0; j < 8; ++j) {
            double s = C[i][j];
            for (int k = 0; k < 16; ++k) s += (double)A[i][k] * (double)B[k][j];
            D[i][j] = toward_zero(s);
        }
    for (int l = 0; l < 32; ++l) {
        int g = l / 4, q = l % 4;
        for (int e = 0; e < 2; ++e) {
            ln[l]->d[e] = D[g][2 * q + e];
            ln[l]->d[2 + e] = D[g + 8][2 * q + e];
        }
    }
}

TN_RT void matrix_op(Fiber *warp, int wsize, int op, int line) {
    if (wsize != 32)
        fail(TN_EMU_COLLECTIVE_MISMATCH, line, "%s at line %d in a warp of %d lanes: tensor-core "
             "collectives need all 32", op_names[op], line, wsize);
    MatLane *ln[32];
    for (int k = 0; k < 32; ++k) ln[k] = (MatLane *)(uintptr_t)warp[k].val;
    matrix_compute(ln, op, line);
}
template <class T> static inline T shfl_at(int line, unsigned m, T v, int src, int w = S.lanes) {
    return from_bits<T>(collective(OP_SHFL_IDX, line, m, w, src, to_bits(v)));
}
template <class T> static inline T shfl_up_at(int line, unsigned m, T v, unsigned d, int w = S.lanes) {
    return from_bits<T>(collective(OP_SHFL_UP, line, m, w, (int)d, to_bits(v)));
}
template <class T> static inline T shfl_down_at(int line, unsigned m, T v, unsigned d, int w = S.lanes) {
    return from_bits<T>(collective(OP_SHFL_DOWN, line, m, w, (int)d, to_bits(v)));
}
template <class T> static inline T shfl_xor_at(int line, unsigned m, T v, int lm, int w = S.lanes) {
    return from_bits<T>(collective(OP_SHFL_XOR, line, m, w, lm, to_bits(v)));
}
static inline void ldsm_at(int line, unsigned *regs, const void *p, bool trans) {
    MatLane m{p, regs, nullptr, nullptr, nullptr};
    collective(trans ? OP_LDSM_T : OP_LDSM, line, 0xffffffffu, 32, 0, (uint64_t)(uintptr_t)&m);
}
/* wgmma (kind as WgPending::kind) of the n/2 accumulator registers at d: A
 * through the descriptor da, or (kind bit 16) in the 4 registers at a */
static inline void wgmma_issue_at(int line, int kind, int n, float *d, const void *a,
                                  uint64_t da, uint64_t db) {
    MatLane m{};
    m.kind = kind;
    m.d = d;
    m.a = (const unsigned *)a;
    m.da = da;
    m.db = db;
    m.n = n;
    m.wg = (S.cur->lin / 32) % 4;
    m.warp = S.cur->lin / 32;
    if (m.warp >= WG_WARPS)
        fail(TN_EMU_COLLECTIVE_MISMATCH, line, "wgmma at line %d in warp %d: a CUDA block has at "
             "most %d warps", line, m.warp, (int)WG_WARPS);
    m.group = S.cur->ext.wg_committed;
    collective((kind & 7) >= 2 ? OP_WGMMA_FP8 : (kind & 7) ? OP_WGMMA_BF16 : OP_WGMMA_F16,
               line, 0xffffffffu,
               32, 0, (uint64_t)(uintptr_t)&m);
}
static inline void wgmma_at(int line, int kind, int n, float *d, uint64_t da, uint64_t db) {
    wgmma_issue_at(line, kind, n, d, nullptr, da, db);
}
/* the register-A form: the lane's four A registers are those at a */
static inline void wgmma_ra_at(int line, int kind, int n, float *d, const void *a,
                               uint64_t db) {
    if ((kind & 7) >= 2)
        fail(TN_EMU_COLLECTIVE_MISMATCH, line, "wgmma at line %d: A in registers is emulated "
             "for 16-bit operands only", line);
    wgmma_issue_at(line, kind | 16, n, d, a, 0, db);
}
/* wgmma.fence, commit_group and wait_group are warpgroup instructions
 * (.sync.aligned): every thread of the executing thread's warpgroup runs
 * them, so a thread past the block's last whole warpgroup (a specialized
 * ring's producer warp) may not run them at all. */
static inline void wgmma_whole_group(const char *what) {
    const int g = S.cur->lin / 128;
    if (128 * (g + 1) > S.nthreads)
        fail(TN_EMU_COLLECTIVE_MISMATCH, 0, "%s run by thread %d of warpgroup %d, which the "
             "block of %d threads does not fill (a warpgroup instruction needs all 128 "
             "threads of its group)", what, S.cur->lin, g, S.nthreads);
}
static inline void wgmma_fence() { wgmma_whole_group("wgmma.fence"); }
static inline void wgmma_commit() {
    wgmma_whole_group("wgmma.commit_group");
    S.cur->ext.wg_committed++;
}
/* all but the thread's n newest groups complete: run its warp's older wgmmas */
static inline void wgmma_wait(int n) {
    wgmma_whole_group("wgmma.wait_group");
    WgQueue &q = wgq[S.cur->lin / 32];
    const int limit = S.cur->ext.wg_committed - n;
    int done = 0;
    while (done < q.n && q.items[done].group < limit) {
        const WgPending &p = q.items[done++];
        wgmma_run(p);
        /* a later wgmma of an accumulator this one wrote reads its result */
        for (int j = done; j < q.n; ++j) {
            WgPending &x = q.items[j];
            for (int l = 0; l < 32; ++l)
                if (x.d[l] < p.d[l] + p.n / 2 && p.d[l] < x.d[l] + x.n / 2)
                    x.dsum[l] = digest(x.d[l], x.n / 2);
        }
    }
    wg_completed[S.cur->lin / 32] += done;
    if (done) {
        memmove(q.items, q.items + done, sizeof(WgPending) * (size_t)(q.n - done));
        q.n -= done;
#ifdef __SANITIZE_THREAD__
        __tsan_release(&q.sync);
#endif
    }
#ifdef __SANITIZE_THREAD__
    __tsan_acquire(&q.sync); /* registers another lane's wait updated */
#endif
}
/* the address of p in the block's shared window: its offset in tn_smem */
static inline unsigned smem_addr(int line, const void *p) {
    const unsigned char *q = (const unsigned char *)p;
    if (q < tn_smem || q > tn_smem + TN_EMU_SMEM_STORAGE)
        fail(TN_EMU_MEMORY_FAULT, line, "line %d takes the shared address of %p, which is not in "
             "shared memory", line, p);
    return (unsigned)(q - tn_smem);
}
/* the n bytes at shared-window address a (smem_addr's inverse) */
static inline void *smem_ptr(int line, unsigned a, unsigned n) {
    if ((unsigned long long)a + n > TN_EMU_SMEM_STORAGE)
        fail(TN_EMU_MEMORY_FAULT, line, "line %d addresses %u bytes at shared address %#x, beyond "
             "the shared window (%u bytes)", line, n, a, (unsigned)TN_EMU_SMEM_STORAGE);
    return tn_smem + a;
}
static inline void mma_at(int line, bool bf, float *d, const unsigned *a, const unsigned *b) {
    MatLane m{nullptr, nullptr, d, a, b};
    collective(bf ? OP_MMA_BF16 : OP_MMA_F16, line, 0xffffffffu, 32, 0, (uint64_t)(uintptr_t)&m);
}
/* mma.sync m16n8k32 with FP8 operands (a5, b5: the operand is e5m2, else e4m3fn) */
static inline void mma8_at(int line, bool a5, bool b5, float *d, const unsigned *a,
                           const unsigned *b) {
    MatLane m{nullptr, nullptr, d, a, b};
    m.n = (a5 ? 1 : 0) | (b5 ? 2 : 0);
    collective(OP_MMA_FP8, line, 0xffffffffu, 32, 0, (uint64_t)(uintptr_t)&m);
}
static inline void syncwarp_at(int line, unsigned m = 0xffffffffu) { collective(OP_SYNCWARP, line, m, S.lanes, 0, 0); }
static inline unsigned ballot_at(int line, unsigned m, int p) { return (unsigned)collective(OP_BALLOT, line, m, S.lanes, 0, p != 0); }
static inline int any_at(int line, unsigned m, int p) { return (int)collective(OP_ANY, line, m, S.lanes, 0, p != 0); }
static inline int all_at(int line, unsigned m, int p) { return (int)collective(OP_ALL, line, m, S.lanes, 0, p != 0); }
static inline unsigned reduce_u(int op, int line, unsigned m, unsigned v) { return (unsigned)collective(op, line, m, S.lanes, 0, v); }
static inline int reduce_i(int op, int line, unsigned m, int v) { return (int)(uint32_t)collective(op, line, m, S.lanes, 1, (uint32_t)v); }
static inline unsigned reduce_add_at(int line, unsigned m, unsigned v) { return reduce_u(OP_RED_ADD, line, m, v); }
static inline int reduce_add_at(int line, unsigned m, int v) { return reduce_i(OP_RED_ADD, line, m, v); }
static inline unsigned reduce_min_at(int line, unsigned m, unsigned v) { return reduce_u(OP_RED_MIN, line, m, v); }
static inline int reduce_min_at(int line, unsigned m, int v) { return reduce_i(OP_RED_MIN, line, m, v); }
static inline unsigned reduce_max_at(int line, unsigned m, unsigned v) { return reduce_u(OP_RED_MAX, line, m, v); }
static inline int reduce_max_at(int line, unsigned m, int v) { return reduce_i(OP_RED_MAX, line, m, v); }
static inline unsigned reduce_and_at(int line, unsigned m, unsigned v) { return reduce_u(OP_RED_AND, line, m, v); }
static inline unsigned reduce_or_at(int line, unsigned m, unsigned v) { return reduce_u(OP_RED_OR, line, m, v); }
static inline unsigned reduce_xor_at(int line, unsigned m, unsigned v) { return reduce_u(OP_RED_XOR, line, m, v); }

/* cp.async of the running thread. async_issue queues the copy of `bytes`
 * source bytes (read by the caller) to `dst`, false when the thread's queue
 * is full (the caller completes the oldest copy first: a completion the
 * semantics permit);
 * async_commit closes a group; async_complete hands out the oldest pending
 * copy whose group is older than the `keep` newest committed ones (its byte
 * count, 0 when none is left; a negative `keep` reaches uncommitted copies
 * too), for the caller -- kernel code, seen by TSan -- to write. Groups
 * complete in order, as on the device. */
TN_RT bool async_issue(void *dst, const void *data, int bytes) {
    Fiber *me = S.cur;
    if (me->ext.npending == ASYNC_MAX) return false;
    AsyncCopy *c = &me->ext.pending[me->ext.npending++];
    c->dst = dst;
    c->bytes = bytes;
    c->group = me->ext.committed;
    async_words(c->data, data, bytes);
    return true;
}
TN_RT void async_commit() { S.cur->ext.committed++; }
TN_RT int async_complete(int keep, void **dst, unsigned char *out) {
    Fiber *me = S.cur;
    if (me->ext.npending == 0 || me->ext.pending[0].group >= me->ext.committed - keep) return 0;
    AsyncCopy *c = &me->ext.pending[0];
    int n = c->bytes;
    *dst = c->dst;
    async_words(out, c->data, n);
    --me->ext.npending;
    for (int k = 0; k < me->ext.npending; ++k) {  /* the queue moves up one */
        me->ext.pending[k].dst = me->ext.pending[k + 1].dst;
        me->ext.pending[k].bytes = me->ext.pending[k + 1].bytes;
        me->ext.pending[k].group = me->ext.pending[k + 1].group;
        async_words(me->ext.pending[k].data, me->ext.pending[k + 1].data, me->ext.pending[k + 1].bytes);
    }
    return n;
}

/* Bulk tensor copies (TMA) and their completion barriers (mbarrier).
 *
 * A completion barrier is 8 bytes of shared memory holding, in the emulator,
 * its state: bits 0-15 the arrivals a phase expects, 16-31 the arrivals
 * still pending, 32-62 the bytes still expected, 63 the phase parity. A bulk
 * copy is queued when issued (its source box gathered then, with the zeros
 * of the elements outside the tensor, and the swizzle applied to its shared
 * placement) and lands only when a thread waits on its barrier's phase: the
 * latest completion the PTX semantics permit, so a consumer that reads a
 * tile before waiting reads the poison or an older version. The queue is the
 * block's (one block runs at a time). */
struct TmaCopy {
    unsigned bar;
    unsigned char *dst;
    unsigned char *data;
    int bytes;
    int line;
    int issuer;  /* the thread that issued it */
};
static TmaCopy tmaq[256];
static int tman;
static inline uint64_t *mbar_word(int line, unsigned bar) {
    if (bar % 8)
        fail(TN_EMU_MEMORY_FAULT, line, "line %d: an mbarrier at shared address %#x, not 8-byte "
             "aligned", line, bar);
    return (uint64_t *)smem_ptr(line, bar, 8);
}
/* Per completion barrier, the wgmma reads still queued in the warps of the
 * threads that arrived in its current phase, and those of its last complete
 * phase: a thread that waits for that phase is ordered after the arrivals
 * but not after those reads, so a bulk copy it issues may not overwrite them
 * (tma_issue). */
struct MbarReads {
    unsigned bar;
    int ncur, ndone;
    WgRead cur[WG_READS_MAX], done[WG_READS_MAX];
};
enum { MBAR_TRACKED = 32 };
static MbarReads mbar_reads[MBAR_TRACKED];
static int n_mbar_reads;
static MbarReads &mbar_reads_of(int line, unsigned bar) {
    for (int i = 0; i < n_mbar_reads; ++i)
        if (mbar_reads[i].bar == bar) return mbar_reads[i];
    if (n_mbar_reads == MBAR_TRACKED)
        fail(TN_EMU_BAD_LAUNCH, line, "line %d: more than %d completion barriers in a block",
             line, (int)MBAR_TRACKED);
    MbarReads &r = mbar_reads[n_mbar_reads++];
    r.bar = bar;
    r.ncur = r.ndone = 0;
    return r;
}
static void add_read(int line, WgRead *set, int &n, const WgRead &x) {
    for (int i = 0; i < n; ++i)
        if (set[i].warp == x.warp && set[i].seq == x.seq && set[i].lo == x.lo) return;
    if (n == WG_READS_MAX)
        fail(TN_EMU_BAD_LAUNCH, line, "line %d: more than %d wgmma reads in flight across a "
             "completion barrier", line, (int)WG_READS_MAX);
    set[n++] = x;
}

TN_RT void mbar_init(int line, unsigned bar, unsigned count) {
    MbarReads &r = mbar_reads_of(line, bar);
    r.ncur = r.ndone = 0;
    if (count == 0 || count > 0xffffu)
        fail(TN_EMU_BAD_LAUNCH, line, "line %d: an mbarrier expecting %u arrivals", line, count);
    *mbar_word(line, bar) = (uint64_t)count | ((uint64_t)count << 16);
}
TN_RT void mbar_expect(int line, unsigned bar, unsigned bytes) {
    uint64_t *w = mbar_word(line, bar);
    const uint64_t expected = *w & 0xffffu, pending = (*w >> 16) & 0xffffu;
    if (pending != expected)
        fail(TN_EMU_ASYNC_PROTOCOL, line, "line %d: bulk copies signal the completion "
             "barrier at %#x while its previous phase awaits completion (%llu of %llu arrivals "
             "pending): a barrier is reused before the group it tracked was waited for",
             line, bar, (unsigned long long)pending, (unsigned long long)expected);
    const uint64_t tx = ((*w >> 32) & 0x7fffffffu) + bytes;
    *w = (*w & ~(0x7fffffffull << 32)) | ((tx & 0x7fffffffu) << 32);
}
TN_RT void mbar_arrive(int line, unsigned bar) {
    uint64_t *w = mbar_word(line, bar);
    {  /* what this thread's warp has not read yet is not ordered by the arrival */
        MbarReads &r = mbar_reads_of(line, bar);
        const int warp = S.cur->lin / 32;
        if (warp < WG_WARPS)
            for (int i = 0; i < wgq[warp].n; ++i) {
                WgRead two[2];
                const int nr = wgmma_reads_at(wgq[warp].items[i], warp, two);
                for (int j = 0; j < nr; ++j) add_read(line, r.cur, r.ncur, two[j]);
            }
    }
    const uint64_t pending = (*w >> 16) & 0xffffu;
    if (pending == 0)
        fail(TN_EMU_ASYNC_PROTOCOL, line, "line %d: an arrival on the mbarrier at %#x, "
             "whose phase has had all its arrivals", line, bar);
    *w -= 1ull << 16;
}
/* Queue the copy of `bytes` bytes to dst (the caller gathered them). */
TN_RT void tma_issue(int line, unsigned bar, void *dst, const unsigned char *data, int bytes) {
    if (tman == (int)(sizeof tmaq / sizeof tmaq[0]))
        fail(TN_EMU_BAD_LAUNCH, line, "line %d: more than %d bulk copies in flight", line, tman);
    /* the copy may land at any time from now on: no wgmma still queued may
     * read what it writes (a slot released before its mma completed) */
    const uint32_t lo = (uint32_t)((unsigned char *)dst - tn_smem), hi = lo + (uint32_t)bytes;
    for (int w = 0; w < WG_WARPS; ++w)
        for (int i = 0; i < wgq[w].n; ++i) {
            WgRead two[2];
            const int nr = wgmma_reads_at(wgq[w].items[i], w, two);
            for (int j = 0; j < nr; ++j)
                if (two[j].lo < hi && lo < two[j].hi)
                    fail(TN_EMU_ASYNC_PROTOCOL, line, "line %d: a bulk copy overwrites "
                         "shared memory that the wgmma warp %d issued at line %d has not read "
                         "yet: its buffer was released before that mma completed", line, w,
                         wgq[w].items[i].line);
        }
    /* ... nor one whose reads the issuing thread is not ordered after */
    const CudaFiber &me = S.cur->ext;
    for (int i = 0; i < me.nunordered; ++i)
        if (me.unordered[i].lo < hi && lo < me.unordered[i].hi)
            fail(TN_EMU_ASYNC_PROTOCOL, line, "line %d: a bulk copy overwrites shared memory "
                 "that wgmma %d of warp %d may not have read yet: it was still queued when "
                 "its warp released the buffer on the completion barrier this thread waited "
                 "for", line, me.unordered[i].seq, me.unordered[i].warp);
    unsigned char *copy = (unsigned char *)malloc((size_t)bytes);
    memcpy(copy, data, (size_t)bytes);
    tmaq[tman++] = TmaCopy{bar, (unsigned char *)dst, copy, bytes, line, S.cur->lin};
}
/* Whether the phase of parity `parity` of the barrier at `bar` is complete;
 * the copies it waits for land first when its arrivals are all in. */
TN_RT bool mbar_test(int line, unsigned bar, unsigned parity) {
    uint64_t *w = mbar_word(line, bar);
    if ((*w >> 63) != (parity & 1u)) return true;
    if ((*w >> 16) & 0xffffu) return false;  /* arrivals pending */
    int kept = 0;
    uint64_t tx = (*w >> 32) & 0x7fffffffu;
    for (int i = 0; i < tman; ++i) {
        TmaCopy &c = tmaq[i];
        if (c.bar != bar) {
            tmaq[kept++] = c;
            continue;
        }
        memcpy(c.dst, c.data, (size_t)c.bytes);
        free(c.data);
        if ((uint64_t)c.bytes > tx)
            fail(TN_EMU_ASYNC_PROTOCOL, c.line, "line %d: a bulk copy of %d bytes signals "
                 "a barrier expecting only %llu more", c.line, c.bytes, (unsigned long long)tx);
        tx -= (uint64_t)c.bytes;
    }
    tman = kept;
    if (tx)
        fail(TN_EMU_ASYNC_PROTOCOL, line, "line %d: the completion barrier at %#x expects %llu bytes "
             "that no bulk copy brings", line, bar, (unsigned long long)tx);
    const uint64_t expected = *w & 0xffffu;
    *w = (expected | (expected << 16)) | ((uint64_t)((*w >> 63) ^ 1u) << 63);
    {  /* the phase is complete: its arrivals' unread wgmma operands go with it */
        MbarReads &r = mbar_reads_of(line, bar);
        memcpy(r.done, r.cur, sizeof(WgRead) * (size_t)r.ncur);
        r.ndone = r.ncur;
        r.ncur = 0;
    }
#ifdef __SANITIZE_THREAD__
    __tsan_release(w);
#endif
    return true;
}
TN_RT void mbar_wait(int line, unsigned bar, unsigned parity) {
    for (long polls = 0; !mbar_test(line, bar, parity); ++polls) {
        if (polls > 4096)  /* every other thread ran until it blocked, 4096 times */
            fail(TN_EMU_DEADLOCK, line, "line %d: the wait for phase parity %u of the completion "
                 "barrier at %#x never ends (an arrival is missing)", line, parity, bar);
        poll_again();
    }
    const MbarReads &r = mbar_reads_of(line, bar);
    memcpy(S.cur->ext.unordered, r.done, sizeof(WgRead) * (size_t)r.ndone);
    S.cur->ext.nunordered = r.ndone;
#ifdef __SANITIZE_THREAD__
    __tsan_acquire(mbar_word(line, bar));
#endif
}
/* A block barrier: every wgmma complete before it is ordered before what
 * follows it in every thread. */
TN_RT int cuda_syncthreads(int line, int pred) {
    const int r = syncthreads_impl(line, pred);
    CudaFiber &me = S.cur->ext;
    int kept = 0;
    for (int i = 0; i < me.nunordered; ++i)
        if (me.unordered[i].seq >= wg_completed[me.unordered[i].warp])
            me.unordered[kept++] = me.unordered[i];
    me.nunordered = kept;
    return r;
}

/* The runtime's hooks: a block starts with no wgmma or bulk copy pending; a
 * thread may not exit with its warp's wgmmas pending, nor the issuing thread
 * with bulk copies in flight. */
TN_RT void cuda_block_start() {
    for (WgQueue &q : wgq) q.n = 0;
    for (int w = 0; w < WG_WARPS; ++w) wg_issued[w] = wg_completed[w] = 0;
    n_mbar_reads = 0;
    for (int i = 0; i < tman; ++i) free(tmaq[i].data);
    tman = 0;
}
TN_RT void cuda_thread_exit(Fiber *me) {
    for (int i = 0; i < tman; ++i)
        if (tmaq[i].issuer == me->lin)
            fail(TN_EMU_ASYNC_PROTOCOL, tmaq[i].line,
                 "thread %d exits while the bulk copy it issued at line %d is in flight: a "
                 "wait on its completion barrier is missing", me->lin, tmaq[i].line);
    if (me->lin / 32 >= WG_WARPS) return;  /* a warp that cannot have issued a wgmma */
    const WgQueue &wq = wgq[me->lin / 32];
    if (wq.n)
        fail(TN_EMU_COLLECTIVE_EXITED, wq.items[0].line,
             "thread %d exits while the wgmma its warp issued at line %d is not complete: a "
             "wgmma wait_group is missing", me->lin, wq.items[0].line);
}

} /* namespace tn_emu */


/* ------------------------------------------------------- CUDA builtin names */
#define threadIdx (tn_emu::cur_thread_idx())
#define blockIdx (tn_emu::cur_block_idx())
#define blockDim (tn_emu::cur_block_dim())
#define gridDim (tn_emu::cur_grid_dim())
#define warpSize (tn_emu::S.lanes)

#define __syncthreads() tn_emu::cuda_syncthreads(__LINE__, 0)
#define __syncthreads_count(p) tn_emu::cuda_syncthreads(__LINE__, (p) != 0)
#define __syncthreads_and(p) (tn_emu::cuda_syncthreads(__LINE__, (p) != 0) == (int)tn_emu::S.nthreads)
#define __syncthreads_or(p) (tn_emu::cuda_syncthreads(__LINE__, (p) != 0) != 0)
#define __syncwarp(...) tn_emu::syncwarp_at(__LINE__, ##__VA_ARGS__)
#define __shfl_sync(...) tn_emu::shfl_at(__LINE__, __VA_ARGS__)
#define __shfl_up_sync(...) tn_emu::shfl_up_at(__LINE__, __VA_ARGS__)
#define __shfl_down_sync(...) tn_emu::shfl_down_at(__LINE__, __VA_ARGS__)
#define __shfl_xor_sync(...) tn_emu::shfl_xor_at(__LINE__, __VA_ARGS__)
#define __ballot_sync(m, p) tn_emu::ballot_at(__LINE__, (m), (p))
#define __any_sync(m, p) tn_emu::any_at(__LINE__, (m), (p))
#define __all_sync(m, p) tn_emu::all_at(__LINE__, (m), (p))
#define __reduce_add_sync(m, v) tn_emu::reduce_add_at(__LINE__, (m), (v))
#define __reduce_min_sync(m, v) tn_emu::reduce_min_at(__LINE__, (m), (v))
#define __reduce_max_sync(m, v) tn_emu::reduce_max_at(__LINE__, (m), (v))
#define __reduce_and_sync(m, v) tn_emu::reduce_and_at(__LINE__, (m), (v))
#define __reduce_or_sync(m, v) tn_emu::reduce_or_at(__LINE__, (m), (v))
#define __reduce_xor_sync(m, v) tn_emu::reduce_xor_at(__LINE__, (m), (v))
#define __activemask() tn_emu::activemask()
#define __trap() tn_emu::trap_at(__LINE__)
#define __brkpt() tn_emu::trap_at(__LINE__)

static inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

/* ---------------------------------------------------------------- atomics
 * Relaxed host atomics: TSan sees them as atomic (no race among atomics, no
 * happens-before), like CUDA's relaxed device-scope atomics. */
#define TN_ATOMIC_INT(T)                                                                        \
    static inline T atomicAdd(T *p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); } \
    static inline T atomicSub(T *p, T v) { return __atomic_fetch_sub(p, v, __ATOMIC_RELAXED); } \
    static inline T atomicOr(T *p, T v) { return __atomic_fetch_or(p, v, __ATOMIC_RELAXED); }   \
    static inline T atomicAnd(T *p, T v) { return __atomic_fetch_and(p, v, __ATOMIC_RELAXED); } \
    static inline T atomicXor(T *p, T v) { return __atomic_fetch_xor(p, v, __ATOMIC_RELAXED); } \
    static inline T atomicExch(T *p, T v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); } \
    static inline T atomicCAS(T *p, T cmp, T v) {                                               \
        __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);     \
        return cmp;                                                                             \
    }                                                                                           \
    static inline T atomicMax(T *p, T v) {                                                      \
        T old = __atomic_load_n(p, __ATOMIC_RELAXED);                                           \
        while (old < v && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {} \
        return old;                                                                             \
    }                                                                                           \
    static inline T atomicMin(T *p, T v) {                                                      \
        T old = __atomic_load_n(p, __ATOMIC_RELAXED);                                           \
        while (old > v && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {} \
        return old;                                                                             \
    }
TN_ATOMIC_INT(int)
TN_ATOMIC_INT(unsigned int)
TN_ATOMIC_INT(unsigned long long)
TN_ATOMIC_INT(long long)
#undef TN_ATOMIC_INT

template <class F, class B>
static inline F tn_atomic_float_rmw(F *p, F v, F (*op)(F, F)) {
    B *q = reinterpret_cast<B *>(p);
    B old = __atomic_load_n(q, __ATOMIC_RELAXED);
    for (;;) {
        F of, nf;
        memcpy(&of, &old, sizeof(F));
        nf = op(of, v);
        B nb;
        memcpy(&nb, &nf, sizeof(F));
        if (__atomic_compare_exchange_n(q, &old, nb, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return of;
    }
}
static inline float atomicAdd(float *p, float v) {
    return tn_atomic_float_rmw<float, uint32_t>(p, v, [](float a, float b) { return a + b; });
}
static inline double atomicAdd(double *p, double v) {
    return tn_atomic_float_rmw<double, uint64_t>(p, v, [](double a, double b) { return a + b; });
}
static inline float atomicExch(float *p, float v) {
    return tn_atomic_float_rmw<float, uint32_t>(p, v, [](float, float b) { return b; });
}
static inline float atomicMax(float *p, float v) {
    return tn_atomic_float_rmw<float, uint32_t>(p, v, [](float a, float b) { return fmaxf(a, b); });
}
static inline float atomicMin(float *p, float v) {
    return tn_atomic_float_rmw<float, uint32_t>(p, v, [](float a, float b) { return fminf(a, b); });
}

/* -------------------------------------------------------------- intrinsics */
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline float __frcp_rn(float a) { return 1.0f / a; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }
static inline double __dsqrt_rn(double a) { return sqrt(a); }
static inline double __drcp_rn(double a) { return 1.0 / a; }
static inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
/* Fast-math intrinsics give the accurate function. glibc's <math.h> declares
 * __expf, __logf, ... as its own internal names, which no library exports to a
 * loadable module, so each is a macro for the public function (defined after
 * <math.h>, which the shim has already included). */
#define __expf(x) expf(x)
#define __exp10f(x) exp10f(x)
#define __logf(x) logf(x)
#define __log2f(x) log2f(x)
#define __log10f(x) log10f(x)
#define __sinf(x) sinf(x)
#define __cosf(x) cosf(x)
#define __tanf(x) tanf(x)
#define __powf(x, y) powf((x), (y))
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __saturatef(float a) { return a >= 1.0f ? 1.0f : (a > 0.0f ? a : 0.0f); }
static inline float rsqrtf(float a) { return 1.0f / sqrtf(a); }
static inline double rsqrt(double a) { return 1.0 / sqrt(a); }
static inline float __frsqrt_rn(float a) { return 1.0f / sqrtf(a); }

template <class To, class From>
static inline To tn_bit_cast(From v) {
    static_assert(sizeof(To) == sizeof(From), "bit cast between types of different size");
    To t;
    memcpy(&t, &v, sizeof t);
    return t;
}
static inline int __float_as_int(float x) { return tn_bit_cast<int>(x); }
static inline float __int_as_float(int x) { return tn_bit_cast<float>(x); }
static inline unsigned int __float_as_uint(float x) { return tn_bit_cast<unsigned int>(x); }
static inline float __uint_as_float(unsigned int x) { return tn_bit_cast<float>(x); }
static inline long long __double_as_longlong(double x) { return tn_bit_cast<long long>(x); }
static inline double __longlong_as_double(long long x) { return tn_bit_cast<double>(x); }
static inline int __double2hiint(double x) { return (int)(tn_bit_cast<unsigned long long>(x) >> 32); }
static inline int __double2loint(double x) { return (int)(unsigned)tn_bit_cast<unsigned long long>(x); }
static inline double __hiloint2double(int hi, int lo) {
    return tn_bit_cast<double>(((unsigned long long)(unsigned)hi << 32) | (unsigned)lo);
}

static inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
static inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
static inline int __popc(unsigned int x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __ffsll(long long x) { return __builtin_ffsll(x); }
static inline unsigned int __brev(unsigned int x) {
    x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
    x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
    x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
    x = ((x >> 8) & 0x00ff00ffu) | ((x & 0x00ff00ffu) << 8);
    return (x >> 16) | (x << 16);
}
static inline unsigned long long __brevll(unsigned long long x) {
    return ((unsigned long long)__brev((unsigned)x) << 32) | __brev((unsigned)(x >> 32));
}
static inline unsigned int __umulhi(unsigned int a, unsigned int b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
static inline int __mulhi(int a, int b) { return (int)(((long long)a * b) >> 32); }
static inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
static inline long long __mul64hi(long long a, long long b) { return (long long)(((__int128)a * b) >> 64); }
static inline int __mul24(int a, int b) { return (int)((long long)((a << 8) >> 8) * ((b << 8) >> 8)); }
static inline unsigned int __umul24(unsigned int a, unsigned int b) { return (a & 0xffffffu) * (b & 0xffffffu); }

template <class T> static inline T __ldg(const T *p) { return *p; }
template <class T> static inline T __ldcg(const T *p) { return *p; }
template <class T> static inline T __ldca(const T *p) { return *p; }
template <class T> static inline T __ldcs(const T *p) { return *p; }
template <class T> static inline void __stcg(T *p, T v) { *p = v; }
template <class T> static inline void __stcs(T *p, T v) { *p = v; }
template <class T> static inline void __stwb(T *p, T v) { *p = v; }

/* CUDA's min/max overloads (integers as in CUDA's math header; floats as fminf/fmaxf). */
#define TN_MINMAX(R, A, B)                                                  \
    static inline R min(A a, B b) { return (R)a < (R)b ? (R)a : (R)b; }     \
    static inline R max(A a, B b) { return (R)a > (R)b ? (R)a : (R)b; }
TN_MINMAX(int, int, int)
TN_MINMAX(unsigned int, unsigned int, unsigned int)
TN_MINMAX(unsigned int, int, unsigned int)
TN_MINMAX(unsigned int, unsigned int, int)
TN_MINMAX(long, long, long)
TN_MINMAX(unsigned long, unsigned long, unsigned long)
TN_MINMAX(long long, long long, long long)
TN_MINMAX(unsigned long long, unsigned long long, unsigned long long)
TN_MINMAX(unsigned long long, long long, unsigned long long)
TN_MINMAX(unsigned long long, unsigned long long, long long)
#undef TN_MINMAX
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline double min(double a, double b) { return fmin(a, b); }
static inline double max(double a, double b) { return fmax(a, b); }
static inline double min(float a, double b) { return fmin(a, b); }
static inline double max(float a, double b) { return fmax(a, b); }
static inline double min(double a, float b) { return fmin(a, b); }
static inline double max(double a, float b) { return fmax(a, b); }

#endif /* TN_CUDA_SHIM_H */
