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

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import BoundsError
from ..semantics import expr as E
from ..semantics.ir import Operation
from ..semantics.policies import Bounds
from ..semantics.types import MemoryType, TensorType, TileType
from . import numerics as N
from .core import Interpreter, TensorRT, poison_value, rule
from .effects import Buffer
from .runtime import RV, eval_exprs
from .values import _batch_grids


def _access(it: Interpreter, op: Operation, t: TensorRT, tile_shape: tuple[int, ...]
            ) -> tuple[list[np.ndarray], np.ndarray, np.ndarray | None, tuple[int, ...]]:
    """Tensor coordinates, in-view mask and active-lane mask over batch + tile."""
    nb = it.nb
    r = len(tile_shape)
    exprs = list(op.attrs["map"]) + [op.attrs["valid"]]
    vals = eval_exprs(exprs, it.ienv, nb, op.attrs["vars"], tile_shape, it.values)
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


@rule("tensor.load")
def _tload(it: Interpreter, op: Operation) -> None:
    t: TensorRT = it.values[op.operands[0].name]
    rt: TileType = op.result.type
    shape = tuple(it.extent(e) for e in rt.extents)
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
    if t.array.size:
        flat = np.ravel_multi_index(safe, t.array.shape)
        it.effects.record(t.buffer, flat, live, False, op, it.anchor_depth(op), it.bshape,
                          shape)
    it.set(op.result, RV(out, it.nb))


@rule("tensor.store")
def _tstore(it: Interpreter, op: Operation) -> None:
    t: TensorRT = it.values[op.operands[0].name]
    v = it.val(op.operands[1])
    shape = v.tile_shape
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
    offsets: np.ndarray  # storage offset of each logical element


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
    env: dict[E.Expr, Any] = dict(it.ienv.syms)
    grids = np.meshgrid(*[np.arange(n) for n in shape], indexing="ij") if shape else []
    for v, g in zip(mt.layout.vars, grids, strict=True):
        env[E.Var(v)] = g
    off = np.broadcast_to(np.asarray(E.evaluate(mt.layout.offset, env), dtype=np.int64), shape)
    if off.size and (off.min() < 0 or off.max() >= size):
        raise BoundsError(f"memory layout maps an element to offset outside [0, {size})", op.loc)
    it.mem_ids += 1
    arr = np.full(tuple(it.bshape) + (size,), poison_value(mt.dtype.np), dtype=mt.dtype.np)
    m = MemRT(arr, it.nb, Buffer(("mem", it.mem_ids), f"%{op.results[0].name}", arr.shape), off)
    it.values[op.results[0].name] = m
    it.values[op.results[1].name] = StateRT(m)


def _mem_index(it: Interpreter, m: MemRT) -> tuple[list[np.ndarray], tuple[int, ...]]:
    r = m.offsets.ndim
    full = tuple(it.bshape) + m.offsets.shape
    grids = _batch_grids(m.array.shape, m.nb, r)
    grids = [g.reshape(g.shape[:m.nb] + (1,) * (it.nb - m.nb) + g.shape[m.nb:]) for g in grids]
    off = m.offsets.reshape((1,) * it.nb + m.offsets.shape)
    return [np.broadcast_to(g, full) for g in grids] + [np.broadcast_to(off, full)], full


@rule("memory.store")
def _mstore(it: Interpreter, op: Operation) -> None:
    m: MemRT = it.values[op.operands[0].name]
    v = it.val(op.operands[2])
    idx, full = _mem_index(it, m)
    vals = np.broadcast_to(v.lift(it.nb), full)
    r = m.offsets.ndim
    if it.lane_mask is not None:
        act = np.broadcast_to(it.lane_mask.reshape(it.lane_mask.shape + (1,) * r), full)
        m.array[tuple(i[act] for i in idx)] = vals[act]
    else:
        act = None
        m.array[tuple(idx)] = vals
    flat = np.ravel_multi_index(tuple(idx), m.array.shape)
    it.effects.record(m.buffer, flat, act, True, op, it.anchor_depth(op), it.bshape,
                      m.offsets.shape)
    it.values[op.results[0].name] = StateRT(m)


@rule("memory.load")
def _mload(it: Interpreter, op: Operation) -> None:
    m: MemRT = it.values[op.operands[0].name]
    idx, full = _mem_index(it, m)
    out = m.array[tuple(idx)]
    r = m.offsets.ndim
    act = None
    if it.lane_mask is not None:
        act = np.broadcast_to(it.lane_mask.reshape(it.lane_mask.shape + (1,) * r), full)
    flat = np.ravel_multi_index(tuple(idx), m.array.shape)
    it.effects.record(m.buffer, flat, act, False, op, it.anchor_depth(op), it.bshape,
                      m.offsets.shape)
    it.set(op.result, RV(out, it.nb))


_ = TensorType
