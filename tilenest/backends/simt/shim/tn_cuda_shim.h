/* tn_cuda_shim.h -- run the CUDA C++ that tilenest emits as host C++.
 *
 * The emulator compiles a generated CUDA source with
 *     g++ -x c++ -std=c++17 -DTN_EMULATE -include tn_cuda_shim.h SOURCE
 * This header supplies what nvcc would: the CUDA qualifiers, the index
 * builtins, one dynamic shared-memory array `tn_smem`, barriers, warp
 * collectives, atomics and intrinsics, and a launcher that runs every GPU
 * thread of a block as a fiber (ucontext).
 *
 * Meaning of one launch:
 *   - blocks run one after another (in order, or a seeded shuffle);
 *   - before each block, `tn_smem` (the whole capacity) is filled with poison;
 *   - the threads of a block are fibers that switch ONLY at barriers and warp
 *     collectives, so the code between two switch points of a thread runs
 *     atomically; at each switch point the scheduler picks the next runnable
 *     fiber by the launch's interleaving policy;
 *   - __syncthreads() releases when every thread of the block has arrived; a
 *     thread that exited while others wait (or arrive) at a barrier is a
 *     divergent barrier and an error, never a hang;
 *   - a warp collective is a rendezvous of the lanes in its mask: every lane
 *     deposits its value and all read after the last one arrived; a mask
 *     that omits the caller, lanes of one rendezvous with different masks (or
 *     different collectives), a mask lane that exited, and any state where no
 *     fiber can run are errors;
 *   - an error stops the launch and is returned in tn_emu_err.
 *
 * Under -fsanitize=thread (__SANITIZE_THREAD__) every GPU thread is a TSan
 * fiber; switches carry no happens-before; a barrier or collective instance
 * is a fresh sync object that every participant releases on arrival and
 * acquires on departure, so only accesses that CUDA leaves unordered race.
 * The emulator's own bookkeeping is not instrumented (TN_RT).
 *
 * Everything here has internal linkage (static), so several emulator
 * libraries in one process never share state.
 */
#ifndef TN_CUDA_SHIM_H
#define TN_CUDA_SHIM_H

#ifndef TN_EMULATE
#define TN_EMULATE 1
#endif

/* Standard headers first: the CUDA qualifier macros below (__noinline__ in
 * particular) would break libstdc++ headers included after them. */
#include <algorithm>
#include <array>
#include <atomic>
#include <cassert>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <new>
#include <tuple>
#include <type_traits>
#include <utility>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#ifdef __SANITIZE_THREAD__
#include <sanitizer/tsan_interface.h>
extern "C" void AnnotateIgnoreWritesBegin(const char *f, int l);
extern "C" void AnnotateIgnoreWritesEnd(const char *f, int l);
#define TN_RT static __attribute__((no_sanitize_thread, noinline))
#else
#define TN_RT static
#endif

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
struct uint3 { unsigned int x, y, z; };
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

/* ------------------------------------------------------------ C launch ABI */
extern "C" {
/** One launch's configuration (mirrored by emulator.py with ctypes). */
struct tn_emu_cfg {
    uint32_t grid[3];
    uint32_t block[3];
    uint64_t shared_bytes;
    uint64_t stack_bytes;
    uint64_t seed;
    int32_t policy;      /* 0 in_order, 1 reversed, 2 warp_ahead, 3 random */
    int32_t poison;      /* 0 nan (0x7fc00000 words), 1 big (0x7f7fffff words), 2 bytes (0xa5) */
    int32_t block_order; /* 0 in order, 1 seeded shuffle */
    int32_t flags;       /* reserved, 0 */
};
/** What went wrong (code 0: nothing). Thread/block are those of the culprit. */
struct tn_emu_err {
    int32_t code;
    int32_t line;
    uint32_t block[3];
    uint32_t thread[3];
    char message[2048];
};
}

enum {
    TN_EMU_OK = 0,
    TN_EMU_DIVERGENT_BARRIER = 1,
    TN_EMU_COLLECTIVE_MISMATCH = 2,
    TN_EMU_DEADLOCK = 3,
    TN_EMU_STACK_OVERFLOW = 4,
    TN_EMU_MEMORY_FAULT = 5,
    TN_EMU_TRAP = 6,
    TN_EMU_BAD_LAUNCH = 7,
    TN_EMU_ARITH_FAULT = 8,
    TN_EMU_COLLECTIVE_EXITED = 9,
};

#define TN_SMEM_CAPACITY (228u * 1024u)
#ifndef TN_TSAN_MAX_FIBERS
#define TN_TSAN_MAX_FIBERS 4096
#endif

/* The one dynamic shared-memory array; a kernel's
 * `extern __shared__ __align__(16) unsigned char tn_smem[];` redeclares it
 * (and inherits its internal linkage). Page aligned so that the TSan build
 * can reset its shadow per block. */
alignas(4096) static unsigned char tn_smem[TN_SMEM_CAPACITY];

namespace tn_emu {

enum FState { F_READY, F_RUNNING, F_BARRIER, F_COLL, F_DONE, F_ABORTED };
enum Op {
    OP_SYNCWARP, OP_SHFL_IDX, OP_SHFL_UP, OP_SHFL_DOWN, OP_SHFL_XOR,
    OP_BALLOT, OP_ANY, OP_ALL, OP_RED_ADD, OP_RED_MIN, OP_RED_MAX,
    OP_RED_AND, OP_RED_OR, OP_RED_XOR, OP_LDSM, OP_LDSM_T, OP_MMA_BF16, OP_MMA_F16,
    OP_WGMMA_BF16, OP_WGMMA_F16, OP_NOPS
};
static const char *const op_names[OP_NOPS] = {
    "__syncwarp", "__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync",
    "__ballot_sync", "__any_sync", "__all_sync", "__reduce_add_sync", "__reduce_min_sync",
    "__reduce_max_sync", "__reduce_and_sync", "__reduce_or_sync", "__reduce_xor_sync",
    "ldmatrix.x4", "ldmatrix.x4.trans", "mma.m16n8k16.bf16", "mma.m16n8k16.f16",
    "wgmma.m64nNk16.bf16", "wgmma.m64nNk16.f16"};

/* An asynchronous copy (cp.async) issued and not yet complete: its source
 * bytes, read at issue, land in `dst` when a wait orders its group. */
struct AsyncCopy {
    void *dst;
    int bytes;
    int group;           /* the fiber's commit count at issue */
    alignas(16) unsigned char data[32];
};
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
enum { ASYNC_MAX = 64 };  /* pending copies per thread; the oldest completes early past it */

struct Fiber {
    ucontext_t ctx;
    char *stack_lo;      /* lowest usable byte; the guard page lies below */
    uint3 tid;
    int lin;             /* linear thread index in the block */
    int state;
    int line;            /* source line of the switch point it waits at */
    int op;              /* collective op (F_COLL) */
    unsigned mask;
    int width;
    int arg;             /* srcLane / delta / laneMask / signedness */
    uint64_t val;
    uint64_t res;
    void *tsan_fiber;
    long *token;         /* TSan sync object of the rendezvous it takes part in */
    int committed;       /* cp.async groups committed */
    int wg_committed;    /* wgmma groups committed */
    int npending;
    AsyncCopy pending[ASYNC_MAX];  /* oldest first */
};

/* A wgmma a warp issued and nobody has waited for yet (see wgmma_compute):
 * its shape, descriptors, the warp's index in its warpgroup, each lane's
 * accumulator registers, and its group (the lanes' commit count at issue). */
struct WgPending {
    bool bf;
    int n, wg, line, group;
    uint64_t da, db;
    float *d[32];
};
enum { WG_MAX = 64 };  /* pending wgmmas per warp */
struct WgQueue {
    int n;
    WgPending items[WG_MAX];  /* oldest first */
    long sync;                /* TSan: completions happen before later waits */
};

struct State {
    pthread_mutex_t lock;
    /* launch */
    const char *kernel;
    void (*thunk)(void **);
    void **args;
    tn_emu_cfg cfg;
    tn_emu_err *err;
    dim3 grid, block;
    uint3 block_idx;
    uint3 thread_idx;
    int nthreads;
    uint64_t rng;
    int ahead_warp;
    uint32_t poison32;
    uint64_t poison64;
    /* block */
    Fiber *fibers;
    Fiber *cur;
    ucontext_t sched;
    int done;
    int at_barrier;
    int barrier_line;
    int barrier_count;
    long *barrier_token;
    WgQueue wgq[32];     /* each warp's issued, not yet complete wgmmas */
    /* fiber stacks: one mapping, a guard page below each stack */
    char *pool;
    size_t pool_bytes;
    size_t slot_bytes;
    int pool_slots;
    /* faults */
    volatile int in_launch;
    pthread_t launch_thread;
    struct sigaction old_act[3];
    stack_t old_altstack;
    char *altstack;
    void *tsan_main;
    long tsan_exit;
    void **tsan_fibers;   /* every fiber of the launch, destroyed at its end */
    uint64_t tsan_count, tsan_cap;
};
static State S = {PTHREAD_MUTEX_INITIALIZER};

static inline size_t page_size() { return (size_t)sysconf(_SC_PAGESIZE); }

/* ------------------------------------------------------------- error text */
TN_RT void vformat_err(int code, int line, const Fiber *f, const char *fmt, va_list ap) {
    if (S.err->code != TN_EMU_OK) return;
    S.err->code = code;
    S.err->line = line;
    S.err->block[0] = S.block_idx.x; S.err->block[1] = S.block_idx.y; S.err->block[2] = S.block_idx.z;
    if (f) {
        S.err->thread[0] = f->tid.x; S.err->thread[1] = f->tid.y; S.err->thread[2] = f->tid.z;
    }
    vsnprintf(S.err->message, sizeof S.err->message, fmt, ap);
}

TN_RT void set_err(int code, int line, const Fiber *f, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vformat_err(code, line, f, fmt, ap);
    va_end(ap);
}

/** Append "a-b,c": the linear ids of the block's threads in `state`. */
TN_RT void ranges(char *buf, size_t cap, int state) {
    size_t n = strlen(buf);
    bool first = true;
    const int hi = S.nthreads;
    for (int i = 0; i < hi; ++i) {
        if (S.fibers[i].state != state) continue;
        int j = i;
        while (j + 1 < hi && S.fibers[j + 1].state == state) ++j;
        n += snprintf(buf + n, n < cap ? cap - n : 0, first ? "%d" : ",%d", i);
        if (j > i) n += snprintf(buf + n, n < cap ? cap - n : 0, "-%d", j);
        first = false;
        i = j;
    }
    if (first) snprintf(buf + n, n < cap ? cap - n : 0, "none");
}

/* -------------------------------------------------------------- switching */
TN_RT void yield_to_scheduler() {
    Fiber *me = S.cur;
#ifdef __SANITIZE_THREAD__
    __tsan_switch_to_fiber(S.tsan_main, __tsan_switch_to_fiber_no_sync);
#endif
    swapcontext(&me->ctx, &S.sched);
}

/** Stop the calling fiber for good after an error; the launch ends. */
[[noreturn]] TN_RT void abort_fiber() {
    S.cur->state = F_ABORTED;
#ifdef __SANITIZE_THREAD__
    __tsan_release(&S.tsan_exit); /* the error text it wrote is read after the launch */
#endif
    yield_to_scheduler();
    abort(); /* never resumed */
}

[[noreturn]] TN_RT void fail(int code, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vformat_err(code, line, S.cur, fmt, ap);
    va_end(ap);
    abort_fiber();
}

#ifdef __SANITIZE_THREAD__
TN_RT long *new_token() {
    long *t = (long *)malloc(sizeof(long));
    *t = 0;
    return t;
}
TN_RT void depart(Fiber *me) {
    long *t = me->token;
    me->token = nullptr;
    __tsan_acquire(t);
    if (--*t == 0) free(t);
}
#endif

/* --------------------------------------------------------------- barriers */
TN_RT int syncthreads_impl(int line, int pred) {
    Fiber *me = S.cur;
    if (S.done > 0) {
        char who[512] = "";
        ranges(who, sizeof who, F_DONE);
        fail(TN_EMU_DIVERGENT_BARRIER, line,
             "divergent barrier: thread %d reaches __syncthreads() at line %d but threads [%s] "
             "of the block already exited without reaching it",
             me->lin, line, who);
    }
    if (S.at_barrier > 0 && S.barrier_line != line && S.barrier_line > 0 && line > 0)
        fail(TN_EMU_DIVERGENT_BARRIER, line,
             "divergent barrier: thread %d reaches __syncthreads() at line %d while other "
             "threads wait at the one at line %d",
             me->lin, line, S.barrier_line);
    for (int i = 0; i < S.nthreads; ++i) {
        Fiber *f = &S.fibers[i];
        if (f->state == F_COLL && (f->lin & ~31) == (me->lin & ~31) && (f->mask >> (me->lin & 31) & 1u))
            fail(TN_EMU_DEADLOCK, line,
                 "deadlock: thread %d waits at __syncthreads() (line %d) while lane %d of its warp "
                 "waits for it in %s (line %d, mask 0x%08x)",
                 me->lin, line, f->lin & 31, op_names[f->op], f->line, f->mask);
    }
    if (S.at_barrier == 0) {
        S.barrier_line = line;
        S.barrier_count = 0;
#ifdef __SANITIZE_THREAD__
        S.barrier_token = new_token();
#endif
    }
    S.at_barrier++;
    S.barrier_count += pred != 0;
    me->state = F_BARRIER;
    me->line = line;
#ifdef __SANITIZE_THREAD__
    me->token = S.barrier_token;
    ++*me->token;
    __tsan_release(me->token);
#endif
    if (S.at_barrier == S.nthreads) {
        for (int i = 0; i < S.nthreads; ++i) {
            S.fibers[i].state = F_READY;
            S.fibers[i].res = (uint64_t)S.barrier_count;
        }
        S.at_barrier = 0;
        S.barrier_token = nullptr;
    }
    yield_to_scheduler();
#ifdef __SANITIZE_THREAD__
    depart(me);
#endif
    return (int)me->res;
}

/* ------------------------------------------------------------ collectives */
static inline bool pow2_width(int w) { return w >= 1 && w <= 32 && (w & (w - 1)) == 0; }

/** The value lane `l` receives when a rendezvous of `op` completes. */
TN_RT uint64_t collective_result(Fiber *warp, int l, int wsize) {
    Fiber *me = &warp[l];
    unsigned mask = me->mask;
    int w = me->width;
    int src = l;
    switch (me->op) {
    case OP_SYNCWARP: return 0;
    case OP_SHFL_IDX: src = (l & ~(w - 1)) + (me->arg & (w - 1)); break;
    case OP_SHFL_UP: src = ((l & (w - 1)) < me->arg) ? l : l - me->arg; break;
    case OP_SHFL_DOWN: src = ((l & (w - 1)) + me->arg >= w) ? l : l + me->arg; break;
    case OP_SHFL_XOR: src = l ^ (me->arg & 31); if (src > (l | (w - 1))) src = l; break;
    default: {
        uint64_t acc = 0;
        bool first = true;
        for (int k = 0; k < wsize; ++k) {
            if (!(mask >> k & 1u)) continue;
            uint64_t v = warp[k].val;
            switch (me->op) {
            case OP_BALLOT: case OP_ANY: case OP_ALL: acc |= (v != 0 ? 1ull : 0ull) << k; break;
            case OP_RED_ADD: acc = (uint32_t)(acc + v); break;
            case OP_RED_MIN:
                if (first) acc = v;
                else acc = me->arg ? (uint64_t)(uint32_t)std::min((int32_t)acc, (int32_t)v) : std::min(acc, v);
                break;
            case OP_RED_MAX:
                if (first) acc = v;
                else acc = me->arg ? (uint64_t)(uint32_t)std::max((int32_t)acc, (int32_t)v) : std::max(acc, v);
                break;
            case OP_RED_AND: acc = first ? v : (acc & v); break;
            case OP_RED_OR: acc |= v; break;
            case OP_RED_XOR: acc ^= v; break;
            }
            first = false;
        }
        if (me->op == OP_ANY) return acc != 0;
        if (me->op == OP_ALL) return acc == mask;
        return acc;
    }
    }
    /* a source lane outside the rendezvous gives an undefined value: poison */
    if (src < 0 || src >= wsize || !(mask >> src & 1u)) return S.poison64;
    return warp[src].val;
}

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
 *     C/D 16x8 f32: d0 (g, 2q), d1 (g, 2q+1), d2 (g+8, 2q), d3 (g+8, 2q+1).
 * The arithmetic models the tensor cores' accumulation: the products are
 * exact, each output is c + the 16 products summed in double, then rounded
 * toward zero to f32 (the hardware truncates; V-22 admits faithful rounding). */
struct MatLane {
    const void *src;     /* ldmatrix: this lane's row address */
    unsigned *regs;      /* ldmatrix: the four registers it receives */
    float *d;            /* mma: accumulator fragment (read and written) */
    const unsigned *a;   /* mma: A fragment (4 registers) */
    const unsigned *b;   /* mma: B fragment (2 registers) */
    uint64_t da, db;     /* wgmma: the shared-memory matrix descriptors of A and B */
    int n;               /* wgmma: columns of the tile */
    int wg;              /* wgmma: this warp's index in its warpgroup */
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

static inline float toward_zero(double x) {
    float f = (float)x;
    if (std::isfinite(x) && std::fabs((double)f) > std::fabs(x)) f = std::nextafter(f, 0.0f);
    return f;
}

/* wgmma.mma_async m64nNk16 (f32 += f16/bf16 x f16/bf16, A K-major and B
 * MN-major ("transposed") in shared memory, each described by a matrix
 * descriptor: start address, leading and stride byte offsets in 16-byte
 * units, 14 bits each, and the swizzle mode in bits 62-63) is a collective of
 * the warpgroup's four warps; each warp's result rows depend on its own 16 rows
 * of A and all of B, so the emulator runs it as a collective of each warp
 * (the descriptors uniform over the warp) computing rows 16 wg .. 16 wg + 15.
 * Operand element addresses follow the canonical layouts of the 128-byte
 * swizzle mode, the only one emulated: A (r, k): start + (r % 8) 128 +
 * (r / 8) SBO + 2 k; B (k, j): start + 2 (j % 64) + (j / 64) LBO + (k % 8) 128
 * + (k / 8) SBO; then the swizzle of the address itself, bits 4-6 XOR bits 7-9.
 * The accumulator of lane l is d[4 q + 2 h + e] = D(16 wg + l / 4 + 8 h,
 * 8 q + 2 (l % 4) + e). Like the device, the emulator runs it asynchronously:
 * issuing queues it on the warp; tn_wgmma_commit closes the thread's group;
 * a wait_group N by any lane runs, oldest first, the warp's wgmmas of all
 * but its N newest groups, reading the operands then -- the latest moment
 * the hardware may -- so that shared memory overwritten before the wait is
 * seen as the wrong operand it would be. A thread that exits with its warp's
 * wgmmas pending is an error. Arithmetic as for mma.sync. */
static inline uint32_t swizzle128(uint32_t a) { return a ^ (((a >> 7) & 7u) << 4); }

static float wgmma_operand(uint32_t addr, bool bf, int line) {
    if ((uint64_t)addr + 2 > TN_SMEM_CAPACITY)
        fail(TN_EMU_MEMORY_FAULT, line, "wgmma at line %d reads shared address %u, outside the "
             "block's shared memory", line, addr);
    uint16_t h;
    memcpy(&h, tn_smem + addr, 2);
    return half_bits_to_float(h, bf);
}

/* Issue (the warp's rendezvous completed): check the operands and queue the
 * wgmma on the warp; it runs when a lane's wait retires its group. */
static void wgmma_issue(MatLane *const *ln, bool bf, int line, int warp) {
    const int n = ln[0]->n;
    const uint64_t da = ln[0]->da, db = ln[0]->db;
    for (int k = 1; k < 32; ++k)
        if (ln[k]->n != n || ln[k]->da != da || ln[k]->db != db || ln[k]->wg != ln[0]->wg ||
            ln[k]->group != ln[0]->group)
            fail(TN_EMU_COLLECTIVE_MISMATCH, line, "wgmma at line %d: lane %d's shape, "
                 "descriptors or commit count differ from lane 0's (they are uniform over the "
                 "warpgroup)", line, k);
    if (n < 8 || n > 256 || n % 8)
        fail(TN_EMU_COLLECTIVE_MISMATCH, line, "wgmma at line %d: n = %d is not a multiple of "
             "8 in 8..256", line, n);
    for (uint64_t desc : {da, db})
        if ((desc >> 62) != 1u)
            fail(TN_EMU_COLLECTIVE_MISMATCH, line, "wgmma at line %d: descriptor %#llx uses "
                 "swizzle mode %u; the emulator has the 128-byte mode (1) only", line,
                 (unsigned long long)desc, (unsigned)(desc >> 62));
    WgQueue &q = S.wgq[warp];
    if (q.n == WG_MAX)
        fail(TN_EMU_COLLECTIVE_MISMATCH, line, "wgmma at line %d: warp %d has %d wgmmas pending; "
             "a wgmma wait_group is missing", line, warp, WG_MAX);
    WgPending &p = q.items[q.n++];
    p.bf = bf;
    p.n = n;
    p.wg = ln[0]->wg;
    p.line = line;
    p.group = ln[0]->group;
    p.da = da;
    p.db = db;
    for (int k = 0; k < 32; ++k) p.d[k] = ln[k]->d;
}

/* Run one queued wgmma: read its operands from shared memory now (the
 * latest moment the hardware may read them) and update the lanes' registers. */
static __attribute__((noinline)) void wgmma_run(const WgPending &p) {
    const int n = p.n, line = p.line, wg = p.wg;
    const bool bf = p.bf;
    const uint32_t a0 = (uint32_t)(p.da & 0x3fffu) << 4,
                   asbo = (uint32_t)(p.da >> 32 & 0x3fffu) << 4;
    const uint32_t b0 = (uint32_t)(p.db & 0x3fffu) << 4,
                   blbo = (uint32_t)(p.db >> 16 & 0x3fffu) << 4,
                   bsbo = (uint32_t)(p.db >> 32 & 0x3fffu) << 4;
    float A[16][16];
    for (int i = 0; i < 16; ++i) {
        const int r = 16 * wg + i;
        for (int k = 0; k < 16; ++k)
            A[i][k] = wgmma_operand(swizzle128(a0 + (r % 8) * 128u + (r / 8) * asbo + 2u * k),
                                    bf, line);
    }
    for (int j = 0; j < n; ++j) {
        float b[16];
        for (int k = 0; k < 16; ++k)
            b[k] = wgmma_operand(swizzle128(b0 + 2u * (j % 64) + (j / 64) * blbo +
                                            (k % 8) * 128u + (k / 8) * bsbo), bf, line);
        for (int i = 0; i < 16; ++i) {
            const int l = 4 * (i % 8) + (j % 8) / 2;
            float *c = &p.d[l][4 * (j / 8) + 2 * (i / 8) + j % 2];
            double s = *c;
            for (int k = 0; k < 16; ++k) s += (double)A[i][k] * (double)b[k];
            *c = toward_zero(s);
        }
    }
}

/* The data movement and arithmetic, instrumented under TSan (the completing
 * lane's reads of shared memory are real accesses); `matrix_op` below is the
 * bookkeeping around it. */
static __attribute__((noinline)) void matrix_compute(MatLane *const *ln, int op, int line) {
    if (op == OP_WGMMA_BF16 || op == OP_WGMMA_F16) {
        wgmma_issue(ln, op == OP_WGMMA_BF16, line, ln[0]->warp);
        return;
    }
    if (op == OP_LDSM || op == OP_LDSM_T) {
        for (int k = 0; k < 32; ++k) {
            const unsigned char *p = (const unsigned char *)ln[k]->src;
            if (p < tn_smem || p + 16 > tn_smem + TN_SMEM_CAPACITY)
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
    const bool bf = op == OP_MMA_BF16;
    float A[16][16], B[16][8];
    double C[16][8];
    for (int l = 0; l < 32; ++l) {
        int g = l / 4, q = l % 4;
        for (int e = 0; e < 2; ++e) {
            for (int r = 0; r < 4; ++r) {
                unsigned w = ln[l]->a[r] >> (16 * e) & 0xffffu;
                A[g + 8 * (r & 1)][2 * q + 8 * (r >> 1) + e] = half_bits_to_float(w, bf);
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

TN_RT uint64_t collective(int op, int line, unsigned mask, int width, int arg, uint64_t val) {
    Fiber *me = S.cur;
    const int lane = me->lin & 31;
    const int base = me->lin & ~31;
    const int wsize = std::min(32, S.nthreads - base);
    Fiber *warp = &S.fibers[base];
    const char *name = op_names[op];
    if (!(mask >> lane & 1u))
        fail(TN_EMU_COLLECTIVE_MISMATCH, line,
             "%s at line %d: lane %d of warp %d calls it with mask 0x%08x, which does not "
             "include the lane itself",
             name, line, lane, base / 32, mask);
    if (wsize < 32 && (mask >> wsize) != 0)
        fail(TN_EMU_COLLECTIVE_MISMATCH, line,
             "%s at line %d: mask 0x%08x names lanes that do not exist (warp %d has %d lanes)",
             name, line, mask, base / 32, wsize);
    if (!pow2_width(width))
        fail(TN_EMU_COLLECTIVE_MISMATCH, line,
             "%s at line %d: width %d is not a power of two in 1..32", name, line, width);
    for (int k = 0; k < wsize; ++k) {
        if (k == lane) continue;
        Fiber *f = &warp[k];
        bool named = mask >> k & 1u;
        if (named && f->state == F_DONE)
            fail(TN_EMU_COLLECTIVE_EXITED, line,
                 "%s at line %d: lane %d of warp %d names lane %d in its mask 0x%08x, but lane "
                 "%d already exited without calling it",
                 name, line, lane, base / 32, k, mask, k);
        if (named && f->state == F_BARRIER)
            fail(TN_EMU_DEADLOCK, line,
                 "deadlock: lane %d of warp %d calls %s (line %d, mask 0x%08x) while lane %d "
                 "waits at __syncthreads() (line %d)",
                 lane, base / 32, name, line, mask, k, f->line);
        if (f->state == F_COLL && (named || (f->mask >> lane & 1u)) &&
            (f->mask != mask || f->op != op || f->width != width))
            fail(TN_EMU_COLLECTIVE_MISMATCH, line,
                 "collective mismatch in warp %d: lane %d calls %s (line %d) with mask 0x%08x "
                 "width %d, but lane %d waits in %s (line %d) with mask 0x%08x width %d",
                 base / 32, lane, name, line, mask, width, k, op_names[f->op], f->line, f->mask,
                 f->width);
    }
    me->state = F_COLL;
    me->op = op;
    me->line = line;
    me->mask = mask;
    me->width = width;
    me->arg = arg;
    me->val = val;
    bool complete = true;
    for (int k = 0; k < wsize; ++k)
        if ((mask >> k & 1u) && warp[k].state != F_COLL) complete = false;
#ifdef __SANITIZE_THREAD__
    me->token = nullptr;
    for (int k = 0; k < wsize && !me->token; ++k)
        if (k != lane && (mask >> k & 1u) && warp[k].state == F_COLL) me->token = warp[k].token;
    if (!me->token) me->token = new_token();
    ++*me->token;
    __tsan_release(me->token);
#endif
    if (complete && op >= OP_LDSM) {
#ifdef __SANITIZE_THREAD__
        __tsan_acquire(me->token); /* the other lanes' operands, deposited before arrival */
#endif
        matrix_op(warp, wsize, op, line);
        for (int k = 0; k < wsize; ++k) { warp[k].res = 0; warp[k].state = F_READY; }
    } else if (complete) {
        uint64_t out[32];
        for (int k = 0; k < wsize; ++k)
            if (mask >> k & 1u) out[k] = collective_result(warp, k, wsize);
        for (int k = 0; k < wsize; ++k)
            if (mask >> k & 1u) { warp[k].res = out[k]; warp[k].state = F_READY; }
    }
    yield_to_scheduler();
#ifdef __SANITIZE_THREAD__
    depart(me);
#endif
    return me->res;
}

template <class T>
static inline uint64_t to_bits(T v) {
    static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 8, "warp collective on a type wider than 8 bytes");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof(T));
    return b;
}
template <class T>
static inline T from_bits(uint64_t b) {
    T v;
    memcpy(&v, &b, sizeof(T));
    return v;
}

template <class T> static inline T shfl_at(int line, unsigned m, T v, int src, int w = 32) {
    return from_bits<T>(collective(OP_SHFL_IDX, line, m, w, src, to_bits(v)));
}
template <class T> static inline T shfl_up_at(int line, unsigned m, T v, unsigned d, int w = 32) {
    return from_bits<T>(collective(OP_SHFL_UP, line, m, w, (int)d, to_bits(v)));
}
template <class T> static inline T shfl_down_at(int line, unsigned m, T v, unsigned d, int w = 32) {
    return from_bits<T>(collective(OP_SHFL_DOWN, line, m, w, (int)d, to_bits(v)));
}
template <class T> static inline T shfl_xor_at(int line, unsigned m, T v, int lm, int w = 32) {
    return from_bits<T>(collective(OP_SHFL_XOR, line, m, w, lm, to_bits(v)));
}
static inline void ldsm_at(int line, unsigned *regs, const void *p, bool trans) {
    MatLane m{p, regs, nullptr, nullptr, nullptr};
    collective(trans ? OP_LDSM_T : OP_LDSM, line, 0xffffffffu, 32, 0, (uint64_t)(uintptr_t)&m);
}
static inline void wgmma_at(int line, bool bf, int n, float *d, uint64_t da, uint64_t db) {
    MatLane m{};
    m.d = d;
    m.da = da;
    m.db = db;
    m.n = n;
    m.wg = (S.cur->lin / 32) % 4;
    m.warp = S.cur->lin / 32;
    m.group = S.cur->wg_committed;
    collective(bf ? OP_WGMMA_BF16 : OP_WGMMA_F16, line, 0xffffffffu, 32, 0, (uint64_t)(uintptr_t)&m);
}
static inline void wgmma_commit() { S.cur->wg_committed++; }
/* all but the thread's n newest groups complete: run its warp's older wgmmas */
static inline void wgmma_wait(int n) {
    WgQueue &q = S.wgq[S.cur->lin / 32];
    const int limit = S.cur->wg_committed - n;
    int done = 0;
    while (done < q.n && q.items[done].group < limit) wgmma_run(q.items[done++]);
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
    if (q < tn_smem || q > tn_smem + TN_SMEM_CAPACITY)
        fail(TN_EMU_MEMORY_FAULT, line, "line %d takes the shared address of %p, which is not in "
             "shared memory", line, p);
    return (unsigned)(q - tn_smem);
}
/* the n bytes at shared-window address a (smem_addr's inverse) */
static inline void *smem_ptr(int line, unsigned a, unsigned n) {
    if ((unsigned long long)a + n > TN_SMEM_CAPACITY)
        fail(TN_EMU_MEMORY_FAULT, line, "line %d addresses %u bytes at shared address %#x, beyond "
             "the shared window (%u bytes)", line, n, a, (unsigned)TN_SMEM_CAPACITY);
    return tn_smem + a;
}
static inline void mma_at(int line, bool bf, float *d, const unsigned *a, const unsigned *b) {
    MatLane m{nullptr, nullptr, d, a, b};
    collective(bf ? OP_MMA_BF16 : OP_MMA_F16, line, 0xffffffffu, 32, 0, (uint64_t)(uintptr_t)&m);
}
static inline void syncwarp_at(int line, unsigned m = 0xffffffffu) { collective(OP_SYNCWARP, line, m, 32, 0, 0); }
static inline unsigned ballot_at(int line, unsigned m, int p) { return (unsigned)collective(OP_BALLOT, line, m, 32, 0, p != 0); }
static inline int any_at(int line, unsigned m, int p) { return (int)collective(OP_ANY, line, m, 32, 0, p != 0); }
static inline int all_at(int line, unsigned m, int p) { return (int)collective(OP_ALL, line, m, 32, 0, p != 0); }
static inline unsigned reduce_u(int op, int line, unsigned m, unsigned v) { return (unsigned)collective(op, line, m, 32, 0, v); }
static inline int reduce_i(int op, int line, unsigned m, int v) { return (int)(uint32_t)collective(op, line, m, 32, 1, (uint32_t)v); }
static inline unsigned reduce_add_at(int line, unsigned m, unsigned v) { return reduce_u(OP_RED_ADD, line, m, v); }
static inline int reduce_add_at(int line, unsigned m, int v) { return reduce_i(OP_RED_ADD, line, m, v); }
static inline unsigned reduce_min_at(int line, unsigned m, unsigned v) { return reduce_u(OP_RED_MIN, line, m, v); }
static inline int reduce_min_at(int line, unsigned m, int v) { return reduce_i(OP_RED_MIN, line, m, v); }
static inline unsigned reduce_max_at(int line, unsigned m, unsigned v) { return reduce_u(OP_RED_MAX, line, m, v); }
static inline int reduce_max_at(int line, unsigned m, int v) { return reduce_i(OP_RED_MAX, line, m, v); }
static inline unsigned reduce_and_at(int line, unsigned m, unsigned v) { return reduce_u(OP_RED_AND, line, m, v); }
static inline unsigned reduce_or_at(int line, unsigned m, unsigned v) { return reduce_u(OP_RED_OR, line, m, v); }
static inline unsigned reduce_xor_at(int line, unsigned m, unsigned v) { return reduce_u(OP_RED_XOR, line, m, v); }

TN_RT unsigned activemask() {
    /* Lanes of the caller's warp that have not exited: cooperative fibers have
     * no notion of convergence, so this is the widest mask CUDA could give. */
    int base = S.cur->lin & ~31;
    int wsize = std::min(32, S.nthreads - base);
    unsigned m = 0;
    for (int k = 0; k < wsize; ++k)
        if (S.fibers[base + k].state != F_DONE) m |= 1u << k;
    return m;
}

[[noreturn]] TN_RT void trap_at(int line) {
    fail(TN_EMU_TRAP, line, "__trap() at line %d in thread %d", line, S.cur->lin);
}

/** A vector access of `align`-aligned instructions at `p` (align 0: none
 * needed). A GPU raises "misaligned address" for an address below the
 * alignment of its ld/st.v2/.v4; x86 loads most such addresses silently (only
 * the 16-byte SSE moves fault, as a wild access), so the prelude's vector
 * accesses ask here first and the emulator faults where the device would. */
TN_RT void require_aligned(const void *p, unsigned long long align) {
    if (align && ((uintptr_t)p & (align - 1)))
        fail(TN_EMU_MEMORY_FAULT, 0, "misaligned address: a vector access needing %llu-byte "
             "alignment at %p in thread %d", align, p, S.cur->lin);
}

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
    if (me->npending == ASYNC_MAX) return false;
    AsyncCopy *c = &me->pending[me->npending++];
    c->dst = dst;
    c->bytes = bytes;
    c->group = me->committed;
    async_words(c->data, data, bytes);
    return true;
}
TN_RT void async_commit() { S.cur->committed++; }
TN_RT int async_complete(int keep, void **dst, unsigned char *out) {
    Fiber *me = S.cur;
    if (me->npending == 0 || me->pending[0].group >= me->committed - keep) return 0;
    AsyncCopy *c = &me->pending[0];
    int n = c->bytes;
    *dst = c->dst;
    async_words(out, c->data, n);
    --me->npending;
    for (int k = 0; k < me->npending; ++k) {  /* the queue moves up one */
        me->pending[k].dst = me->pending[k + 1].dst;
        me->pending[k].bytes = me->pending[k + 1].bytes;
        me->pending[k].group = me->pending[k + 1].group;
        async_words(me->pending[k].data, me->pending[k + 1].data, me->pending[k + 1].bytes);
    }
    return n;
}

/* Index builtins: values of the running fiber (set by the scheduler). */
static inline const uint3 &cur_thread_idx() { return S.thread_idx; }
static inline const uint3 &cur_block_idx() { return S.block_idx; }
static inline const dim3 &cur_block_dim() { return S.block; }
static inline const dim3 &cur_grid_dim() { return S.grid; }

} /* namespace tn_emu */

/* ------------------------------------------------------- CUDA builtin names */
#define threadIdx (tn_emu::cur_thread_idx())
#define blockIdx (tn_emu::cur_block_idx())
#define blockDim (tn_emu::cur_block_dim())
#define gridDim (tn_emu::cur_grid_dim())
#define warpSize 32

#define __syncthreads() tn_emu::syncthreads_impl(__LINE__, 0)
#define __syncthreads_count(p) tn_emu::syncthreads_impl(__LINE__, (p) != 0)
#define __syncthreads_and(p) (tn_emu::syncthreads_impl(__LINE__, (p) != 0) == (int)tn_emu::S.nthreads)
#define __syncthreads_or(p) (tn_emu::syncthreads_impl(__LINE__, (p) != 0) != 0)
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

/* -------------------------------------------------------------- scheduler */
namespace tn_emu {

TN_RT uint64_t next_rand() {
    uint64_t z = (S.rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/** The runnable fiber the policy runs next, or -1 when none is runnable. */
TN_RT int pick() {
    const int n = S.nthreads;
    switch (S.cfg.policy) {
    case 1:
        for (int i = n - 1; i >= 0; --i)
            if (S.fibers[i].state == F_READY) return i;
        return -1;
    case 2: {
        int lo = S.ahead_warp * 32, hi = std::min(n, lo + 32);
        for (int i = lo; i < hi; ++i)
            if (S.fibers[i].state == F_READY) return i;
        break;
    }
    case 3: {
        int ready = 0;
        for (int i = 0; i < n; ++i) ready += S.fibers[i].state == F_READY;
        if (ready == 0) return -1;
        int k = (int)(next_rand() % (uint64_t)ready);
        for (int i = 0; i < n; ++i)
            if (S.fibers[i].state == F_READY && k-- == 0) return i;
        return -1;
    }
    default: break;
    }
    for (int i = 0; i < n; ++i)
        if (S.fibers[i].state == F_READY) return i;
    return -1;
}

/** A thread returned from the kernel: mark it done and check that nobody waits for it. */
TN_RT void thread_exit() {
    Fiber *me = S.cur;
    if (S.at_barrier > 0) {
        char who[512] = "";
        ranges(who, sizeof who, F_BARRIER);
        fail(TN_EMU_DIVERGENT_BARRIER, S.barrier_line,
             "divergent barrier: thread %d exits while threads [%s] wait at __syncthreads() at "
             "line %d, which it never reached",
             me->lin, who, S.barrier_line);
    }
    const int lane = me->lin & 31, base = me->lin & ~31;
    const int wsize = std::min(32, S.nthreads - base);
    for (int k = 0; k < wsize; ++k) {
        Fiber *f = &S.fibers[base + k];
        if (f->state == F_COLL && (f->mask >> lane & 1u))
            fail(TN_EMU_COLLECTIVE_EXITED, f->line,
                 "%s at line %d: lane %d of warp %d exits without calling it, but lane %d waits "
                 "for it (mask 0x%08x)",
                 op_names[f->op], f->line, lane, base / 32, k, f->mask);
    }
    const WgQueue &wq = S.wgq[base / 32];
    if (wq.n)
        fail(TN_EMU_COLLECTIVE_EXITED, wq.items[0].line,
             "thread %d exits while the wgmma its warp issued at line %d is not complete: a "
             "wgmma wait_group is missing", me->lin, wq.items[0].line);
    me->state = F_DONE;
    S.done++;
#ifdef __SANITIZE_THREAD__
    __tsan_release(&S.tsan_exit);
#endif
}

TN_RT void fiber_main() {
    S.thunk(S.args);
    thread_exit();
    yield_to_scheduler();
    abort(); /* a finished fiber is never resumed */
}

TN_RT void describe_deadlock() {
    char buf[1536] = "";
    size_t n = 0;
    n += snprintf(buf + n, sizeof buf - n, "at __syncthreads() (line %d): [", S.barrier_line);
    ranges(buf, sizeof buf, F_BARRIER);
    n = strlen(buf);
    n += snprintf(buf + n, sizeof buf - n, "]; in warp collectives: [");
    ranges(buf, sizeof buf, F_COLL);
    n = strlen(buf);
    snprintf(buf + n, sizeof buf - n, "]; exited: [");
    ranges(buf, sizeof buf, F_DONE);
    n = strlen(buf);
    snprintf(buf + n, sizeof buf - n, "]");
    const Fiber *f = nullptr;
    for (int i = 0; i < S.nthreads && !f; ++i)
        if (S.fibers[i].state == F_COLL) f = &S.fibers[i];
    set_err(TN_EMU_DEADLOCK, f ? f->line : S.barrier_line, f,
            "deadlock: no thread of the block can proceed; threads %s", buf);
}

/* ---------------------------------------------------------- fault handling */
#ifndef __SANITIZE_THREAD__
static const int fault_signals[3] = {SIGSEGV, SIGBUS, SIGFPE};

static void fault_handler(int sig, siginfo_t *si, void *) {
    Fiber *f = S.cur;
    if (!S.in_launch || !f || !pthread_equal(pthread_self(), S.launch_thread)) {
        for (int i = 0; i < 3; ++i)
            if (fault_signals[i] == sig) sigaction(sig, &S.old_act[i], nullptr);
        return; /* the fault repeats under the previous handler */
    }
    char *a = (char *)si->si_addr;
    size_t pg = page_size();
    if (sig == SIGSEGV && a >= f->stack_lo - pg && a < f->stack_lo)
        set_err(TN_EMU_STACK_OVERFLOW, 0, f,
                "stack overflow in thread %d (fiber stack of %llu bytes)", f->lin,
                (unsigned long long)S.cfg.stack_bytes);
    else if (sig == SIGFPE)
        set_err(TN_EMU_ARITH_FAULT, 0, f, "arithmetic fault (integer division by zero or overflow) in thread %d", f->lin);
    else
        set_err(TN_EMU_MEMORY_FAULT, 0, f, "invalid memory access at address %p in thread %d", (void *)a, f->lin);
    f->state = F_ABORTED;
    setcontext(&S.sched); /* back into run_block, which sees the error */
}

static void install_fault_handlers() {
    const size_t alt = 64 * 1024;
    S.altstack = (char *)malloc(alt);
    stack_t ss;
    ss.ss_sp = S.altstack;
    ss.ss_size = alt;
    ss.ss_flags = 0;
    sigaltstack(&ss, &S.old_altstack);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = fault_handler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 3; ++i) sigaction(fault_signals[i], &sa, &S.old_act[i]);
}

static void remove_fault_handlers() {
    for (int i = 0; i < 3; ++i) sigaction(fault_signals[i], &S.old_act[i], nullptr);
    sigaltstack(&S.old_altstack, nullptr);
    free(S.altstack);
    S.altstack = nullptr;
}
#endif

/** Fiber stacks for `n` threads of `bytes` each, each above a PROT_NONE guard page. */
TN_RT bool ensure_stacks(int n, size_t bytes) {
    size_t pg = page_size();
    size_t slot = ((bytes + pg - 1) / pg) * pg + pg;
#ifdef __SANITIZE_THREAD__
    bool fresh = true; /* new pages per block: TSan forgets the old stack accesses */
#else
    bool fresh = !(S.pool && S.slot_bytes == slot && S.pool_slots >= n);
#endif
    if (!fresh) return true;
    if (S.pool) munmap(S.pool, S.pool_bytes);
    S.pool = nullptr;
    size_t total = slot * (size_t)n;
    void *p = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return false;
    S.pool = (char *)p;
    S.pool_bytes = total;
    S.slot_bytes = slot;
    S.pool_slots = n;
    for (int i = 0; i < n; ++i) mprotect(S.pool + slot * (size_t)i, pg, PROT_NONE);
    return true;
}

TN_RT void poison_smem() {
#ifdef __SANITIZE_THREAD__
    /* Fresh pages at the same address: TSan drops the shadow of an unmapped
     * range, so the previous block's accesses cannot "race" with this one's. */
    AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
    munmap(tn_smem, sizeof tn_smem);
    if (mmap(tn_smem, sizeof tn_smem, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) == MAP_FAILED)
        abort();
#endif
    if (S.cfg.poison == 2) {
        volatile unsigned char *p = tn_smem;
        for (size_t i = 0; i < sizeof tn_smem; ++i) p[i] = 0xa5;
    } else {
        volatile uint32_t *p = reinterpret_cast<volatile uint32_t *>(tn_smem);
        for (size_t i = 0; i < sizeof tn_smem / 4; ++i) p[i] = S.poison32;
    }
#ifdef __SANITIZE_THREAD__
    AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
#endif
}

TN_RT void run_block() {
    const int n = S.nthreads;
    poison_smem();
    if (!ensure_stacks(n, S.cfg.stack_bytes)) {
        set_err(TN_EMU_BAD_LAUNCH, 0, nullptr, "cannot map %d fiber stacks of %llu bytes", n,
                (unsigned long long)S.cfg.stack_bytes);
        return;
    }
    size_t pg = page_size();
    S.done = 0;
    S.at_barrier = 0;
    S.barrier_line = 0;
    S.barrier_token = nullptr;
    for (WgQueue &q : S.wgq) q.n = 0;
    S.ahead_warp = (int)(next_rand() % (uint64_t)((n + 31) / 32));
    for (int i = 0; i < n; ++i) {
        Fiber *f = &S.fibers[i];
        memset(f, 0, sizeof *f);
        f->lin = i;
        f->tid.x = i % S.block.x;
        f->tid.y = (i / S.block.x) % S.block.y;
        f->tid.z = i / (S.block.x * S.block.y);
        f->state = F_READY;
        f->stack_lo = S.pool + S.slot_bytes * (size_t)i + pg;
        getcontext(&f->ctx);
        f->ctx.uc_stack.ss_sp = f->stack_lo;
        f->ctx.uc_stack.ss_size = S.slot_bytes - pg;
        f->ctx.uc_link = nullptr;
        makecontext(&f->ctx, (void (*)())fiber_main, 0);
#ifdef __SANITIZE_THREAD__
        f->tsan_fiber = __tsan_create_fiber(0);
        if (S.tsan_count < S.tsan_cap) S.tsan_fibers[S.tsan_count++] = f->tsan_fiber;
        char name[96];
        snprintf(name, sizeof name, "block (%u,%u,%u) thread (%u,%u,%u)", S.block_idx.x,
                 S.block_idx.y, S.block_idx.z, f->tid.x, f->tid.y, f->tid.z);
        __tsan_set_fiber_name(f->tsan_fiber, name);
#endif
    }
    while (S.err->code == TN_EMU_OK) {
        int k = pick();
        if (k < 0) {
            if (S.done < n) describe_deadlock();
            break;
        }
        Fiber *f = &S.fibers[k];
        f->state = F_RUNNING;
        S.cur = f;
        S.thread_idx = f->tid;
#ifdef __SANITIZE_THREAD__
        __tsan_switch_to_fiber(f->tsan_fiber, __tsan_switch_to_fiber_no_sync);
#endif
        swapcontext(&S.sched, &f->ctx);
        S.cur = nullptr;
    }
#ifdef __SANITIZE_THREAD__
    /* A destroyed fiber's TSan id is reused, and accesses under one id never
     * race: fibers live to the end of the launch, so that blocks race with
     * each other; past TN_TSAN_MAX_FIBERS they die with their block. */
    if (S.tsan_cap == 0)
        for (int i = 0; i < n; ++i) __tsan_destroy_fiber(S.fibers[i].tsan_fiber);
#endif
}

TN_RT bool check_cfg(const tn_emu_cfg *c) {
    const uint32_t *b = c->block, *g = c->grid;
    unsigned long long threads = (unsigned long long)b[0] * b[1] * b[2];
    const char *why = nullptr;
    if (b[0] < 1 || b[1] < 1 || b[2] < 1 || g[0] < 1 || g[1] < 1 || g[2] < 1) why = "every grid and block extent must be at least 1";
    else if (threads > 1024 || b[0] > 1024 || b[1] > 1024 || b[2] > 64) why = "a block has at most 1024 threads (x, y <= 1024, z <= 64)";
    else if (g[1] > 65535 || g[2] > 65535) why = "grid y and z are at most 65535";
    else if (c->shared_bytes > TN_SMEM_CAPACITY) why = "dynamic shared memory exceeds the emulated 228 KiB";
    else if (c->stack_bytes < 16384) why = "fiber stacks must be at least 16 KiB";
    else if (c->policy < 0 || c->policy > 3 || c->poison < 0 || c->poison > 2 || c->block_order < 0 || c->block_order > 1) why = "unknown policy, poison or block order";
    if (why) set_err(TN_EMU_BAD_LAUNCH, 0, nullptr, "bad launch of %s: %s", S.kernel, why);
    return why == nullptr;
}

/** Run one kernel launch; returns the error code (0 when clean). */
TN_RT int launch(void (*thunk)(void **), const char *kernel, void **args, const tn_emu_cfg *cfg, tn_emu_err *err) {
    pthread_mutex_lock(&S.lock);
    memset(err, 0, sizeof *err);
    S.err = err;
    S.kernel = kernel;
    S.thunk = thunk;
    S.args = args;
    S.cfg = *cfg;
    if (!check_cfg(cfg)) {
        pthread_mutex_unlock(&S.lock);
        return err->code;
    }
    S.grid = dim3(cfg->grid[0], cfg->grid[1], cfg->grid[2]);
    S.block = dim3(cfg->block[0], cfg->block[1], cfg->block[2]);
    S.nthreads = (int)(cfg->block[0] * cfg->block[1] * cfg->block[2]);
    S.rng = cfg->seed * 0x2545f4914f6cdd1dull + 1;
    static const uint32_t p32[3] = {0x7fc00000u, 0x7f7fffffu, 0xa5a5a5a5u};
    S.poison32 = p32[cfg->poison];
    S.poison64 = ((uint64_t)S.poison32 << 32) | S.poison32;
    S.fibers = (Fiber *)calloc((size_t)S.nthreads, sizeof(Fiber));
    uint64_t nblocks = (uint64_t)cfg->grid[0] * cfg->grid[1] * cfg->grid[2];
    uint64_t *order = (uint64_t *)malloc(sizeof(uint64_t) * nblocks);
    for (uint64_t i = 0; i < nblocks; ++i) order[i] = i;
    if (cfg->block_order == 1)
        for (uint64_t i = nblocks; i > 1; --i) std::swap(order[i - 1], order[next_rand() % i]);
#ifdef __SANITIZE_THREAD__
    S.tsan_main = __tsan_get_current_fiber();
    S.tsan_count = 0;
    S.tsan_cap = nblocks * (uint64_t)S.nthreads <= TN_TSAN_MAX_FIBERS ? nblocks * (uint64_t)S.nthreads : 0;
    S.tsan_fibers = S.tsan_cap ? (void **)calloc(S.tsan_cap, sizeof(void *)) : nullptr;
#else
    S.launch_thread = pthread_self();
    install_fault_handlers();
#endif
    S.in_launch = 1;
    for (uint64_t i = 0; i < nblocks && err->code == TN_EMU_OK; ++i) {
        uint64_t b = order[i];
        S.block_idx.x = (unsigned)(b % cfg->grid[0]);
        S.block_idx.y = (unsigned)((b / cfg->grid[0]) % cfg->grid[1]);
        S.block_idx.z = (unsigned)(b / ((uint64_t)cfg->grid[0] * cfg->grid[1]));
        run_block();
    }
    S.in_launch = 0;
#ifdef __SANITIZE_THREAD__
    __tsan_acquire(&S.tsan_exit); /* the caller reads what all threads wrote */
    for (uint64_t i = 0; i < S.tsan_count; ++i) __tsan_destroy_fiber(S.tsan_fibers[i]);
    free(S.tsan_fibers);
    S.tsan_fibers = nullptr;
    S.tsan_cap = S.tsan_count = 0;
#else
    remove_fault_handlers();
#endif
    /* the stacks go back after every launch: each guard page splits the
       mapping, and a process that keeps many emulated kernels loaded would
       otherwise run out of memory mappings (vm.max_map_count) */
    if (S.pool) munmap(S.pool, S.pool_bytes);
    S.pool = nullptr;
    free(order);
    free(S.fibers);
    S.fibers = nullptr;
    int code = err->code;
    pthread_mutex_unlock(&S.lock);
    return code;
}

#ifdef TN_EMU_RUNNER
/* A stand-alone runner (the TSan build is an executable): it reads a
 * manifest of arguments whose arrays live in files, launches, and writes the
 * arrays back in place and the error record to RESULT.
 *   manifest lines: kernel NAME | grid X Y Z | block X Y Z | shared N | stack N
 *                   | seed N | policy N | poison N | order N
 *                   | ptr NBYTES PATH | val NBYTES HEX | null */
struct KernelEntry { const char *name; int (*launch)(void **, const tn_emu_cfg *, tn_emu_err *); };

static int runner_main(int argc, char **argv, const KernelEntry *table, int ntable) {
    if (argc != 3) { fprintf(stderr, "usage: %s MANIFEST RESULT\n", argv[0]); return 2; }
    FILE *m = fopen(argv[1], "r");
    if (!m) { perror(argv[1]); return 2; }
    tn_emu_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    char kernel[256] = "", word[64], path[4096];
    void *bufs[256];
    size_t sizes[256];
    char *paths[256];
    void *slots[256];
    void *args[256];
    int nargs = 0;
    while (fscanf(m, "%63s", word) == 1) {
        if (!strcmp(word, "kernel")) { if (fscanf(m, "%255s", kernel) != 1) return 2; }
        else if (!strcmp(word, "grid")) { if (fscanf(m, "%u %u %u", &cfg.grid[0], &cfg.grid[1], &cfg.grid[2]) != 3) return 2; }
        else if (!strcmp(word, "block")) { if (fscanf(m, "%u %u %u", &cfg.block[0], &cfg.block[1], &cfg.block[2]) != 3) return 2; }
        else if (!strcmp(word, "shared")) { if (fscanf(m, "%llu", (unsigned long long *)&cfg.shared_bytes) != 1) return 2; }
        else if (!strcmp(word, "stack")) { if (fscanf(m, "%llu", (unsigned long long *)&cfg.stack_bytes) != 1) return 2; }
        else if (!strcmp(word, "seed")) { if (fscanf(m, "%llu", (unsigned long long *)&cfg.seed) != 1) return 2; }
        else if (!strcmp(word, "policy")) { if (fscanf(m, "%d", &cfg.policy) != 1) return 2; }
        else if (!strcmp(word, "poison")) { if (fscanf(m, "%d", &cfg.poison) != 1) return 2; }
        else if (!strcmp(word, "order")) { if (fscanf(m, "%d", &cfg.block_order) != 1) return 2; }
        else if (nargs < 256 && !strcmp(word, "ptr")) {
            size_t nb;
            if (fscanf(m, "%zu %4095s", &nb, path) != 2) return 2;
            void *b = aligned_alloc(64, nb ? (nb + 63) / 64 * 64 : 64);
            FILE *f = fopen(path, "rb");
            if (!f || fread(b, 1, nb, f) != nb) { perror(path); return 2; }
            fclose(f);
            bufs[nargs] = b; sizes[nargs] = nb; paths[nargs] = strdup(path);
            slots[nargs] = b; args[nargs] = &slots[nargs]; ++nargs;
        } else if (nargs < 256 && !strcmp(word, "val")) {
            size_t nb;
            char hex[64];
            if (fscanf(m, "%zu %63s", &nb, hex) != 2 || nb > 8) return 2;
            unsigned long long v = strtoull(hex, nullptr, 16);
            bufs[nargs] = malloc(8); sizes[nargs] = 0; paths[nargs] = nullptr;
            memcpy(bufs[nargs], &v, 8); /* little endian: the low bytes are the value */
            args[nargs] = bufs[nargs]; ++nargs;
        } else if (nargs < 256 && !strcmp(word, "null")) {
            bufs[nargs] = nullptr; sizes[nargs] = 0; paths[nargs] = nullptr;
            slots[nargs] = nullptr; args[nargs] = &slots[nargs]; ++nargs;
        } else { fprintf(stderr, "bad manifest word %s\n", word); return 2; }
    }
    fclose(m);
    int (*fn)(void **, const tn_emu_cfg *, tn_emu_err *) = nullptr;
    for (int i = 0; i < ntable; ++i)
        if (!strcmp(table[i].name, kernel)) fn = table[i].launch;
    if (!fn) { fprintf(stderr, "no kernel %s\n", kernel); return 2; }
    tn_emu_err err;
    fn(args, &cfg, &err);
    for (int i = 0; i < nargs; ++i) {
        if (!paths[i]) continue;
        FILE *f = fopen(paths[i], "wb");
        if (!f || fwrite(bufs[i], 1, sizes[i], f) != sizes[i]) { perror(paths[i]); return 2; }
        fclose(f);
    }
    FILE *r = fopen(argv[2], "w");
    if (!r) { perror(argv[2]); return 2; }
    fprintf(r, "%d %d %u %u %u %u %u %u\n%s\n", err.code, err.line, err.block[0], err.block[1],
            err.block[2], err.thread[0], err.thread[1], err.thread[2], err.message);
    fclose(r);
    return 0;
}
#endif

} /* namespace tn_emu */

/* Exported probes (one per library): where this library's emulator state
 * and shared memory live, to check that libraries do not share them. */
extern "C" __attribute__((visibility("default"))) void *tn_emu_state_addr() { return &tn_emu::S; }
extern "C" __attribute__((visibility("default"))) void *tn_emu_smem_addr() { return tn_smem; }
extern "C" __attribute__((visibility("default"))) int tn_emu_abi_version() { return 1; }

#endif /* TN_CUDA_SHIM_H */
