"""Running the program ids of a call's phases on native worker threads.

The program ids ``[0, n)`` of a parallel phase are independent, so any
assignment of them to threads computes the same outputs. The ids are cut into
contiguous *chunks* (``Schedule.chunk`` ids each, or about
:data:`CHUNKS_PER_WORKER` chunks per worker; at most :data:`MAX_CHUNKS`
chunks); the workers -- the calling thread and pool threads -- take the next
chunk from a shared counter until none is left, so a worker whose core is
busy with other work simply takes fewer chunks. Neighbouring ids (tiles
sharing an operand panel) stay on one worker within a chunk.

The loop that does this is native code (:mod:`.workloop`, compiled once per
process): a call is one foreign call, which releases the GIL, runs every
phase and returns the status code. Pool threads are Python threads that
spend their whole life inside the native helper loop; between calls they
spin for :data:`SPIN` pause instructions (so a call made soon after the last
finds them awake, as BLAS libraries do), then sleep on a condition variable.
The pool grows to the helpers a call asks for (``threads`` of the call or
the schedule, at most :data:`MAX_THREADS` in all) and is stopped and joined
at interpreter exit; a forked child starts with no pool and makes its own on
its first parallel call (the parent's threads do not exist there, and its
locks may have been held at the fork).

Calls whose phases are all serial, or run on one thread, never touch the
pool: they run on the calling thread with that thread's own context. Calls
that use helpers run one at a time in the pool (a second Python thread's
parallel call waits for the first).

Each worker slot (0: the caller, ``k``: helper ``k``) has its own local
buffers, in one 64-byte aligned arena per slot kept in a :class:`Context`
for later calls (its lines are likely still in that core's caches, and a
fresh arena would cost a page fault per 4 KiB on first touch, more than a
small GEMM's compute); arenas over :data:`SPARE_BYTES` are made for the call
and dropped after it. Each chunk has its own status line (one cache line:
the generated code writes the word at every check); the error reported after
a phase is the first one of the lowest failing chunk: the first error in
program-id order, whatever the timing or the number of threads.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import threading
from typing import Any

import numpy as np

from ...errors import TilenestError
from . import workloop as W

#: chunks per worker when the schedule sets no chunk size (load balance vs
#: per-call overhead)
CHUNKS_PER_WORKER = 4
#: most chunks in one phase (a smaller ``Schedule.chunk`` is raised to fit):
#: the status lines of a phase stay within 4 MiB
MAX_CHUNKS = 1 << 16
#: largest arena a context keeps for later calls
SPARE_BYTES = 16 << 20
#: pause instructions a waiting worker spins before it sleeps (about 0.1 to
#: 1 ms, depending on the CPU's pause latency)
SPIN = 1 << 14
#: most threads one call uses, the caller included
MAX_THREADS = 4 * max(2, os.cpu_count() or 1)


def chunking(n: int, workers: int, chunk: int | None) -> tuple[int, int]:
    """``(step, count)``: ``[0, n)`` cut into ``count`` contiguous chunks of
    ``step`` ids (the last one possibly shorter).

    Without a schedule's ``chunk``, the step is the largest one up to
    ``n / (workers * CHUNKS_PER_WORKER)`` whose chunks, taken in turn by
    equally fast workers, load no worker with more than ``1 / TOLERANCE``
    over an even share of the ids (:func:`makespan`); failing that, the one
    that loads the busiest worker least. So 20 GEMM tiles on two workers are
    cut into ten chunks of two (ten tiles each), not seven of three (eleven
    and nine)."""
    if chunk:
        step = chunk
    elif workers > 1:
        most = max(1, -(-n // (workers * CHUNKS_PER_WORKER)))
        share = -(-n // workers)
        tried = range(most, max(0, most - _STEP_CANDIDATES), -1)
        step = next((s for s in tried if makespan(n, s, workers) <= share + share // TOLERANCE),
                    None) or min(tried, key=lambda s: (makespan(n, s, workers), -s))
    else:
        step = max(1, n)
    step = max(step, -(-n // MAX_CHUNKS))
    return step, -(-n // step)


#: how many chunk steps below the largest one :func:`chunking` tries
_STEP_CANDIDATES = 64
#: the busiest worker's ids may exceed an even share by ``1 / TOLERANCE``
TOLERANCE = 32


def makespan(n: int, step: int, workers: int) -> int:
    """The most ids one of ``workers`` equally fast workers runs when
    ``[0, n)`` is cut into chunks of ``step`` and each worker takes the next
    chunk as it finishes one (chunk ``i`` goes to worker ``i % workers``)."""
    count = -(-n // step)
    rounds = -(-count // workers)
    last = n - (count - 1) * step
    if workers > 1 and count % workers == 1:
        return (rounds - 1) * step + last
    return rounds * step


def chunks(n: int, workers: int, chunk: int | None) -> list[tuple[int, int]]:
    """Contiguous ``[lo, hi)`` ranges covering ``[0, n)``, in order."""
    step, count = chunking(n, workers, chunk)
    return [(c * step, min(n, c * step + step)) for c in range(count)]


# -- the native module -----------------------------------------------------------------
class Native:
    """The compiled worker loop (:mod:`.workloop`) and its entry points."""

    def __init__(self) -> None:
        from . import jit

        h = jit.host()
        obj, _ = jit.compile_object(W.module_text(h.triple), h, jit.target_machine(h),
                                    store=jit.RUNTIME_DISK)
        self.engine = jit.Engine(obj, h, "the native worker loop")
        f = lambda name, ret, *args: ctypes.CFUNCTYPE(ret, *args)(  # noqa: E731
            self.engine.address(name))
        vp, i64 = ctypes.c_void_p, ctypes.c_int64
        self.run = f(W.RUN, ctypes.c_int32, vp, vp)
        self.helper = f(W.HELPER, None, vp, i64, i64)
        self.stop = f(W.STOP, None, vp)
        self.init = f(W.INIT, ctypes.c_int32, vp, i64)


_NATIVE: list[Native] = []
_NATIVE_LOCK = threading.Lock()


def native() -> Native:
    """The worker loop of this process (compiled on first use)."""
    if not _NATIVE:
        with _NATIVE_LOCK:
            if not _NATIVE:
                _NATIVE.append(Native())
    return _NATIVE[0]


# -- memory of the calls ----------------------------------------------------------------
def _aligned(nbytes: int) -> tuple[np.ndarray, int]:
    """Zeroed memory of ``nbytes`` and the 64-byte aligned address in it."""
    mem = np.zeros(nbytes + 64, dtype=np.uint8)
    return mem, mem.ctypes.data + (-mem.ctypes.data) % 64


class Arena:
    """Memory for one worker's local buffers."""

    def __init__(self, nbytes: int):
        self.mem, self.base = _aligned(nbytes)
        self.nbytes = nbytes


def layout(sizes: list[int]) -> tuple[tuple[int, ...], int]:
    """64-byte aligned offsets of buffers of ``sizes`` bytes, and the total."""
    offs, total = [], 0
    for s in sizes:
        offs.append(total)
        total += (s + 63) // 64 * 64
    return tuple(offs), max(64, total)


def _tables(arenas: list[Arena], offsets: tuple[int, ...]) -> tuple[Any, int]:
    """The ``locals`` tables of the worker slots (one pointer per buffer, at
    ``offsets`` in the slot's arena) and the address of the array of their
    addresses: what a call record's locals field holds."""
    per_slot = [np.array([a.base + o for o in offsets] or [a.base], dtype=np.uint64)
                for a in arenas]
    top = np.array([t.ctypes.data for t in per_slot], dtype=np.uint64)
    return (per_slot, top), top.ctypes.data


class Context:
    """The arenas of the worker slots and the chunks' status lines that calls
    run in: the pool's (calls using helpers, one at a time) or one thread's
    own (calls running on that thread alone). ``epoch`` changes whenever an
    address a bound :class:`Launch` may hold changes."""

    def __init__(self) -> None:
        self.arenas: list[Arena] = []
        self.status: np.ndarray | None = None
        self.status_at = 0
        self.lines = 0
        self.epoch = 0
        self.tables: dict[tuple[tuple[int, ...], int], tuple[Any, int]] = {}

    def bind(self, launch: Launch) -> None:
        """Point ``launch``'s record at this context's memory (growing it as
        needed); a launch whose arenas are too large to keep gets arenas of
        its own for this call only."""
        rec = launch.record
        if launch.lines > self.lines:
            self.lines = max(launch.lines, 2 * self.lines, 64)
            self.status, self.status_at = _aligned(self.lines * W.STATUS_BYTES)
            self.epoch += 1
        rec[W.C_STATUS] = self.status_at
        if launch.nbytes > SPARE_BYTES:
            launch.scratch, rec[W.C_LOCALS] = _tables(
                [Arena(launch.nbytes) for _ in range(launch.slots)], launch.offsets)
            launch.bound = None
            return
        grown = False
        for k in range(launch.slots):
            if k == len(self.arenas):
                self.arenas.append(Arena(launch.nbytes))
            elif self.arenas[k].nbytes < launch.nbytes:
                self.arenas[k] = Arena(launch.nbytes)
                grown = True
        if grown:
            self.epoch += 1
            self.tables.clear()
        key = (launch.offsets, launch.slots)
        got = self.tables.get(key)
        if got is None:
            got = self.tables[key] = _tables(self.arenas[:launch.slots], launch.offsets)
        rec[W.C_LOCALS] = got[1]
        launch.bound = (self, self.epoch)


class Pool:
    """The helper threads, their control block (:mod:`.workloop`) and the
    context their calls run in."""

    def __init__(self) -> None:
        self.native = native()
        self.mem, self.ctrl = _aligned(W.CONTROL_BYTES)
        off = self.ctrl - self.mem.ctypes.data
        self.word = self.mem[off:off + W.CONTROL_BYTES].view(np.int64)
        if self.native.init(self.ctrl, SPIN):
            raise TilenestError("the CPU worker pool could not initialize its mutex and "
                                "condition variables")
        self.lock = threading.Lock()
        self.context = Context()
        self.threads: list[threading.Thread] = []

    def grow(self, helpers: int) -> None:
        """Start helper threads until there are ``helpers`` (called with the
        pool's lock held, so no job is running). A thread that cannot be
        started leaves the pool smaller: calls stay correct with any number of
        helpers."""
        while len(self.threads) < min(helpers, MAX_THREADS - 1):
            slot = len(self.threads) + 1
            seen = int(self.word[0]) >> 32
            t = threading.Thread(target=self.native.helper, args=(self.ctrl, slot, seen),
                                 name=f"tilenest-cpu-{slot}", daemon=True)
            try:
                t.start()
            except RuntimeError:
                return
            self.threads.append(t)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the helpers and wait (up to ``timeout`` seconds each) for them to
        return; a call still running finishes on the threads it has."""
        held = self.lock.acquire(timeout=timeout)
        try:
            self.native.stop(self.ctrl)
            for t in self.threads:
                t.join(timeout)
            self.threads = []
        finally:
            if held:
                self.lock.release()


_POOL: list[Pool] = []
_POOL_LOCK = threading.Lock()
_MINE = threading.local()  # each thread's own context, for calls without helpers


def pool() -> Pool:
    """The process's worker pool (made on first use)."""
    if not _POOL:
        with _POOL_LOCK:
            if not _POOL:
                _POOL.append(Pool())
    return _POOL[0]


def _shutdown() -> None:
    if _POOL:
        _POOL.pop().close()


def _forget_after_fork() -> None:
    """In a forked child: the parent's helper threads do not exist here and
    its locks may be held, so the child forgets the pool (its memory is left
    alone) and makes a new one when it needs one."""
    global _POOL_LOCK, _NATIVE_LOCK
    _POOL.clear()
    _POOL_LOCK = threading.Lock()
    _NATIVE_LOCK = threading.Lock()


atexit.register(_shutdown)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


# -- a call, as the native loop runs it ---------------------------------------------------
class Launch:
    """The phases of one call as the native loop runs them: the call record
    (:mod:`.workloop` layout) with its argument and symbol vectors, and what
    it needs of a context: ``slots`` workers' arenas of ``nbytes`` (local
    buffers at ``offsets``) and ``lines`` status lines.

    ``phases``: ``(entry address, programs, workers)`` per phase, in order;
    ``argv``, ``symv``: int64 arrays of argument addresses and symbol
    values (the record points at them; ``argv`` may be refilled between
    calls)."""

    def __init__(self, phases: list[tuple[int, int, int]], argv: np.ndarray, symv: np.ndarray,
                 sizes: list[int], chunk: int | None):
        self.argv, self.symv = argv, symv
        self.offsets, self.nbytes = layout(sizes)
        rows = []
        self.slots, self.lines = 1, 0
        for entry, n, workers in phases:
            if n <= 0:
                continue
            workers = max(1, min(workers, n, MAX_THREADS))
            step, count = chunking(n, workers, chunk)
            helpers = min(workers, count) - 1
            rows.append((entry, n, step, count, helpers))
            self.slots = max(self.slots, helpers + 1)
            self.lines = max(self.lines, count)
        self.parallel = self.slots > 1
        rec = np.zeros(W.C_HEADER + W.PHASE_FIELDS * len(rows), dtype=np.int64)
        rec[W.C_NPHASES] = len(rows)
        rec[W.C_ARGS] = argv.ctypes.data
        rec[W.C_SYMS] = symv.ctypes.data
        for i, row in enumerate(rows):
            at = W.C_HEADER + W.PHASE_FIELDS * i
            rec[at + W.P_ENTRY], rec[at + W.P_N], rec[at + W.P_STEP] = row[0], row[1], row[2]
            rec[at + W.P_NCHUNKS], rec[at + W.P_HELPERS] = row[3], row[4]
        self.record = rec
        self.address = rec.ctypes.data
        self.bound: tuple[Context, int] | None = None
        self.scratch: Any = None
        self.native = native()

    def copy(self) -> Launch:
        """An independent launch of the same phases (its own record and
        vectors), for a call made while this one is running."""
        other = object.__new__(Launch)
        other.__dict__.update(self.__dict__)
        other.argv, other.symv, other.record = self.argv.copy(), self.symv.copy(), \
            self.record.copy()
        other.record[W.C_ARGS] = other.argv.ctypes.data
        other.record[W.C_SYMS] = other.symv.ctypes.data
        other.address = other.record.ctypes.data
        other.bound = None
        return other

    def run(self) -> int:
        """Run every phase; the status code of the first failing program (0:
        none failed)."""
        if self.parallel:
            p = pool()
            with p.lock:
                p.grow(self.slots - 1)
                return self._run_in(p.context, p.ctrl)
        ctx = getattr(_MINE, "context", None)
        if ctx is None:
            ctx = _MINE.context = Context()
        return self._run_in(ctx, 0)

    def _run_in(self, ctx: Context, ctrl: int) -> int:
        b = self.bound
        if b is None or b[0] is not ctx or b[1] != ctx.epoch:
            ctx.bind(self)
        try:
            return self.native.run(ctrl, self.address)
        finally:
            self.scratch = None


def run_phase(entry: Any, argv: Any, symv: Any, sizes: list[int], n: int, workers: int,
              chunk: int | None) -> int:
    """Run program ids ``[0, n)`` of one phase of entry ``entry`` (an address,
    or a ctypes function pointer) on up to ``workers`` threads; ``argv``,
    ``symv``: ctypes arrays (or addresses) of the argument pointers and the
    symbol values; ``sizes``: bytes of each local buffer. Returns the status
    code of the first failing program (0: none failed)."""
    addr = lambda x: x if isinstance(x, int) else ctypes.addressof(x)  # noqa: E731
    fn = entry if isinstance(entry, int) else ctypes.cast(entry, ctypes.c_void_p).value
    launch = Launch([(int(fn or 0), n, workers)], np.zeros(1, np.int64), np.zeros(1, np.int64),
                    sizes, chunk)
    launch.record[W.C_ARGS], launch.record[W.C_SYMS] = addr(argv), addr(symv)
    return launch.run()
