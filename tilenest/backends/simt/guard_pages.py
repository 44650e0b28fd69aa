"""Array arguments of an emulated launch placed against an inaccessible page.

On a GPU, a kernel that reads past the end of an array usually reads
whatever lies there and goes on; ``compute-sanitizer --tool memcheck``
reports it. The emulator runs the same source on the host, where the arrays
are the caller's numpy arrays with other memory around them. To make such an
access fault instead, a launch copies each array argument into a mapping of
its own whose last element ends just below a page that can be neither read
nor written (:func:`placed`); the emulator's fault handler turns the fault
into an error naming the thread, and :meth:`Placement.owner` names the
argument whose guard page it hit. After the launch, the arrays the kernel may
write are copied back.

Each copy keeps its original address modulo :data:`ALIGN` bytes, so every
alignment test a kernel makes (the wide accesses of ``tn_aligned``) has the
outcome it has on the caller's array; fewer than ``ALIGN`` bytes therefore
lie between an array's end and its guard page, and an access that ends
within them is not caught. Arguments that overlap in memory (one array
passed twice, views of one buffer) share one mapping over their union, so
what one writes the other reads, as on the caller's memory. Accesses before
an array's first element are not guarded.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

#: the alignment (bytes) a copy keeps: the widest access the emitted code
#: makes on a global array (a 16-byte vector)
ALIGN = 16

_PROT_NONE, _PROT_RW = 0, mmap.PROT_READ | mmap.PROT_WRITE
_MAP = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]


@dataclass
class _Region:
    """One mapping of ``length`` bytes at ``base``: the bytes from ``source``
    copied to ``start``, the guard page at ``guard``."""

    base: int
    length: int
    start: int
    source: int
    guard: int


@dataclass
class Placement:
    """Where the arrays of one launch live during it: ``addresses[i]`` is the
    address passed for argument ``i`` (None where it is not an array)."""

    addresses: list[int | None]
    regions: list[_Region]
    #: per argument, the region holding it (None where it is not an array)
    _of: list[_Region | None]

    def owner(self, address: int) -> int | None:
        """The argument whose guard page holds ``address``, if any."""
        for i, r in enumerate(self._of):
            if r is not None and r.guard <= address < r.guard + mmap.PAGESIZE:
                return i
        return None


def _map(length: int) -> int:
    addr = _libc.mmap(None, length, _PROT_RW, _MAP, -1, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        raise MemoryError(f"mmap of {length} bytes failed (errno {ctypes.get_errno()})")
    return int(addr)


def _region(lo: int, hi: int) -> _Region:
    """A mapping holding the bytes ``[lo, hi)`` with a guard page right
    after their copy (less ``ALIGN`` bytes of slack)."""
    pg = mmap.PAGESIZE
    size = hi - lo
    pages = -(-(size + ALIGN) // pg)
    base = _map((pages + 1) * pg)
    guard = base + pages * pg
    if _libc.mprotect(guard, pg, _PROT_NONE) != 0:
        _libc.munmap(base, (pages + 1) * pg)
        raise OSError(ctypes.get_errno(), "mprotect of a guard page failed")
    start = guard - size
    start -= (start - lo) % ALIGN
    if size:
        ctypes.memmove(start, lo, size)
    return _Region(base, (pages + 1) * pg, start, lo, guard)


@contextlib.contextmanager
def placed(arrays: Sequence[np.ndarray | None], writable: Sequence[bool]
           ) -> Iterator[Placement]:
    """The arrays (None: no array there) copied against guard pages for the
    duration of the block; on leaving it, each array ``writable`` marks is
    copied back (also when the launch raised: it may have written part of
    its output) and the mappings are released."""
    spans = sorted((a.ctypes.data, a.ctypes.data + a.nbytes, i)
                   for i, a in enumerate(arrays) if a is not None)
    groups: list[list[tuple[int, int, int]]] = []
    for s in spans:
        if groups and s[0] < max(e for _, e, _ in groups[-1]):
            groups[-1].append(s)
        else:
            groups.append([s])
    regions: list[_Region] = []
    of: list[_Region | None] = [None] * len(arrays)
    addresses: list[int | None] = [None] * len(arrays)
    try:
        for g in groups:
            lo, hi = g[0][0], max(e for _, e, _ in g)
            r = _region(lo, hi)
            regions.append(r)
            for s, _e, i in g:
                of[i] = r
                addresses[i] = r.start + (s - lo)
        yield Placement(addresses, regions, of)
    finally:
        for i, a in enumerate(arrays):
            r = of[i]
            if a is not None and r is not None and writable[i] and a.nbytes:
                ctypes.memmove(a.ctypes.data, r.start + (a.ctypes.data - r.source), a.nbytes)
        for r in regions:
            _libc.munmap(r.base, r.length)
