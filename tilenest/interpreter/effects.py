"""The effect log: dynamic race detection for ``parallel``.

Definition (noninterference, ``spec/execution.md``): for a ``parallel`` region
instance and two distinct children ``i != j``,
``W(i) ∩ (R(j) ∪ W(j)) = ∅`` -- no element written by one child is read or
written by another. An op whose anchor lies above the region (a collective
op) acts once for all children: its accesses are attributed to the parent
instance, and conflict with any child's conflicting access but not with
themselves.

Every load and store (tensor or Memory) is recorded, element by element, in
every open parallel frame with the child ("lane") that made it. When a region
instance ends, its log is checked; a conflict raises :class:`RaceError` naming
both sites, both children's coordinates and the element. Because every access
is checked, a race-free run is equivalent to every sequential order of the
children for the run's inputs -- stronger than sampling orders.

Footprints. An access through an affine view arrives as a :class:`Box` (flat
index ``base + sum_a i_a * steps[a]`` over the access grid) rather than one
index per element. Against a batched frame's dense track a box is checked and
recorded as a strided view of the track's arrays with the children's lane
numbers as a small broadcast grid (:meth:`DenseTrack.access_box`), after
folding away the axes the access does not depend on (an axis over children
with step 0 means every element is touched by several children). Where that
view would not be exact -- elements the box reaches more than once, or any
conflict at all -- the access is expanded element by element and checked as
before, so the verdicts, the reported element, children and ops, and the
track's final state are those of the per-element check. Pipeline stage
recorders keep a :class:`Footprint` and list its distinct elements only when
two stage instances are compared and one of them writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import RaceError
from ..semantics.ir import Operation

COLLECTIVE = -1
NONE = -2  # dense tracking: no access yet
MULTI = -3  # dense tracking: read by several instances

#: largest buffer (elements) tracked densely; larger ones use the sorted log
DENSE_LIMIT = 1 << 26


@dataclass
class Frame:
    """One executing ``parallel`` region instance."""

    op: Operation
    depth: int
    shape: tuple[int, ...]
    batched: bool
    axes: tuple[int, int] = (0, 0)  # batch axes [start, stop) when batched
    child: int = 0  # current child (row-major index) when executed one by one
    log: dict[Any, list[tuple[np.ndarray, np.ndarray, bool, Operation]]] = field(
        default_factory=dict)
    dense: dict[Any, "DenseTrack"] = field(default_factory=dict)

    def coord(self, lane: int) -> tuple[int, ...]:
        return tuple(int(i) for i in np.unravel_index(lane, self.shape))


def overlaps_itself(a: np.ndarray) -> bool:
    """Do two distinct elements of ``a`` share bytes of storage (a stride of 0
    along an axis of two or more elements, or strides that make rows
    interleave, as ``np.lib.stride_tricks.as_strided`` can)?

    Sorted by stride, each axis stepping past everything the smaller axes
    span proves the elements disjoint; otherwise every element's byte range
    is compared."""
    if a.size < 2:
        return False
    span = a.itemsize
    for step, n in sorted((abs(s), n) for s, n in zip(a.strides, a.shape, strict=True) if n > 1):
        if step < span:
            break
        span = step * (n - 1) + span
    else:
        return False
    addr = np.zeros((), dtype=np.int64)
    for k, (s, n) in enumerate(zip(a.strides, a.shape, strict=True)):
        addr = addr[..., None] + np.arange(n, dtype=np.int64) * s if k else \
            np.arange(n, dtype=np.int64) * s
    first = np.sort(addr.ravel())
    return bool(np.any(np.diff(first) < a.itemsize))


@dataclass
class Buffer:
    """An addressable object: a tensor argument or a Memory allocation.

    Arguments whose arrays share memory (aliases) share one ``key``; their
    accesses are then recorded by byte address (``alias`` = the array's byte
    offset from the common base, its byte strides), so that conflicts between
    two names of one element are found. So are the accesses of an argument
    whose own elements share storage (:func:`overlaps_itself`: offset 0 from
    its own first element), so that two of its elements written by two
    instances are one element written twice."""

    key: Any
    name: str
    shape: tuple[int, ...]
    alias: tuple[int, tuple[int, ...]] | None = None

    def address(self, flat: np.ndarray) -> np.ndarray:
        if self.alias is None:
            return flat
        off, strides = self.alias
        coords = np.unravel_index(flat, self.shape)
        out = np.full(flat.shape, off, dtype=np.int64)
        for c, s in zip(coords, strides, strict=True):
            out += c.astype(np.int64) * s
        return out

    def describe(self, flat: int) -> str:
        if self.alias is not None:
            return f"{self.name} (byte offset {flat} of the shared storage)"
        elem = tuple(int(i) for i in np.unravel_index(flat, self.shape)) if self.shape else ()
        return f"{self.name}{list(elem)}"


@dataclass(frozen=True)
class Box:
    """The flat indices ``base + sum_a i_a * steps[a]`` for every point ``i`` of
    the grid ``shape`` (row-major): an affine access without a mask."""

    base: int
    steps: tuple[int, ...]
    shape: tuple[int, ...]

    @property
    def size(self) -> int:
        return int(np.prod(self.shape)) if self.shape else 1

    def flat(self) -> np.ndarray:
        """Every point's flat index (a broadcast view of shape ``shape``)."""
        out = np.full((1,) * len(self.shape), self.base, dtype=np.int64)
        for a, (s, m) in enumerate(zip(self.steps, self.shape, strict=True)):
            if s and m > 1:
                out = out + np.arange(m, dtype=np.int64).reshape(
                    (1,) * a + (m,) + (1,) * (len(self.shape) - a - 1)) * s
        return np.broadcast_to(out, self.shape)


@dataclass(frozen=True)
class Canon:
    """A box folded for one frame: distinct elements ``base + sum_k j_k *
    steps[k]`` (``steps`` positive, the grid ``shape``), touched by child
    ``lane + sum_k j_k * lanes[k]``; ``multi``: each element is also touched
    by other children (an axis over children that the address ignores)."""

    base: int
    steps: tuple[int, ...]
    shape: tuple[int, ...]
    lane: int
    lanes: tuple[int, ...]
    multi: bool

    def view(self, arr: np.ndarray) -> np.ndarray:
        """The box's elements of the flat track array ``arr`` (a writable view)."""
        return np.lib.stride_tricks.as_strided(
            arr[self.base:], self.shape, tuple(s * arr.itemsize for s in self.steps))

    def lane_grid(self) -> Any:
        """The child of each element (an int32 scalar or a broadcastable grid)."""
        out: Any = np.int32(self.lane)
        n = len(self.shape)
        for k, (ls, m) in enumerate(zip(self.lanes, self.shape, strict=True)):
            if ls:
                g = np.arange(m, dtype=np.int32).reshape((1,) * k + (m,) + (1,) * (n - k - 1))
                out = out + g * np.int32(ls)
        return out


def canon(box: Box, lane: int, lanes: tuple[int, ...]) -> Canon | None:
    """``box`` as distinct elements with their children (``lane`` plus
    ``lanes[a]`` per step along grid axis ``a``), or None when some element is
    reached along two different paths (the box is not injective once the axes
    of step 0 are dropped)."""
    base = box.base
    axes: list[tuple[int, int, int]] = []
    multi = False
    for st, n, ls in zip(box.steps, box.shape, lanes, strict=True):
        if n == 1:
            continue
        if st == 0:
            multi = multi or ls != 0
            continue
        if st < 0:  # walk the axis backwards: the same elements and children
            base += st * (n - 1)
            lane += ls * (n - 1)
            st, ls = -st, -ls
        axes.append((st, n, ls))
    axes.sort(key=lambda a: -a[0])
    reach = 0
    for st, n, _ in reversed(axes):
        if st <= reach:
            return None
        reach += st * (n - 1)
    return Canon(base, tuple(a[0] for a in axes), tuple(a[1] for a in axes), lane,
                 tuple(a[2] for a in axes), multi)


class Footprint:
    """The elements a pipeline stage instance touched with one access: a
    :class:`Box` or an index array, listed (sorted, distinct) on demand."""

    def __init__(self, where: Box | np.ndarray):
        self.where = where
        self._elements: np.ndarray | None = None

    def elements(self) -> np.ndarray:
        if self._elements is None:
            w = self.where
            if isinstance(w, Box):
                c = canon(w, 0, (0,) * len(w.shape))
                if c is not None:
                    sub = Box(c.base, c.steps, c.shape)
                    self._elements = np.sort(sub.flat().ravel())
                else:
                    self._elements = np.unique(w.flat())
            else:
                self._elements = np.unique(w)
        return self._elements


class DenseTrack:
    """Per-element last writer / reader instance of one buffer in one frame,
    checked as accesses arrive (linear time; used for batched frames). The
    writer and reader arrays are made at the first write and read (until then
    every element is ``NONE``)."""

    def __init__(self, size: int):
        self.size = size
        self._w: np.ndarray | None = None
        self._r: np.ndarray | None = None
        self.wop = np.zeros(size, dtype=np.int32)
        self.rop = np.zeros(size, dtype=np.int32)

    @property
    def w(self) -> np.ndarray:
        if self._w is None:
            self._w = np.full(self.size, NONE, dtype=np.int32)
        return self._w

    @property
    def r(self) -> np.ndarray:
        if self._r is None:
            self._r = np.full(self.size, NONE, dtype=np.int32)
        return self._r

    def writers_allow(self, c: Canon, lane: Any = None) -> bool:
        """Whether the access ``c`` conflicts with no recorded write: every
        element it touches that has a writer is written by the child that
        touches it (``lane``: ``c.lane_grid()``, when already made)."""
        if self._w is None:
            return True
        wv = c.view(self._w)
        if wv.max() == NONE:
            return True
        lane = c.lane_grid() if lane is None else lane
        return not (c.multi or np.any((wv != NONE) & (wv != lane)))

    def access_box(self, c: Canon, write: bool, oid: int) -> bool:
        """Record the access ``c`` of op ``oid`` as :meth:`access` would, when it
        conflicts with nothing; False, with nothing recorded, otherwise (the
        caller then makes the per-element check, which reports the conflict)."""
        lane = c.lane_grid()
        if not self.writers_allow(c, lane):
            return False
        if write:
            if c.multi:
                return False  # several children write each element
            if self._r is not None:
                rv = c.view(self._r)
                if rv.min() != NONE or rv.max() != NONE:
                    if np.any((rv != NONE) & (rv != lane)):
                        return False
            wv = c.view(self.w)
            wv[...] = lane
            c.view(self.wop)[...] = oid
            return True
        rv = c.view(self.r)
        if c.multi:
            rv[...] = MULTI
        elif rv.min() == NONE and rv.max() == NONE:
            rv[...] = lane
        else:
            rv[...] = np.where((rv == NONE) | (rv == lane), lane, MULTI)
        c.view(self.rop)[...] = oid
        return True

    def access(self, idx: np.ndarray, lane: np.ndarray, write: bool, oid: Any
               ) -> tuple[int, int, int, int, str] | None:
        """Record; on a conflict return (flat, lane, other lane, other oid, what).

        ``oid`` is the accessing op's id, or (reads only) one id per element of
        ``idx``: the accesses of several ops in the order they happened, so an
        element read more than once keeps the id of its last reader."""
        lane = lane.astype(np.int32)
        n = idx.size
        if n > 1 and idx[-1] - idx[0] == n - 1 and idx[0] >= 0:
            d = np.diff(idx)
            if d.min() == 1 and d.max() == 1:
                idx = slice(int(idx[0]), int(idx[0]) + n)  # a contiguous block: use views
        w = self.w[idx]
        bad = (w != NONE) & (w != lane)
        if np.any(bad):
            k = int(np.argmax(bad))
            f = _at(idx, k)
            return f, int(lane[k]), int(w[k]), int(self.wop[f]), "writes"
        if write:
            r = self.r[idx]
            bad = (r != NONE) & (r != lane)
            if np.any(bad):
                k = int(np.argmax(bad))
                f = _at(idx, k)
                return f, int(lane[k]), int(r[k]), int(self.rop[f]), "reads"
            self.w[idx] = lane
            self.wop[idx] = oid
            dup = self.w[idx] != lane  # two instances writing one element in this access
            if np.any(dup):
                k = int(np.argmax(dup))
                f = _at(idx, k)
                return f, int(lane[k]), int(self.w[f]), oid, "writes"
        else:
            r = self.r[idx]
            new = np.where(r == NONE, lane, np.where(r == lane, r, MULTI)).astype(np.int32)
            self.r[idx] = new
            if np.ndim(oid) and isinstance(idx, slice):
                self.rop[idx] = oid  # a contiguous block: no element twice
            elif np.ndim(oid):
                # the last occurrence of each element names its last reader
                rev = np.asarray(idx)[::-1]
                elems, first = np.unique(rev, return_index=True)
                self.rop[elems] = np.asarray(oid)[::-1][first]
            else:
                self.rop[idx] = oid
            if not isinstance(idx, slice):
                clash = self.r[idx] != new  # different instances reading in this access
                if np.any(clash):
                    self.r[idx[clash]] = MULTI
        return None


def _at(idx: Any, k: int) -> int:
    return idx.start + k if isinstance(idx, slice) else int(idx[k])


@dataclass(frozen=True)
class OpsAt:
    """The ops of a log entry that merges the accesses of several ops: element
    ``k`` of the entry was made by ``ops[which[k]]``."""

    ops: tuple[Operation, ...]
    which: np.ndarray


@dataclass
class Deferred:
    """A read recorded while a reduce region's iterations are evaluated together
    (:meth:`EffectLog.deferring`): the arguments of :meth:`EffectLog.record`
    (``flat`` a :class:`Box` for an unmasked affine read of an unaliased
    buffer, else flat indices)."""

    buf: Buffer
    flat: Any
    mask: Any
    op: Operation
    anchor_depth: int
    bshape: tuple[int, ...]
    tile: tuple[int, ...]


class EffectLog:
    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.frames: list[Frame] = []
        self._names: dict[Any, Buffer] = {}
        self.sinks: list[list] = []  # pipeline stage-instance recorders
        self.ops: dict[int, Operation] = {}
        #: reads held back while iterations run together (None: record at once)
        self.deferred: list[Deferred] | None = None

    @property
    def active(self) -> bool:
        """Whether accesses are recorded at all (some parallel frame or stage recorder)."""
        return bool(self.sinks) or (self.enabled and bool(self.frames))

    def record(self, buf: Buffer, flat: Any, mask: Any, write: bool, op: Operation,
               anchor_depth: int, bshape: tuple[int, ...], tile: tuple[int, ...]) -> None:
        """Record accesses to ``buf`` at flat indices ``flat`` (broadcastable to
        ``bshape + tile``, or a :class:`Box` over that grid), restricted to
        ``mask``."""
        if not self.sinks and (not self.enabled or not self.frames):
            return
        shape = tuple(bshape) + tuple(tile)
        if isinstance(flat, Box):
            if mask is None and buf.alias is None:
                if self.deferred is None:
                    self._record_box(buf, flat, write, op, anchor_depth, shape)
                    return
            else:
                flat = flat.flat()
        if self.deferred is not None:
            assert not write, "a batched reduce body does not write"
            self.deferred.append(Deferred(buf, flat, mask, op, anchor_depth, tuple(bshape),
                                          tuple(tile)))
            return
        flat_b = np.broadcast_to(flat, shape)
        sel = None if mask is None else np.broadcast_to(mask, shape)
        idx = flat_b[sel] if sel is not None else flat_b.ravel()
        if idx.size == 0:
            return
        idx = buf.address(idx)
        if self.sinks:
            self.sinks[-1].append((buf, Footprint(idx), write, op))
        if not self.enabled:
            return
        for fr in self.frames:
            lb = self.lanes(fr, anchor_depth, shape)
            lane = lb[sel] if sel is not None else lb.ravel()
            size = int(np.prod(buf.shape)) if buf.shape else 1
            if fr.batched and buf.alias is None and size <= DENSE_LIMIT:
                tr = self._track(fr, buf, size)
                self.ops[op.oid] = op
                self._dense(fr, buf, tr, idx.astype(np.int64), lane, write, op)
                continue
            fr.log.setdefault(buf.key, []).append((idx.astype(np.int64), lane, write, op))
        self._names[buf.key] = buf

    def _record_box(self, buf: Buffer, box: Box, write: bool, op: Operation,
                    anchor_depth: int, shape: tuple[int, ...]) -> None:
        """:meth:`record` of an unmasked affine access to an unaliased buffer:
        checked and recorded box-wise where that is exact (see the module
        docstring), element by element otherwise."""
        if box.size == 0:
            return
        if self.sinks:
            self.sinks[-1].append((buf, Footprint(box), write, op))
        if not self.enabled:
            return
        size = int(np.prod(buf.shape)) if buf.shape else 1
        for fr in self.frames:
            if fr.batched and size <= DENSE_LIMIT:
                tr = self._track(fr, buf, size)
                self.ops[op.oid] = op
                c = canon(box, *self._lane_steps(fr, anchor_depth, shape))
                if c is not None and tr.access_box(c, write, op.oid):
                    continue
                lane = self.lanes(fr, anchor_depth, shape).ravel()
                self._dense(fr, buf, tr, box.flat().ravel(), lane, write, op)
                continue
            lane = self.lanes(fr, anchor_depth, shape).ravel()
            fr.log.setdefault(buf.key, []).append((box.flat().ravel(), lane, write, op))
        self._names[buf.key] = buf

    def _track(self, fr: Frame, buf: Buffer, size: int) -> DenseTrack:
        tr = fr.dense.get(buf.key)
        if tr is None:
            tr = fr.dense[buf.key] = DenseTrack(size)
        return tr

    def _dense(self, fr: Frame, buf: Buffer, tr: DenseTrack, idx: np.ndarray,
               lane: np.ndarray, write: bool, op: Operation) -> None:
        """The per-element check and record of one access against a dense track;
        a conflict raises :class:`RaceError`."""
        hit = tr.access(idx, lane, write, op.oid)
        if hit is None:
            return
        flat, l1, l2, oid2, what = hit
        self._names[buf.key] = buf
        if l2 == MULTI:
            raise RaceError(
                f"race in parallel region over {list(fr.shape)}: {_who(fr, l1)} "
                f"writes {buf.describe(flat)} ({op.name}), which "
                f"several other instances read ({self.ops[oid2].name})",
                tuple(x for x in (op.loc, self.ops[oid2].loc, fr.op.loc) if x),
                _RACE_HINT)
        _raise(fr, buf, flat, l1, op, "writes" if write else "reads", l2,
               self.ops.get(oid2, op), what)

    def _lane_steps(self, fr: Frame, anchor_depth: int, shape: tuple[int, ...]
                    ) -> tuple[int, tuple[int, ...]]:
        """The children of an access grid ``shape`` as :meth:`lanes` gives them,
        affinely: (child at the origin, child step along each grid axis)."""
        steps = [0] * len(shape)
        if anchor_depth < fr.depth:
            return COLLECTIVE, tuple(steps)
        if not fr.batched:
            return fr.child, tuple(steps)
        s, e = fr.axes
        stride = 1
        for ax in range(e - 1, s - 1, -1):
            steps[ax] = stride
            stride *= fr.shape[ax - s]
        return 0, tuple(steps)

    def lanes(self, fr: Frame, anchor_depth: int, shape: tuple[int, ...]) -> np.ndarray:
        """The child of ``fr`` making each access of an access grid ``shape``
        (broadcast view): COLLECTIVE for an op anchored above the region, the
        row-major index of the batch coordinates of ``fr``'s axes when batched,
        else the child running now."""
        if anchor_depth < fr.depth:
            return np.broadcast_to(np.int64(COLLECTIVE), shape)
        if not fr.batched:
            return np.broadcast_to(np.int64(fr.child), shape)
        s, e = fr.axes
        grid = np.zeros((1,) * len(shape), dtype=np.int64)
        stride = 1
        for ax in range(e - 1, s - 1, -1):
            n = shape[ax]
            g = np.arange(n, dtype=np.int64).reshape(
                [n if k == ax else 1 for k in range(len(shape))])
            grid = grid + g * stride
            stride *= fr.shape[ax - s]
        return np.broadcast_to(grid, shape)

    def commit(self, reads: list[Deferred], axes: tuple[int, int], reverse: bool) -> bool:
        """Record deferred reads made by iterations evaluated together, exactly as
        if each iteration had made its own reads in turn; False (nothing recorded)
        when one of them conflicts with a write already in the log.

        Batch axes ``axes`` (start, stop) of every read's access grid are the
        iterations, in execution order (row-major; ``reverse``: backwards). The
        iteration-by-iteration run would record, per iteration, each read op in
        program order (the order of ``reads``), each access's elements in
        row-major order over the remaining axes; the merged accesses below keep
        that order, so whatever depends on it (the last reader of an element,
        the first conflicting read a later check reports) is unchanged. Reads
        never conflict with reads, and the checks made at record time compare a
        read only with the writes already logged, which these reads do not
        change: if no read of the batch conflicts, none of the one-by-one reads
        would have, and the log ends in the same state; if one does, the caller
        runs the iterations one by one instead (and meets the same error where
        the one-by-one run meets it)."""
        assert not self.sinks, "checked pipelines run their iterations one by one"
        if not self.active or not reads:
            return True
        s, e = axes
        groups: dict[Any, list[Deferred]] = {}
        for d in reads:
            groups.setdefault(d.buf.key, []).append(d)
        plans = []
        boxes = []
        for fr in self.frames:
            for key, ds in groups.items():
                c = self._box_read(fr, ds)
                if c is not None:
                    tr = fr.dense.get(key)
                    if tr is not None and not tr.writers_allow(c):
                        return False
                    boxes.append((fr, ds[0], c))
                    continue
                idx, lane, which = self._merged(fr, ds, s, e, reverse)
                if idx.size == 0:
                    continue
                buf = ds[0].buf
                size = int(np.prod(buf.shape)) if buf.shape else 1
                dense = fr.batched and buf.alias is None and size <= DENSE_LIMIT
                if dense:
                    tr = fr.dense.get(key)
                    if tr is not None and tr._w is not None:
                        w = tr.w[idx]
                        if np.any((w != NONE) & (w != lane)):
                            return False
                plans.append((fr, buf, ds, idx, lane, which, dense, size))
        for fr, d, c in boxes:
            self.ops[d.op.oid] = d.op
            self._names[d.buf.key] = d.buf
            if self.enabled:
                size = int(np.prod(d.buf.shape)) if d.buf.shape else 1
                done = self._track(fr, d.buf, size).access_box(c, False, d.op.oid)
                assert done, "checked above"
        for fr, buf, ds, idx, lane, which, dense, size in plans:
            ops = tuple(d.op for d in ds)
            for op in ops:
                self.ops[op.oid] = op
            self._names[buf.key] = buf
            if not self.enabled:
                continue
            if dense:
                tr = fr.dense.get(buf.key)
                if tr is None:
                    tr = fr.dense[buf.key] = DenseTrack(size)
                oid: Any = ops[0].oid if len(ops) == 1 else \
                    np.array([o.oid for o in ops], dtype=np.int32)[which]
                hit = tr.access(idx, lane, False, oid)
                assert hit is None, "checked above"
            else:
                entry_op: Any = ops[0] if len(ops) == 1 else OpsAt(ops, which)
                fr.log.setdefault(buf.key, []).append((idx, lane, False, entry_op))
        return True

    def _box_read(self, fr: Frame, ds: list[Deferred]) -> Canon | None:
        """The reads ``ds`` of one buffer as one box over the frame's dense
        track, where that records exactly what the one-by-one reads would:
        a single read op (every element keeps it as its last reader, whatever
        the order of the iterations) making an affine, unmasked access whose
        elements and children :func:`canon` can fold; None otherwise."""
        if len(ds) != 1 or not isinstance(ds[0].flat, Box) or not fr.batched:
            return None
        d = ds[0]
        size = int(np.prod(d.buf.shape)) if d.buf.shape else 1
        if size > DENSE_LIMIT:
            return None
        return canon(d.flat, *self._lane_steps(fr, d.anchor_depth, d.bshape + d.tile))

    def _merged(self, fr: Frame, ds: list[Deferred], s: int, e: int, reverse: bool
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The reads ``ds`` of one buffer as one access in one-by-one order:
        (addresses, children of ``fr``, index into ``ds`` of the op) per element."""
        cols_i, cols_l, cols_w, cols_m = [], [], [], []
        k = e - s
        for j, d in enumerate(ds):
            shape = d.bshape + d.tile
            front = list(range(s, e))

            def iters_first(a: Any) -> np.ndarray:
                a = np.moveaxis(np.broadcast_to(a, shape), front, list(range(k)))
                a = a.reshape((int(np.prod(shape[s:e])), -1))
                return a[::-1] if reverse else a

            cols_i.append(iters_first(d.flat.flat() if isinstance(d.flat, Box) else d.flat))
            cols_l.append(iters_first(self.lanes(fr, d.anchor_depth, shape)))
            cols_w.append(np.full(cols_i[-1].shape, j, dtype=np.int32))
            cols_m.append(iters_first(True if d.mask is None else d.mask))
        flat, lane, which, mask = (np.concatenate(c, axis=1).ravel()
                                   for c in (cols_i, cols_l, cols_w, cols_m))
        if not mask.all():
            flat, lane, which = flat[mask], lane[mask], which[mask]
        return ds[0].buf.address(flat).astype(np.int64), lane.astype(np.int64), which

    def push(self, fr: Frame) -> None:
        self.frames.append(fr)

    def pop(self, check: bool = True) -> None:
        fr = self.frames.pop()
        if check and self.enabled:
            self.check(fr)

    def check(self, fr: Frame) -> None:
        for key, entries in fr.log.items():
            _check_buffer(fr, self._names[key], entries)


def _check_buffer(fr: Frame, buf: Buffer, entries: list) -> None:
    w = [(i, ln, op) for i, ln, wr, op in entries if wr]
    if not w:
        return
    r = [(i, ln, op) for i, ln, wr, op in entries if not wr]

    def cat(es: list) -> tuple[np.ndarray, np.ndarray, np.ndarray, list]:
        # an entry merging several ops' reads (OpsAt) names its op per element
        ops: list[Operation] = []
        srcs = []
        for e in es:
            if isinstance(e[2], OpsAt):
                srcs.append(len(ops) + e[2].which.astype(np.int64))
                ops.extend(e[2].ops)
            else:
                srcs.append(np.full(e[0].shape, len(ops), dtype=np.int64))
                ops.append(e[2])
        idx = np.concatenate([e[0] for e in es])
        lane = np.concatenate([e[1] for e in es])
        return idx, lane, np.concatenate(srcs), ops

    wi, wl, ws, wops = cat(w)
    order = np.lexsort((wl, wi))
    wi, wl, ws = wi[order], wl[order], ws[order]
    same = (wi[1:] == wi[:-1]) & (wl[1:] != wl[:-1])
    if np.any(same):
        k = int(np.argmax(same))
        _raise(fr, buf, int(wi[k]), int(wl[k]), wops[ws[k]], "writes",
               int(wl[k + 1]), wops[ws[k + 1]], "writes")
    if not r:
        return
    ri, rl, rs, rops = cat(r)
    uw, first = np.unique(wi, return_index=True)
    pos = np.searchsorted(uw, ri)
    pos_c = np.minimum(pos, len(uw) - 1)
    found = (pos < len(uw)) & (uw[pos_c] == ri)
    writer = wl[first[pos_c]]
    bad = found & (writer != rl)
    if np.any(bad):
        k = int(np.argmax(bad))
        j = first[pos_c[k]]
        _raise(fr, buf, int(ri[k]), int(rl[k]), rops[rs[k]], "reads",
               int(wl[j]), wops[ws[j]], "writes")


def _who(fr: Frame, lane: int) -> str:
    if lane == COLLECTIVE:
        return "the parent instance (a collective op)"
    return f"instance {fr.coord(lane)}"


def _raise(fr: Frame, buf: Buffer, flat: int, l1: int, op1: Operation, a1: str, l2: int,
           op2: Operation, a2: str) -> None:
    raise RaceError(
        f"race in parallel region over {list(fr.shape)}: {_who(fr, l1)} {a1} "
        f"{buf.describe(flat)} ({op1.name}) and {_who(fr, l2)} {a2} it ({op2.name})",
        tuple(s for s in (op1.loc, op2.loc, fr.op.loc) if s is not None),
        _RACE_HINT)


_RACE_HINT = ("distinct parallel instances must not touch an element another one writes; give "
              "each instance its own elements, or use a reduce region / a serial order")
