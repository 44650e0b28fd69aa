/* tn_runtime.h -- the emulator's dialect-free runtime: a generated GPU
 * source run as host C++, every GPU thread a fiber (its own stack; see
 * TN_EMU_FAST_SWITCH for how fibers switch).
 *
 * A dialect's thin header (tn_cuda_shim.h for CUDA) defines the spelling a
 * source of its language uses -- qualifiers, index builtins, barriers,
 * collectives, atomics, its vendor's instructions -- on top of this core,
 * which it includes. The emulator compiles a generated source with
 *     g++ -x c++ -std=... -DTN_EMULATE -include <dialect header> SOURCE
 * and passes each launch the target profile's limits (lanes per warp or
 * simdgroup, threads per block, shared memory bytes) in its configuration;
 * nothing here assumes a vendor's numbers.
 *
 * Meaning of one launch:
 *   - blocks run one after another (in order, or a seeded shuffle);
 *   - before each block, `tn_smem` (the whole storage) is filled with poison;
 *   - the threads of a block are fibers that switch ONLY at barriers and
 *     warp collectives, so the code between two switch points of a thread
 *     runs atomically; at each switch point the scheduler picks the next
 *     runnable fiber by the launch's interleaving policy;
 *   - the block barrier releases when every thread of the block has
 *     arrived; a thread that exited while others wait (or arrive) at a
 *     barrier is a divergent barrier and an error, never a hang;
 *   - a warp collective is a rendezvous of the lanes in its mask (the
 *     threads of a block form warps of `lanes` consecutive threads): every
 *     lane deposits its value and all read after the last one arrived; a
 *     mask that omits the caller, lanes of one rendezvous with different
 *     masks (or different collectives), a mask lane that exited, and any
 *     state where no fiber can run are errors;
 *   - an error stops the launch and is returned in tn_emu_err.
 *
 * Under -fsanitize=thread (__SANITIZE_THREAD__) every GPU thread is a TSan
 * fiber; switches carry no happens-before; a barrier or collective instance
 * is a fresh sync object that every participant releases on arrival and
 * acquires on departure, so only accesses that the GPU leaves unordered
 * race. The emulator's own bookkeeping is not instrumented (TN_RT).
 *
 * What a dialect header defines before including this one:
 *   TN_EMU_BARRIER_NAME   the block barrier as its language spells it, for
 *                         messages ("__syncthreads()");
 *   TN_EMU_TRAP_NAME      the trap, likewise ("__trap()");
 *   TN_EMU_OP_NAMES       the names of the collectives, one string per Op
 *                         below, then one per extension op of the dialect;
 * and optionally, each the name of a function it defines after this header
 * (in namespace tn_emu):
 *   TN_EMU_EXT_OP         void (Fiber *warp, int wsize, int op, int line):
 *                         completes a rendezvous of an extension op
 *                         (op >= OP_EXT; each lane deposited a pointer to its
 *                         operands as its value);
 *   TN_EMU_BLOCK_START    void (): the dialect's per-block state is reset;
 *   TN_EMU_THREAD_EXIT    void (Fiber *me): a thread returns (after the
 *                         core's checks; it may fail());
 *   TN_EMU_FIBER_EXT      a type: the dialect's per-thread state, a member
 *                         `ext` of every Fiber, zeroed when the block starts.
 *
 * Everything here has internal linkage (static), so several emulator
 * libraries in one process never share state.
 */
#ifndef TN_RUNTIME_H
#define TN_RUNTIME_H

#ifndef TN_EMULATE
#define TN_EMULATE 1
#endif
#if !defined(TN_EMU_BARRIER_NAME) || !defined(TN_EMU_TRAP_NAME) || !defined(TN_EMU_OP_NAMES)
#error "a dialect header defines TN_EMU_BARRIER_NAME, TN_EMU_TRAP_NAME and TN_EMU_OP_NAMES before including tn_runtime.h"
#endif


/* Standard headers first: a dialect's qualifier macros (CUDA's __noinline__ in
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

/* ------------------------------------------------------------ C launch ABI */
extern "C" {
/** One launch's configuration (mirrored by emulator.py with ctypes): the
 * launch itself, then the target profile's limits it must respect. */
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
    uint32_t lanes;          /* threads per warp / simdgroup: a power of two, 1..32 */
    uint32_t max_threads;    /* threads per block */
    uint32_t max_block[3];   /* each extent of a block */
    uint32_t reserved;       /* 0 */
    uint64_t max_shared;     /* shared (threadgroup) memory bytes per block */
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
    TN_EMU_ASYNC_PROTOCOL = 10,
};


/* The storage of the block's shared memory: the most any profile has (a
 * launch's own limit, tn_emu_cfg.max_shared, is checked against it). */
#ifndef TN_EMU_SMEM_STORAGE
#define TN_EMU_SMEM_STORAGE (228u * 1024u)
#endif
/* the widest warp: a collective's mask has a bit per lane */
#define TN_EMU_MAX_LANES 32
#ifndef TN_TSAN_MAX_FIBERS
#define TN_TSAN_MAX_FIBERS 4096
#endif

/* The one dynamic shared-memory array; a kernel's declaration of it (CUDA's
 * `extern __shared__ __align__(16) unsigned char tn_smem[];`) redeclares it
 * (and inherits its internal linkage). Page aligned so that the TSan build
 * can reset its shadow per block. */
alignas(4096) static unsigned char tn_smem[TN_EMU_SMEM_STORAGE];

namespace tn_emu {

/* A block's index and extents (CUDA's uint3 / dim3, MSL's uint3). */
struct Index3 { unsigned int x, y, z; };

enum FState { F_READY, F_RUNNING, F_BARRIER, F_COLL, F_DONE, F_ABORTED };
/* The core's collectives; a dialect's own (matrix) collectives are numbered
 * from OP_EXT and completed by TN_EMU_EXT_OP. */
enum Op {
    OP_SYNCWARP, OP_SHFL_IDX, OP_SHFL_UP, OP_SHFL_DOWN, OP_SHFL_XOR,
    OP_BALLOT, OP_ANY, OP_ALL, OP_RED_ADD, OP_RED_MIN, OP_RED_MAX,
    OP_RED_AND, OP_RED_OR, OP_RED_XOR, OP_EXT
};
static const char *const op_names[] = {TN_EMU_OP_NAMES};
static_assert(sizeof op_names / sizeof op_names[0] >= OP_EXT,
              "TN_EMU_OP_NAMES names every core collective");


/* Switching between fibers. On x86-64 (without ThreadSanitizer) a switch
 * saves the callee-saved registers on the running stack and loads the other
 * stack pointer (tn_switch): swapcontext, the portable way, also makes a
 * system call for the signal mask at every switch, which took about a
 * third of the emulator's time. No fiber changes the signal mask (the fault
 * handler runs with SA_NODEFER), nor the floating-point control words. */
#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
#define TN_EMU_FAST_SWITCH 1
/* Save the callee-saved registers and the stack pointer in *from, continue
 * on the stack `to` saved by an earlier call (or made by fast_stack). */
__attribute__((naked, noinline)) static void tn_switch(void **from, void *to) {
    __asm__ volatile("pushq %rbp\n\tpushq %rbx\n\tpushq %r12\n\tpushq %r13\n\t"
                     "pushq %r14\n\tpushq %r15\n\tmovq %rsp, (%rdi)\n\tmovq %rsi, %rsp\n\t"
                     "popq %r15\n\tpopq %r14\n\tpopq %r13\n\tpopq %r12\n\tpopq %rbx\n\t"
                     "popq %rbp\n\tret\n\t");
}
/* A fresh stack in [lo, lo + size) whose first switch enters `entry`. */
static inline void *fast_stack(char *lo, size_t size, void (*entry)()) {
    void **p = (void **)(((uintptr_t)(lo + size)) & ~(uintptr_t)15);
    *--p = nullptr;          /* entry's return address: it never returns */
    *--p = (void *)entry;    /* where tn_switch's ret goes */
    for (int i = 0; i < 6; ++i) *--p = nullptr; /* the registers it pops */
    return p;
}
#else
#define TN_EMU_FAST_SWITCH 0
#endif

struct Fiber {
    ucontext_t ctx;
    void *sp;            /* its saved stack (TN_EMU_FAST_SWITCH) */
    char *stack_lo;      /* lowest usable byte; the guard page lies below */
    Index3 tid;
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
    int spin;            /* it polls a condition (poll_again): others run first */
#ifdef TN_EMU_FIBER_EXT
    TN_EMU_FIBER_EXT ext; /* the dialect's per-thread state */
#endif
};


struct State {
    pthread_mutex_t lock;
    /* launch */
    const char *kernel;
    void (*thunk)(void **);
    void **args;
    tn_emu_cfg cfg;
    tn_emu_err *err;
    Index3 grid, block;
    Index3 block_idx;
    Index3 thread_idx;
    int nthreads;
    int lanes;           /* threads per warp (cfg.lanes) */
    uint64_t rng;
    int ahead_warp;
    uint32_t poison32;
    uint64_t poison64;
    /* block */
    Fiber *fibers;
    Fiber *cur;
    ucontext_t sched;
    void *sched_sp;      /* the scheduler's saved stack (TN_EMU_FAST_SWITCH) */
    int done;
    int at_barrier;
    int barrier_line;
    int barrier_count;
    long *barrier_token;
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
#if TN_EMU_FAST_SWITCH
    tn_switch(&me->sp, S.sched_sp);
#else
    swapcontext(&me->ctx, &S.sched);
#endif
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
             "divergent barrier: thread %d reaches %s at line %d but threads [%s] "
             "of the block already exited without reaching it",
             me->lin, TN_EMU_BARRIER_NAME, line, who);
    }
    if (S.at_barrier > 0 && S.barrier_line != line && S.barrier_line > 0 && line > 0)
        fail(TN_EMU_DIVERGENT_BARRIER, line,
             "divergent barrier: thread %d reaches %s at line %d while other "
             "threads wait at the one at line %d",
             me->lin, TN_EMU_BARRIER_NAME, line, S.barrier_line);
    for (int i = 0; i < S.nthreads; ++i) {
        Fiber *f = &S.fibers[i];
        if (f->state == F_COLL && f->lin / S.lanes == me->lin / S.lanes &&
            (f->mask >> (me->lin % S.lanes) & 1u))
            fail(TN_EMU_DEADLOCK, line,
                 "deadlock: thread %d waits at %s (line %d) while lane %d of its warp "
                 "waits for it in %s (line %d, mask 0x%08x)",
                 me->lin, TN_EMU_BARRIER_NAME, line, f->lin % S.lanes, op_names[f->op], f->line,
                 f->mask);
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
static inline bool pow2_width(int w) { return w >= 1 && w <= S.lanes && (w & (w - 1)) == 0; }

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
    case OP_SHFL_XOR: src = l ^ (me->arg & (S.lanes - 1)); if (src > (l | (w - 1))) src = l; break;
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


#ifdef TN_EMU_EXT_OP
TN_RT void TN_EMU_EXT_OP(Fiber *warp, int wsize, int op, int line);
#endif
#ifdef TN_EMU_BLOCK_START
TN_RT void TN_EMU_BLOCK_START();
#endif
#ifdef TN_EMU_THREAD_EXIT
TN_RT void TN_EMU_THREAD_EXIT(Fiber *me);
#endif

TN_RT uint64_t collective(int op, int line, unsigned mask, int width, int arg, uint64_t val) {
    Fiber *me = S.cur;
    const int lane = me->lin % S.lanes;
    const int base = me->lin - lane;
    const int wsize = std::min(S.lanes, S.nthreads - base);
    const int wid = base / S.lanes;
    Fiber *warp = &S.fibers[base];
    const char *name = op_names[op];
    if (!(mask >> lane & 1u))
        fail(TN_EMU_COLLECTIVE_MISMATCH, line,
             "%s at line %d: lane %d of warp %d calls it with mask 0x%08x, which does not "
             "include the lane itself",
             name, line, lane, wid, mask);
    if (wsize < 32 && (mask >> wsize) != 0)
        fail(TN_EMU_COLLECTIVE_MISMATCH, line,
             "%s at line %d: mask 0x%08x names lanes that do not exist (warp %d has %d lanes)",
             name, line, mask, wid, wsize);
    if (!pow2_width(width))
        fail(TN_EMU_COLLECTIVE_MISMATCH, line,
             "%s at line %d: width %d is not a power of two in 1..%d", name, line, width,
             S.lanes);
    for (int k = 0; k < wsize; ++k) {
        if (k == lane) continue;
        Fiber *f = &warp[k];
        bool named = mask >> k & 1u;
        if (named && f->state == F_DONE)
            fail(TN_EMU_COLLECTIVE_EXITED, line,
                 "%s at line %d: lane %d of warp %d names lane %d in its mask 0x%08x, but lane "
                 "%d already exited without calling it",
                 name, line, lane, wid, k, mask, k);
        if (named && f->state == F_BARRIER)
            fail(TN_EMU_DEADLOCK, line,
                 "deadlock: lane %d of warp %d calls %s (line %d, mask 0x%08x) while lane %d "
                 "waits at %s (line %d)",
                 lane, wid, name, line, mask, k, TN_EMU_BARRIER_NAME, f->line);
        if (f->state == F_COLL && (named || (f->mask >> lane & 1u)) &&
            (f->mask != mask || f->op != op || f->width != width))
            fail(TN_EMU_COLLECTIVE_MISMATCH, line,
                 "collective mismatch in warp %d: lane %d calls %s (line %d) with mask 0x%08x "
                 "width %d, but lane %d waits in %s (line %d) with mask 0x%08x width %d",
                 wid, lane, name, line, mask, width, k, op_names[f->op], f->line, f->mask,
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
    if (complete && op >= OP_EXT) {
#ifdef __SANITIZE_THREAD__
        __tsan_acquire(me->token); /* the other lanes' operands, deposited before arrival */
#endif
#ifdef TN_EMU_EXT_OP
        TN_EMU_EXT_OP(warp, wsize, op, line);
#else
        fail(TN_EMU_COLLECTIVE_MISMATCH, line, "collective %d at line %d is not one of the "
             "dialect's", op, line);
#endif
        for (int k = 0; k < wsize; ++k) { warp[k].res = 0; warp[k].state = F_READY; }
    } else if (complete) {
        uint64_t out[TN_EMU_MAX_LANES];
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



TN_RT unsigned activemask() {
    /* Lanes of the caller's warp that have not exited: cooperative fibers have
     * no notion of convergence, so this is the widest mask CUDA could give. */
    int base = S.cur->lin - S.cur->lin % S.lanes;
    int wsize = std::min(S.lanes, S.nthreads - base);
    unsigned m = 0;
    for (int k = 0; k < wsize; ++k)
        if (S.fibers[base + k].state != F_DONE) m |= 1u << k;
    return m;
}

[[noreturn]] TN_RT void trap_at(int line) {
    fail(TN_EMU_TRAP, line, "%s at line %d in thread %d", TN_EMU_TRAP_NAME, line, S.cur->lin);
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

/* Index builtins: values of the running fiber (set by the scheduler). */
static inline const Index3 &cur_thread_idx() { return S.thread_idx; }
static inline const Index3 &cur_block_idx() { return S.block_idx; }
static inline const Index3 &cur_block_dim() { return S.block; }
static inline const Index3 &cur_grid_dim() { return S.grid; }
/* every lane of a warp of `lanes` threads */
static inline unsigned full_mask() { return S.lanes >= 32 ? 0xffffffffu : (1u << S.lanes) - 1u; }

} /* namespace tn_emu */

/* -------------------------------------------------------------- scheduler */
namespace tn_emu {

TN_RT uint64_t next_rand() {
    uint64_t z = (S.rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/** Whether fiber i may run now: ready, and not polling (poll_again). */
static inline bool runnable(int i) { return S.fibers[i].state == F_READY && !S.fibers[i].spin; }

/** The runnable fiber the policy runs next, or -1 when none is runnable. */
TN_RT int pick_runnable() {
    const int n = S.nthreads;
    switch (S.cfg.policy) {
    case 1:
        for (int i = n - 1; i >= 0; --i)
            if (runnable(i)) return i;
        return -1;
    case 2: {
        int lo = S.ahead_warp * S.lanes, hi = std::min(n, lo + S.lanes);
        for (int i = lo; i < hi; ++i)
            if (runnable(i)) return i;
        break;
    }
    case 3: {
        int ready = 0;
        for (int i = 0; i < n; ++i) ready += runnable(i);
        if (ready == 0) return -1;
        int k = (int)(next_rand() % (uint64_t)ready);
        for (int i = 0; i < n; ++i)
            if (runnable(i) && k-- == 0) return i;
        return -1;
    }
    default: break;
    }
    for (int i = 0; i < n; ++i)
        if (runnable(i)) return i;
    return -1;
}

/** The fiber to run next: a runnable one by the policy; when only polling
 * fibers are left, each of them polls once more. -1: none can run. */
TN_RT int pick() {
    int k = pick_runnable();
    if (k >= 0) return k;
    bool polling = false;
    for (int i = 0; i < S.nthreads; ++i)
        if (S.fibers[i].spin) {
            S.fibers[i].spin = 0;
            polling = true;
        }
    return polling ? pick_runnable() : -1;
}

/** The running fiber waits for a condition another thread makes true (an
 * mbarrier phase): it stays ready but runs again only once every other
 * thread has run until it blocked, polled or exited. */
TN_RT void poll_again() {
    S.cur->state = F_READY;
    S.cur->spin = 1;
    yield_to_scheduler();
}

/** A thread returned from the kernel: mark it done and check that nobody waits for it. */
TN_RT void thread_exit() {
    Fiber *me = S.cur;
    if (S.at_barrier > 0) {
        char who[512] = "";
        ranges(who, sizeof who, F_BARRIER);
        fail(TN_EMU_DIVERGENT_BARRIER, S.barrier_line,
             "divergent barrier: thread %d exits while threads [%s] wait at %s at "
             "line %d, which it never reached",
             me->lin, who, TN_EMU_BARRIER_NAME, S.barrier_line);
    }
    const int lane = me->lin % S.lanes, base = me->lin - lane;
    const int wsize = std::min(S.lanes, S.nthreads - base);
    const int wid = base / S.lanes;
    for (int k = 0; k < wsize; ++k) {
        Fiber *f = &S.fibers[base + k];
        if (f->state == F_COLL && (f->mask >> lane & 1u))
            fail(TN_EMU_COLLECTIVE_EXITED, f->line,
                 "%s at line %d: lane %d of warp %d exits without calling it, but lane %d waits "
                 "for it (mask 0x%08x)",
                 op_names[f->op], f->line, lane, wid, k, f->mask);
    }
#ifdef TN_EMU_THREAD_EXIT
    TN_EMU_THREAD_EXIT(me);
#endif
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
    n += snprintf(buf + n, sizeof buf - n, "at %s (line %d): [", TN_EMU_BARRIER_NAME, S.barrier_line);
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
#if TN_EMU_FAST_SWITCH
    tn_switch(&f->sp, S.sched_sp); /* back into run_block, which sees the error */
#else
    setcontext(&S.sched); /* back into run_block, which sees the error */
#endif
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
#ifdef TN_EMU_BLOCK_START
    TN_EMU_BLOCK_START();
#endif
    S.ahead_warp = (int)(next_rand() % (uint64_t)((n + S.lanes - 1) / S.lanes));
    for (int i = 0; i < n; ++i) {
        Fiber *f = &S.fibers[i];
        memset(f, 0, sizeof *f);
        f->lin = i;
        f->tid.x = i % S.block.x;
        f->tid.y = (i / S.block.x) % S.block.y;
        f->tid.z = i / (S.block.x * S.block.y);
        f->state = F_READY;
        f->stack_lo = S.pool + S.slot_bytes * (size_t)i + pg;
#if TN_EMU_FAST_SWITCH
        f->sp = fast_stack(f->stack_lo, S.slot_bytes - pg, fiber_main);
#else
        getcontext(&f->ctx);
        f->ctx.uc_stack.ss_sp = f->stack_lo;
        f->ctx.uc_stack.ss_size = S.slot_bytes - pg;
        f->ctx.uc_link = nullptr;
        makecontext(&f->ctx, (void (*)())fiber_main, 0);
#endif
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
#if TN_EMU_FAST_SWITCH
        tn_switch(&S.sched_sp, f->sp);
#else
        swapcontext(&S.sched, &f->ctx);
#endif
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
    char text[160];
    unsigned long long threads = (unsigned long long)b[0] * b[1] * b[2];
    const char *why = nullptr;
    const uint32_t lanes = c->lanes;
    if (lanes < 1 || lanes > TN_EMU_MAX_LANES || (lanes & (lanes - 1)) || c->max_threads < 1 ||
        c->max_block[0] < 1 || c->max_block[1] < 1 || c->max_block[2] < 1 ||
        c->max_shared > TN_EMU_SMEM_STORAGE) {
        snprintf(text, sizeof text, "the profile's limits do not fit the emulator (lanes a power "
                 "of two in 1..%d, at least one thread, shared memory at most %u bytes)",
                 TN_EMU_MAX_LANES, (unsigned)TN_EMU_SMEM_STORAGE);
        why = text;
    }
    else if (b[0] < 1 || b[1] < 1 || b[2] < 1 || g[0] < 1 || g[1] < 1 || g[2] < 1) why = "every grid and block extent must be at least 1";
    else if (threads > c->max_threads || b[0] > c->max_block[0] || b[1] > c->max_block[1] || b[2] > c->max_block[2]) {
        snprintf(text, sizeof text, "a block has at most %u threads (x <= %u, y <= %u, z <= %u)",
                 c->max_threads, c->max_block[0], c->max_block[1], c->max_block[2]);
        why = text;
    }
    else if (g[1] > 65535 || g[2] > 65535) why = "grid y and z are at most 65535";
    else if (c->shared_bytes > c->max_shared) {
        snprintf(text, sizeof text, "dynamic shared memory exceeds the emulated %llu bytes",
                 (unsigned long long)c->max_shared);
        why = text;
    }
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
    S.grid = Index3{cfg->grid[0], cfg->grid[1], cfg->grid[2]};
    S.block = Index3{cfg->block[0], cfg->block[1], cfg->block[2]};
    S.lanes = (int)cfg->lanes;
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
 *                   | lanes N | threads N | blockmax X Y Z | smem N
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
        else if (!strcmp(word, "lanes")) { if (fscanf(m, "%u", &cfg.lanes) != 1) return 2; }
        else if (!strcmp(word, "threads")) { if (fscanf(m, "%u", &cfg.max_threads) != 1) return 2; }
        else if (!strcmp(word, "blockmax")) { if (fscanf(m, "%u %u %u", &cfg.max_block[0], &cfg.max_block[1], &cfg.max_block[2]) != 3) return 2; }
        else if (!strcmp(word, "smem")) { if (fscanf(m, "%llu", (unsigned long long *)&cfg.max_shared) != 1) return 2; }
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
extern "C" __attribute__((visibility("default"))) int tn_emu_abi_version() { return 2; }


#endif /* TN_RUNTIME_H */
