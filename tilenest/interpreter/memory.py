"""Meaning of the addressable effects (``semantics/ops/memory.py``).

A view access touches, for each tile-local coordinate ``u``, the tensor
element ``map(u)``. The access is *in view* when that element lies inside the
tensor and the view's ``valid`` predicate holds. Out-of-view reads give 0
(``zero``) or the fill value (``fill``) and out-of-view writes are dropped;
under ``checked`` (and a broken ``assume`` promise) any out-of-view access is a
:class:`BoundsError` naming the op, the element and the instance.

A Memory allocation exists once per instance of its owner; stores write the
whole logical tile through the layout's offsets, loads copy it back out (a
snapshot: later stores cannot change it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..errors import BoundsError
from ..semantics import expr as E
from ..semantics.ir import Operation
from ..semantics.layout_facts import require_injective
from ..semantics.policies import Bounds
from ..semantics.types import MemoryType, TensorType, TileType
from ..semantics import numerics as N
from ..semantics.arrays import poison_value, strided
from . import shadow as S
from .core import Interpreter, TensorRT, rule
from .effects import Box, Buffer
from .runtime import RV, eval_exprs
from .values import _batch_grids


def _access(it: Interpreter, op: Operation, t: TensorRT, tile_shape: tuple[int, ...]
            ) -> tuple[list[np.ndarray], np.ndarray, np.ndarray | None, tuple[int, ...]]:
    """Tensor coordinates, in-view mask and active-lane mask over batch + tile."""
    nb = it.nb
    r = len(tile_shape)
    exprs = list(op.attrs["map"]) + [op.attrs["valid"]]
    vals = eval_exprs(exprs, it.ienv, nb, op.attrs["vars"], tile_shape, it.values, it.index_from_inexact)
    coords, valid_pred = vals[:-1], vals[-1]
    full = tuple(it.bshape) + tuple(tile_shape)
    coords = [np.broadcast_to(np.asarray(c, dtype=np.int64), full) for c in coords]
    ok = np.broadcast_to(np.asarray(valid_pred, dtype=bool), full)
    for c, n in zip(coords, t.array.shape, strict=True):
        ok = ok & (c >= 0) & (c < n)
    act = None
    if it.lane_mask is not None:
        act = np.broadcast_to(it.lane_mask.reshape(it.lane_mask.shape + (1,) * r), full)
    return coords, ok, act, full


def _bounds_error(op: Operation, t: TensorRT, coords: list[np.ndarray], bad: np.ndarray,
                  it: Interpreter, what: str) -> BoundsError:
    k = tuple(int(i) for i in np.argwhere(bad)[0])
    elem = [int(c[k]) for c in coords]
    nb = it.nb
    pol = op.attrs["bounds"]
    inst = f" in instance {list(k[:nb])}" if nb else ""
    kind = "breaks the in-bounds promise (bounds.assume)" if pol.kind is Bounds.assume else \
        "is out of bounds"
    return BoundsError(
        f"{what} of {t.buffer.name}{elem} (tile element {list(k[nb:])}{inst}) {kind}: "
        f"extents {list(t.array.shape)}", op.loc,
        "use bounds zero/fill to mask ragged edges, or fix the view's origin and shape")


@lru_cache(maxsize=4096)
def _linear(e: E.Expr) -> tuple[tuple[tuple[E.Expr, int], ...], int]:
    """``E._linear`` of a view's coordinate, kept: an access runs once per
    iteration of the loops around it."""
    d, c0 = E._linear(e)
    return tuple(d.items()), c0


def affine_view(it: Interpreter, op: Operation, arr: np.ndarray, tile_shape: tuple[int, ...],
                write: bool) -> tuple[np.ndarray, np.ndarray] | None:
    """The fast path of a view access: when every coordinate is affine in the
    batched and tile-local variables, the whole access lies inside the tensor,
    the view predicate is true and all lanes are active, the accessed elements
    form a strided block. Returns that block as a numpy view (batch + tile
    shaped) and the flat element indices generator data, or None."""
    if it.lane_mask is not None or op.attrs["valid"] != E.TRUE or arr.size == 0:
        return None
    nb = it.nb
    full = tuple(it.bshape) + tuple(tile_shape)
    axis_of: dict[E.Expr, int] = dict(it.batch_axes)
    for j, v in enumerate(op.attrs["vars"]):
        axis_of[E.Var(v)] = nb + j
    consts: dict[E.Expr, int] = dict(it.ienv.syms)
    for k, v in it.ienv.vars.items():
        if isinstance(v, (int, np.integer)):
            consts[k] = int(v)
    base, coef = [], []
    for e in op.attrs["map"]:
        d, c0 = _linear(e)
        row = [0] * len(full)
        for atom, cf in d:
            if atom in axis_of:
                row[axis_of[atom]] += cf
                c0 += cf * it.batch_base.get(atom, 0)
            else:
                if any(isinstance(lf, E.Val) or (isinstance(lf, E.Var) and lf not in consts)
                       for lf in E.leaves(atom)):
                    return None
                c0 += cf * int(E.evaluate(atom, consts))
        base.append(c0)
        coef.append(row)
    for b, row, n in zip(base, coef, arr.shape, strict=True):
        lo = b + sum(min(0, c * (m - 1)) for c, m in zip(row, full, strict=True))
        hi = b + sum(max(0, c * (m - 1)) for c, m in zip(row, full, strict=True))
        if lo < 0 or hi >= n:
            return None
    estr = [s // arr.itemsize for s in arr.strides]
    step = [sum(coef[k][a] * estr[k] for k in range(arr.ndim)) for a in range(len(full))]
    if write:
        used = sorted((abs(s), m) for s, m in zip(step, full, strict=True) if m > 1)
        reach = 0
        for s, m in used:
            if s <= reach:
                return None  # not injective: several lanes/elements share an element
            reach += s * (m - 1)
    start = arr[tuple(slice(b, None) for b in base)] if arr.ndim else arr
    view = strided(start, tuple(full), [s * arr.itemsize for s in step], write)
    # flat (row-major, logical) indices, only needed by the effect log
    lstr = [math.prod(arr.shape[k + 1:]) for k in range(arr.ndim)]
    lbase = sum(b * s for b, s in zip(base, lstr, strict=True))
    lstep = [sum(coef[k][a] * lstr[k] for k in range(arr.ndim)) for a in range(len(full))]
    return view, np.array([lbase] + lstep, dtype=np.int64)


def _flat_from(meta: np.ndarray, full: tuple[int, ...]) -> Box:
    """The flat elements of an affine access (``affine_view``'s index data) as a
    box over the access grid ``full``."""
    return Box(int(meta[0]), tuple(int(s) for s in meta[1:]), tuple(full))


@rule("tensor.load")
def _tload(it: Interpreter, op: Operation) -> None:
    t: TensorRT = it.values[op.operands[0].name]
    rt: TileType = op.result.type
    shape = tuple(it.extent(e) for e in rt.extents)
    fast = affine_view(it, op, t.array, shape, False)
    if fast is not None:
        view, meta = fast
        full = tuple(it.bshape) + shape
        if t.written is not None:
            w = affine_view(it, op, t.written, shape, False)
            assert w is not None
            if not np.all(w[0]):
                fast = None
        if fast is not None:
            if it.effects.enabled and it.effects.frames or it.effects.sinks:
                it.effects.record(t.buffer, _flat_from(meta, full), None, False, op,
                                  it.anchor_depth(op), it.bshape, shape)
            # batch axes the access does not depend on stay size 1 (broadcast later);
            # an empty batch axis (no instance) stays empty
            sub = tuple(slice(0, 1) if (a < it.nb and view.strides[a] == 0) else slice(None)
                        for a in range(len(full)))
            # a tensor nothing writes during the run: its elements are the load's
            # snapshot already (a read-only view); otherwise copy them
            out = RV(view[sub] if t.constant else np.array(view[sub]), it.nb)
            if t.lo is not None:
                bs = [affine_view(it, op, arr, shape, False) for arr in (t.lo, t.hi, t.nan)]
                out.with_bounds(*(np.array(b[0][sub]) for b in bs))
            it.set(op.result, out)
            return
    coords, ok, act, full = _access(it, op, t, shape)
    pol = op.attrs["bounds"]
    live = ok if act is None else (ok & act)
    if pol.kind in (Bounds.checked, Bounds.assume):
        bad = ~ok if act is None else (~ok & act)
        if np.any(bad):
            raise _bounds_error(op, t, coords, bad, it, "load")
    safe = tuple(np.where(live, c, 0) for c in coords)
    if t.array.size == 0:
        got = np.zeros(full, dtype=t.array.dtype)
    else:
        got = t.array[safe]
    if t.written is not None:
        w = t.written[safe] if t.array.size else np.zeros(full, dtype=bool)
        bad = live & ~w
        if np.any(bad):
            from ..errors import UninitializedReadError

            k = tuple(int(i) for i in np.argwhere(bad)[0])
            raise UninitializedReadError(
                f"load reads {t.buffer.name}{[int(c[k]) for c in coords]}, which nothing wrote",
                op.loc, "the element belongs to an output the program has not stored yet")
    fill = N.constant(pol.fill if pol.kind is Bounds.fill else 0, rt.dtype)
    out = np.where(live, got, fill)
    res = RV(out, it.nb)
    if t.lo is not None and t.array.size:
        res.with_bounds(*(np.where(live, b[safe], f)
                          for b, f in zip((t.lo, t.hi, t.nan), S.point_of(fill), strict=True)))
    if t.array.size:
        flat = np.ravel_multi_index(safe, t.array.shape)
        it.effects.record(t.buffer, flat, live, False, op, it.anchor_depth(op), it.bshape,
                          shape)
    it.set(op.result, res)


@rule("tensor.store")
def _tstore(it: Interpreter, op: Operation) -> None:
    t: TensorRT = it.values[op.operands[0].name]
    v = it.val(op.operands[1])
    shape = v.tile_shape
    fast = affine_view(it, op, t.array, shape, True)
    if fast is not None:
        view, meta = fast
        full = tuple(it.bshape) + shape
        view[...] = np.broadcast_to(v.lift(it.nb), full)
        if v.lo is not None or t.lo is not None:
            for arr, b in zip(t.bounds_arrays(), v.shadow(), strict=True):
                affine_view(it, op, arr, shape, True)[0][...] = np.broadcast_to(
                    v.lift(it.nb, b), full)
        if t.written is not None:
            w = affine_view(it, op, t.written, shape, True)
            assert w is not None
            w[0][...] = True
        if it.effects.enabled and it.effects.frames or it.effects.sinks:
            it.effects.record(t.buffer, _flat_from(meta, full), None, True, op,
                              it.anchor_depth(op), it.bshape, shape)
        return
    coords, ok, act, full = _access(it, op, t, shape)
    pol = op.attrs["bounds"]
    if pol.kind in (Bounds.checked, Bounds.assume):
        bad = ~ok if act is None else (~ok & act)
        if np.any(bad):
            raise _bounds_error(op, t, coords, bad, it, "store")
    live = ok if act is None else (ok & act)
    vals = np.broadcast_to(v.lift(it.nb), full)
    sel = tuple(c[live] for c in coords)
    t.array[sel] = vals[live]
    if v.lo is not None or t.lo is not None:
        for arr, b in zip(t.bounds_arrays(), v.shadow(), strict=True):
            arr[sel] = np.broadcast_to(v.lift(it.nb, b), full)[live]
    if t.written is not None:
        t.written[sel] = True
    if t.array.size:
        flat = np.ravel_multi_index(tuple(np.where(live, c, 0) for c in coords), t.array.shape)
        it.effects.record(t.buffer, flat, live, True, op, it.anchor_depth(op), it.bshape, shape)


@dataclass
class MemRT:
    """One Memory object's allocations: ``array`` has the owner's batch axes
    (one allocation per owner instance executed together) then ``size``."""

    array: np.ndarray
    nb: int
    buffer: Buffer
    # storage offset of each logical element: the owner's ``nb`` batch axes (size 1
    # where the layout is the same for every instance), then the logical shape
    offsets: np.ndarray
    lo: np.ndarray | None = None  # oracle: the admitted set of stored values (shadow.py)
    hi: np.ndarray | None = None
    nan: np.ndarray | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        """The logical (tile) shape."""
        return self.offsets.shape[self.nb:]


@dataclass
class StateRT:
    memory: MemRT


@rule("memory.alloc")
def _alloc(it: Interpreter, op: Operation) -> None:
    mt: MemoryType = op.results[0].type
    size = it.extent(mt.layout.size)
    shape = tuple(it.extent(e) for e in mt.space.extents)
    if size < 0:
        raise BoundsError(f"memory layout size {size} is negative", op.loc)
    # the layout at every instance executed together (it may mention their coordinates)
    r = len(shape)
    (off,) = eval_exprs([mt.layout.offset], it.ienv, it.nb, mt.layout.vars, shape, it.values, it.index_from_inexact)
    off = np.asarray(off, dtype=np.int64)
    off = off.reshape((1,) * (it.nb + r - off.ndim) + off.shape)
    off = np.broadcast_to(off, off.shape[:it.nb] + shape)
    act = it.active_lanes()
    if any(n > 1 for n in off.shape[:it.nb]):
        off = np.broadcast_to(off, it.bshape + shape)
        layouts = off.reshape((-1,) + shape) if act is None else off[act]
        if act is not None:  # inactive instances: any valid offset (they access nothing)
            off = np.where(act.reshape(act.shape + (1,) * r), off, 0)
        layouts = np.unique(layouts.reshape(layouts.shape[0], -1), axis=0).reshape(
            (-1,) + shape)
    else:
        layouts = off.reshape((-1,) + shape)[:1]
    if layouts.size and (layouts.min() < 0 or layouts.max() >= size):
        raise BoundsError(f"memory layout maps an element to offset outside [0, {size})", op.loc)
    for lay in layouts:  # M-12 at these extents, for each distinct layout
        require_injective(lay, size, op.loc, f"%{op.results[0].name}")
    it.mem_ids += 1
    arr = np.full(tuple(it.bshape) + (size,), poison_value(mt.dtype.np), dtype=mt.dtype.np)
    m = MemRT(arr, it.nb, Buffer(("mem", it.mem_ids), f"%{op.results[0].name}", arr.shape), off)
    it.values[op.results[0].name] = m
    it.values[op.results[1].name] = StateRT(m)


def _mem_index(it: Interpreter, m: MemRT) -> tuple[list[np.ndarray], tuple[int, ...]]:
    r = len(m.shape)
    full = tuple(it.bshape) + m.shape
    grids = _batch_grids(m.array.shape, m.nb, r)
    grids = [g.reshape(g.shape[:m.nb] + (1,) * (it.nb - m.nb) + g.shape[m.nb:]) for g in grids]
    o = m.offsets
    off = o.reshape(o.shape[:m.nb] + (1,) * (it.nb - m.nb) + m.shape)
    return [np.broadcast_to(g, full) for g in grids] + [np.broadcast_to(off, full)], full


@rule("memory.store")
def _mstore(it: Interpreter, op: Operation) -> None:
    m: MemRT = it.values[op.operands[0].name]
    v = it.val(op.operands[2])
    idx, full = _mem_index(it, m)
    vals = np.broadcast_to(v.lift(it.nb), full)
    r = len(m.shape)
    if v.lo is not None and m.lo is None:
        m.lo, m.hi, m.nan = (np.array(b) for b in S.point_of(m.array))
    targets = [(m.array, vals)]
    if m.lo is not None:
        targets += [(arr, np.broadcast_to(v.lift(it.nb, b), full))
                    for arr, b in zip((m.lo, m.hi, m.nan), v.shadow(), strict=True)]
    if it.lane_mask is not None:
        act = np.broadcast_to(it.lane_mask.reshape(it.lane_mask.shape + (1,) * r), full)
        for arr, vv in targets:
            arr[tuple(i[act] for i in idx)] = vv[act]
    else:
        act = None
        for arr, vv in targets:
            arr[tuple(idx)] = vv
    flat = np.ravel_multi_index(tuple(idx), m.array.shape)
    it.effects.record(m.buffer, flat, act, True, op, it.anchor_depth(op), it.bshape,
                      m.shape)
    it.values[op.results[0].name] = StateRT(m)


@rule("memory.load")
def _mload(it: Interpreter, op: Operation) -> None:
    m: MemRT = it.values[op.operands[0].name]
    idx, full = _mem_index(it, m)
    out = m.array[tuple(idx)]
    res = RV(out, it.nb)
    if m.lo is not None:
        res.with_bounds(m.lo[tuple(idx)], m.hi[tuple(idx)], m.nan[tuple(idx)])
    r = len(m.shape)
    act = None
    if it.lane_mask is not None:
        act = np.broadcast_to(it.lane_mask.reshape(it.lane_mask.shape + (1,) * r), full)
    flat = np.ravel_multi_index(tuple(idx), m.array.shape)
    it.effects.record(m.buffer, flat, act, False, op, it.anchor_depth(op), it.bshape,
                      m.shape)
    it.set(op.result, res)


_ = TensorType
