"""Running the program ids of one phase on worker threads.

The program ids ``[0, n)`` of a parallel phase are independent, so any
assignment of them to threads computes the same outputs. The ids are cut into
contiguous *chunks* (``Schedule.chunk`` ids each, or about
:data:`CHUNKS_PER_WORKER` chunks per worker); the workers -- the calling thread
and pool threads -- take the next chunk from a shared counter until none is
left, so a worker whose core is busy with other work simply takes fewer
chunks. Neighbouring ids (tiles sharing an operand panel) stay on one worker
within a chunk.

Each worker has its own local buffers (one 64-byte aligned arena, the
``locals`` argument of the entry). Arenas are kept for later phases: each
thread keeps the last one it used (its lines are likely still in that core's
caches; handing it to a thread on another core made that thread's programs
about twice as slow on a small GEMM), and up to :data:`SPARE_ARENAS` more of
at most :data:`SPARE_BYTES` each are shared: a fresh arena would cost a page
fault per 4 KiB on first touch, more than a small GEMM's compute.
Each chunk has its own status word, on its own cache line, because the
generated code writes the word at every check. The error reported after the
phase is the first one of the lowest failing chunk: the first error in
program-id order, whatever the timing or the number of threads.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

#: chunks per worker when the schedule sets no chunk size (load balance vs
#: per-call overhead)
CHUNKS_PER_WORKER = 4
#: int32 slots between status words (one cache line)
_LINE = 16
#: arenas kept for reuse, and the largest one kept
SPARE_ARENAS = 2 * (os.cpu_count() or 1)
SPARE_BYTES = 16 << 20

_POOL: ThreadPoolExecutor | None = None


def pool() -> ThreadPoolExecutor:
    """The process-wide pool of helper threads (one per CPU, at least two)."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1),
                                   thread_name_prefix="tilenest-cpu")
    return _POOL


def chunks(n: int, workers: int, chunk: int | None) -> list[tuple[int, int]]:
    """Contiguous ``[lo, hi)`` ranges covering ``[0, n)``, in order."""
    if chunk:
        step = chunk
    elif workers > 1:
        step = max(1, -(-n // (workers * CHUNKS_PER_WORKER)))
    else:
        step = n
    return [(lo, min(n, lo + step)) for lo in range(0, n, step)]


class Arena:
    """Memory for one worker's local buffers."""

    def __init__(self, nbytes: int):
        self.mem = np.empty(nbytes + 64, dtype=np.uint8)
        self.base = self.mem.ctypes.data + (-self.mem.ctypes.data) % 64
        self.nbytes = nbytes
        self.tables: dict[tuple[int, ...], Any] = {}

    def pointers(self, offsets: tuple[int, ...]) -> int:
        """The ``locals`` argument: the address of a table of one pointer per
        buffer, at ``offsets`` in the arena."""
        t = self.tables.get(offsets)
        if t is None:
            t = (ctypes.c_void_p * max(1, len(offsets)))(*[self.base + o for o in offsets])
            self.tables[offsets] = t
        return ctypes.addressof(t)


_SPARE: list[Arena] = []  # list.pop/append are atomic under the GIL
_MINE = threading.local()  # each thread's own arena, reused while it fits


def _layout(sizes: list[int]) -> tuple[tuple[int, ...], int]:
    """64-byte aligned offsets of buffers of ``sizes`` bytes, and the total."""
    offs, total = [], 0
    for s in sizes:
        offs.append(total)
        total += (s + 63) // 64 * 64
    return tuple(offs), max(64, total)


def _take(nbytes: int) -> Arena:
    """An arena of at least ``nbytes``: the calling thread's own when it fits
    (its cache lines are likely still in this core's caches), else a spare."""
    a = getattr(_MINE, "arena", None)
    if a is not None and a.nbytes >= nbytes:
        _MINE.arena = None
        return a
    try:
        a = _SPARE.pop()
    except IndexError:
        return Arena(nbytes)
    return a if a.nbytes >= nbytes else Arena(max(nbytes, a.nbytes))


def _give(a: Arena) -> None:
    if getattr(_MINE, "arena", None) is None and a.nbytes <= SPARE_BYTES:
        _MINE.arena = a
    elif a.nbytes <= SPARE_BYTES and len(_SPARE) < SPARE_ARENAS:
        _SPARE.append(a)


def run_phase(fn: Any, argv: Any, symv: Any, sizes: list[int], n: int, workers: int,
              chunk: int | None) -> int:
    """Run program ids ``[0, n)`` of entry ``fn`` on up to ``workers`` threads
    (``argv``/``symv``: the ctypes arrays of argument pointers and symbols,
    ``sizes``: bytes of each local buffer); returns the status code of the
    first failing program (0: none failed)."""
    ranges = chunks(n, workers, chunk)
    offsets, nbytes = _layout(sizes)
    status = np.zeros((len(ranges), _LINE), dtype=np.int32)
    base = status.ctypes.data
    args = ctypes.addressof(argv), ctypes.addressof(symv)
    if workers == 1 or len(ranges) == 1:
        arena = _take(nbytes)
        locv = arena.pointers(offsets)
        for c, (lo, hi) in enumerate(ranges):
            fn(*args, locv, lo, hi, base + c * _LINE * 4)
        _give(arena)
        return _first_error(status)
    taken = itertools.count()  # next() is atomic under the GIL
    left = [len(ranges)]
    lock = threading.Lock()
    done = threading.Event()

    def settle() -> None:
        with lock:
            left[0] -= 1
            if not left[0]:
                done.set()

    errors: list[BaseException] = []

    def work() -> None:
        arena = None
        while (c := next(taken)) < len(ranges):
            try:
                if arena is None:
                    arena = _take(nbytes)
                    locv = arena.pointers(offsets)
                lo, hi = ranges[c]
                fn(*args, locv, lo, hi, base + c * _LINE * 4)
            except BaseException as e:  # raised by the calling thread, below
                errors.append(e)
                return
            finally:
                settle()
        if arena is not None:
            _give(arena)

    # a helper that starts after every chunk is taken finds nothing to do: the
    # phase ends when all chunks are done, without waiting for it to start
    try:
        for _ in range(min(workers, len(ranges)) - 1):
            pool().submit(work)
        work()
    finally:
        while next(taken) < len(ranges):  # chunks left after an error
            settle()
        done.wait()
    if errors:
        raise errors[0]
    return _first_error(status)


def _first_error(status: np.ndarray) -> int:
    """The status code of the lowest failing chunk (0: none failed)."""
    failed = np.flatnonzero(status[:, 0])
    return int(status[failed[0], 0]) if failed.size else 0
