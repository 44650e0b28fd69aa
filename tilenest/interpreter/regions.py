"""Meaning of the region ops (``semantics/ops/regions.py``).

* ``parallel``: the children have no order. In the default *batched*
  schedule they run in lockstep (one vectorized evaluation, the domain's
  coordinates as batch axes); otherwise one at a time in the schedule's order.
  Both are exact when the effect log finds no race. Carried values are
  ancestor-owned tiles updated collectively: every child starts from the entry
  value; a child's *footprint* is what its own (per-child) ops wrote -- a
  ``put`` block, or the whole tile for any other per-child update; footprints of
  distinct children must not overlap; the joined result takes each child's
  footprint from that child, and every other element from the collective
  computation (or the entry value).
* ``serial``: iterations in lexicographic order (or reversed), inactive
  coordinates skipped; carried values flow from one iteration to the next.
* ``pipeline``: the reference meaning is the serial iteration of its stages.
* ``if`` / ``while``: ordinary control flow; when the condition differs between
  batched instances, each instance follows its own branch (lane masks).

Instances executed together may diverge in two more ways, and both keep the
meaning of running each instance alone: a region domain whose extents differ
between them (a trip count ``i + 1``, or one read from data) runs over the box
of all their domains with each instance masked to its own points
(:func:`domain_points`); a tile extent that differs between them regroups them
by that extent, the rest of the block running once per group under its mask
(``Interpreter._regroup``). Masked instances store nothing and log no access.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ..errors import RaceError, RuntimeSemanticError
from ..semantics import expr as E
from ..semantics.ir import Block, Operation
from .core import Interpreter, rule
from .effects import Frame
from .memory import StateRT
from .runtime import RV, eval_exprs

MAX_WHILE_ITERATIONS = 10_000_000


def domain_points(it: Interpreter, op: Operation, regroup: bool = False
                  ) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """The domain's extents and its coordinates in lexicographic order.

    The extents may differ between the instances executed together (a trip
    count ``i + 1`` under a batched ``parallel`` over ``i``, or one read from
    data). Then the region runs over the smallest box containing every active
    instance's domain, and each instance is masked to its own points: the box
    constraint ``v < extent`` joins the domain predicate (see
    :func:`_pred_value`). An instance's points keep their lexicographic order
    within the box, so serial iteration, folds and carried values mean exactly
    what they mean for that instance alone. With ``regroup``, a divergence
    instead regroups the instances (each group then has one domain): used where
    an iteration's position in the sequence matters beyond its order (the
    window of a checked pipeline)."""
    dom = op.attrs["domain"]
    shape: list[int] = []
    ragged: list[E.Pred] = []
    for v, x in zip(op.attrs["vars"], dom.space.extents, strict=True):
        if regroup:
            shape.append(max(0, it.extent(x)))
            continue
        n, uniform = it.extent_bound(x)
        shape.append(max(0, n))
        if not uniform:
            ragged.append(E.Var(v).lt(x))
    if ragged:
        it.ragged[op.oid] = E.pand(*ragged)
    else:
        it.ragged.pop(op.oid, None)
    return tuple(shape), Points(tuple(shape))


class Points(Sequence):
    """The points of a box in lexicographic (row-major) order, made on demand:
    a region of many iterations that runs them in batches never lists them."""

    def __init__(self, shape: tuple[int, ...]):
        self.shape = shape
        self.n = int(np.prod(shape)) if shape else 1

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[tuple[int, ...]]:
        return itertools.product(*(range(n) for n in self.shape))

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return list(self)[i]
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError(i)
        return tuple(int(c) for c in np.unravel_index(i, self.shape)) if self.shape else ()


def _bind_point(it: Interpreter, vars_: tuple[str, ...], pt: tuple[int, ...]) -> None:
    for v, x in zip(vars_, pt, strict=True):
        it.ienv.vars[E.Var(v)] = x


def _pred_value(it: Interpreter, op: Operation) -> Any:
    """The domain predicate at the current binding: a bool or a batch array
    (with the per-instance box of a domain whose extents differ between the
    instances executed together)."""
    p = op.attrs["domain"].pred
    extra = it.ragged.get(op.oid)
    if extra is not None:
        p = E.pand(p, extra)
    if p == E.TRUE:
        return True
    (v,) = eval_exprs([p], it.ienv, it.nb, (), (), it.values, it.index_from_inexact)
    return v


def select_lanes(c: Any, a: Any, b: Any, nb: int) -> Any:
    """Per-lane choice between carried values (tiles) ``a`` if ``c`` else ``b``."""
    if isinstance(a, RV):
        n = max(a.nb, b.nb, nb)
        x, y = a.lift(n), b.lift(n)
        cc = np.asarray(c)
        cc = cc.reshape(cc.shape + (1,) * (n - cc.ndim) + (1,) * (x.ndim - n))
        out = RV(np.where(cc, x, y), n)
        if a.lo is not None or b.lo is not None:
            out.with_bounds(*(np.where(cc, a.lift(n, p), b.lift(n, q))
                              for p, q in zip(a.shadow(), b.shadow(), strict=True)))
        return out
    return a  # memory states: effects were already masked per lane


_select = select_lanes


def _masks_in(it: Interpreter, names_from: list[str], names_to: list[str]) -> None:
    if it.track:
        d = it.track[-1][1]
        for a, b in zip(names_from, names_to, strict=True):
            if a in d:
                d[b] = d[a]


# -- parallel -----------------------------------------------------------------


@rule("parallel")
def _parallel(it: Interpreter, op: Operation) -> None:
    vars_ = op.attrs["vars"]
    shape, points = domain_points(it, op)
    level = op.attrs["level"]
    depth = it.an.nest.depth(level)
    body = op.regions[0]
    incoming = [it.val(o) for o in op.operands]
    saved_vars = dict(it.ienv.vars)
    tracked = any(isinstance(v, RV) for v in incoming)
    if tracked:
        it.track.append((depth, {}))
    try:
        if it.opts.schedule.kind == "batched":
            outs, masks, nlanes = _parallel_batched(it, op, vars_, shape, depth, body, incoming)
        else:
            outs, masks, nlanes = _parallel_instances(it, op, vars_, shape, points, depth, body,
                                                      incoming)
    finally:
        if tracked:
            it.track.pop()
        it.ienv.vars = saved_vars
    results = []
    for i, (inc, o) in enumerate(zip(incoming, op.operands, strict=True)):
        if not isinstance(inc, RV):
            results.append(outs[i] if nlanes else inc)
            continue
        joined, touched = _join(it, op, o.name, inc, outs, masks, i, shape, nlanes)
        results.append(joined)
        if it.track and touched is not None:
            prev = it.track[-1][1].get(o.name)
            it.track[-1][1][op.results[i].name] = touched if prev is None else (touched | prev)
    for r, v in zip(op.results, results, strict=True):
        it.set(r, v)


def _parallel_batched(it: Interpreter, op: Operation, vars_: tuple, shape: tuple, depth: int,
                      body: Block, incoming: list) -> tuple[list, list, int]:
    nb0 = it.nb
    k = len(shape)
    saved = it.bshape, it.lane_mask
    it.bshape = it.bshape + shape
    saved_axes = dict(it.batch_axes)
    for j, v in enumerate(vars_):
        it.ienv.vars[E.Var(v)] = np.arange(shape[j]).reshape((1,) * (nb0 + j) + (shape[j],)
                                                            + (1,) * (k - j - 1))
        it.batch_axes[E.Var(v)] = nb0 + j
    lm = None if saved[1] is None else saved[1].reshape(saved[1].shape + (1,) * k)
    pv = _pred_value(it, op)
    if pv is not True:
        pv = np.broadcast_to(np.asarray(pv, dtype=bool), it.bshape)
        lm = pv if lm is None else (lm & pv)
    it.lane_mask = None if lm is None else np.broadcast_to(lm, it.bshape)
    frame = Frame(op, depth, shape, True, (nb0, nb0 + k))
    it.effects.push(frame)
    ok = False
    try:
        if it.track:
            d = it.track[-1][1]
            for a, v in zip(body.args, incoming, strict=True):
                if isinstance(v, RV):
                    d[a.name] = np.bool_(False)  # the entry snapshot: nothing touched yet
        outs = it.block(body, incoming)
        masks = _yield_masks(it, body, depth) if it.track else [None] * len(outs)
        ok = True
    finally:
        it.effects.pop(check=ok)
        it.bshape, it.lane_mask = saved
        it.batch_axes = saved_axes
    n = int(np.prod(shape)) if shape else 1
    if it.lane_mask is not None or lm is not None:
        act = np.broadcast_to(lm, saved[0] + shape) if lm is not None else None
        masks = [None if m is None else (m if act is None else _and_lanes(m, act, nb0 + k))
                 for m in masks]
    return outs, masks, n


def _yield_masks(it: Interpreter, body: Block, depth: int) -> list[Any]:
    """Each child's footprint on the values it yields: tracked masks; a per-child
    value not derived from the entry snapshot covers the whole tile; a
    collective value (anchored above the level) covers nothing."""
    d = it.track[-1][1]
    out = []
    for y, a in zip(body.terminator.operands, body.args, strict=True):
        m = d.get(y.name)
        if m is None and y.name != a.name:
            va = it.an.value_anchor.get(y.name, 0)
            m = np.bool_(True) if it.an.nest.depth(va) >= depth else None
        out.append(m)
    return out


def _and_lanes(m: Any, act: np.ndarray, nb: int) -> Any:
    m = np.asarray(m)
    a = act.reshape(act.shape + (1,) * (m.ndim - act.ndim)) if m.ndim >= act.ndim else act
    return m & a


def _parallel_instances(it: Interpreter, op: Operation, vars_: tuple, shape: tuple,
                        points: list, depth: int, body: Block, incoming: list
                        ) -> tuple[list, list, int]:
    """One child at a time in the schedule's order; per-child outputs are stacked
    on new batch axes (in row-major child order) for the join."""
    frame = Frame(op, depth, shape, False)
    it.effects.push(frame)
    points = list(points)
    n = len(points)
    order = it.child_order(op, n)
    per_out: list[list[Any] | None] = [None] * n
    per_mask: list[list[Any] | None] = [None] * n
    ok = False
    try:
        with it.progress(op, n) as step:
            for lane in order:
                step()
                _parallel_child(it, op, vars_, points[lane], lane, frame, body, incoming,
                                depth, per_out, per_mask)
        ok = True
    finally:
        it.effects.pop(check=ok)
    return _stack_children(it, shape, n, per_out, per_mask, incoming)


def _parallel_child(it: Interpreter, op: Operation, vars_: tuple, pt: tuple, lane: int,
                    frame: Frame, body: Block, incoming: list, depth: int, per_out: list,
                    per_mask: list) -> None:
    """Run child ``lane`` (at point ``pt``) of a parallel region on its own; its
    yielded values and footprints go to ``per_out[lane]`` and ``per_mask[lane]``
    (left None for a child outside the domain predicate)."""
    _bind_point(it, vars_, pt)
    pv = _pred_value(it, op)
    if pv is not True and not bool(np.all(pv)):
        if np.any(pv):
            raise RuntimeSemanticError("a parallel domain predicate varies across "
                                       "batched instances", op.loc)
        return
    frame.child = lane
    if it.track:
        d = it.track[-1][1]
        d.clear()
        for a, v in zip(body.args, incoming, strict=True):
            if isinstance(v, RV):
                d[a.name] = np.bool_(False)
    outs = it.block(body, incoming)
    per_out[lane] = outs
    per_mask[lane] = _yield_masks(it, body, depth) if it.track else [None] * len(outs)


def _stack_children(it: Interpreter, shape: tuple, n: int, per_out: list, per_mask: list,
                    incoming: list) -> tuple[list, list, int]:
    """Per-child outputs stacked on new batch axes (row-major child order)."""
    live = [i for i in range(n) if per_out[i] is not None]
    if not live:
        return [], [], 0
    # stack children along new batch axes so that the join is shared with batched mode
    nb0 = it.nb
    outs, masks = [], []
    for i, inc in enumerate(incoming):
        if not isinstance(inc, RV):
            outs.append(per_out[live[-1]][i])  # memory state: effects already applied
            masks.append(None)
            continue
        nbv = max(per_out[j][i].nb for j in live)
        nbv = max(nbv, nb0)
        tile = per_out[live[0]][i].tile_shape
        kids = _fill(live, n, per_out, i, inc, nbv)

        def stacked(part: int) -> np.ndarray:
            arrs = []
            for j in kids:
                v = per_out[j][i]
                x = v.lift(nbv) if part == 0 else v.lift(nbv, v.shadow()[part - 1])
                arrs.append(np.broadcast_to(x, it.bshape + tile))
            # (n,) + batch + tile -> batch + children + tile
            return np.moveaxis(np.stack(arrs), 0, nb0).reshape(it.bshape + shape + tile)

        rv = RV(stacked(0), nb0 + len(shape))
        if any(per_out[j][i].lo is not None for j in live):
            rv.with_bounds(stacked(1), stacked(2), stacked(3))
        outs.append(rv)
        ms = []
        for j in range(n):
            m = per_mask[j][i] if per_mask[j] is not None else False
            ms.append(np.broadcast_to(np.asarray(m if m is not None else False, dtype=bool),
                                      it.bshape + tile))
        masks.append(np.moveaxis(np.stack(ms), 0, nb0).reshape(it.bshape + shape + tile))
    return outs, masks, n


def _fill(live: list[int], n: int, per_out: list, i: int, inc: RV, nbv: int) -> list[int]:
    """Children in row-major order; skipped (inactive) children reuse a live one."""
    return [j if per_out[j] is not None else live[0] for j in range(n)]


def _join(it: Interpreter, op: Operation, name: str, inc: RV, outs: list, masks: list, i: int,
          shape: tuple, nlanes: int) -> tuple[RV, Any]:
    """The collective update of ancestor value ``name`` (see module docstring)."""
    if nlanes == 0 or not outs:
        return inc, None
    nb0 = it.nb
    k = len(shape)
    out: RV = outs[i]
    tile = inc.tile_shape
    full = it.bshape + shape + tile
    vals = np.broadcast_to(out.lift(nb0 + k), full)
    m = masks[i]
    bnds = None
    if out.lo is not None:
        bnds = [np.broadcast_to(out.lift(nb0 + k, b), full) for b in out.shadow()]
    if m is None or not np.any(m):
        # only collective updates: every child computed the same value
        pick0 = (slice(None),) * nb0 + (0,) * k
        res = RV(np.array(vals[pick0] if k else vals), nb0)
        if bnds is not None:
            res.with_bounds(*(np.array(b[pick0] if k else b) for b in bnds))
        return res, None
    m = np.broadcast_to(np.asarray(m, dtype=bool), full)
    lanes_axes = tuple(range(nb0, nb0 + k))
    count = m.sum(axis=lanes_axes)
    if np.any(count > 1):
        where = tuple(int(x) for x in np.argwhere(count > 1)[0])
        flat = m.reshape(it.bshape + (-1,) + tile)
        sel = flat[where[:nb0] + (slice(None),) + where[nb0:]]
        two = np.nonzero(sel)[0][:2]
        c1, c2 = (tuple(int(x) for x in np.unravel_index(t, shape)) for t in two)
        raise RaceError(
            f"parallel instances {c1} and {c2} both update element {list(where[nb0:])} of the "
            f"ancestor value %{name}", op.loc,
            "independent children may only update disjoint parts of an ancestor tile "
            "(tn.put of disjoint blocks); combine overlapping contributions with a reduce region")
    flatm = m.reshape(it.bshape + (-1,) + tile)
    pick = np.expand_dims(np.argmax(flatm, axis=nb0), nb0)

    def joined(v: np.ndarray) -> np.ndarray:
        flatv = v.reshape(it.bshape + (-1,) + tile)
        chosen = np.take_along_axis(flatv, pick, axis=nb0).squeeze(nb0)
        return np.where(count > 0, chosen, flatv[(slice(None),) * nb0 + (0,)])

    res = RV(joined(vals), nb0)
    if bnds is not None:
        res.with_bounds(*(joined(b) for b in bnds))
    return res, count > 0


# -- temporal regions -----------------------------------------------------------


def _iterate(it: Interpreter, op: Operation, body: Block, states: list, points: list) -> list:
    """Run ``body`` for each active point in order, threading the carried values."""
    vars_ = op.attrs["vars"]
    y = body.terminator
    states = list(states)  # this function's own list (block empties it: handover)
    with it.progress(op, len(points)) as step:
        for pt in points:
            step()
            _bind_point(it, vars_, pt)
            pv = _pred_value(it, op)
            if pv is True or (np.ndim(pv) == 0 and bool(pv)):
                # the previous iteration's values are this one's alone: a carried
                # accumulator may be updated in its own array
                states = it.block(body, states, handover=True)
            elif np.ndim(pv) == 0:
                continue
            else:
                states = _run_masked(it, body, states, np.asarray(pv, dtype=bool))
            if it.track and y is not None:
                d = it.track[-1][1]
                for a, v in zip(body.args, y.operands, strict=True):
                    if v.name in d:
                        d[a.name] = d[v.name]
    return states


def _run_masked(it: Interpreter, body: Block, states: list, pv: np.ndarray) -> list:
    saved = it.lane_mask
    lm = pv if saved is None else (saved & pv)
    if not np.any(lm):
        return states  # no instance is at this point
    it.lane_mask = np.broadcast_to(lm, it.bshape)
    try:
        new = it.block(body, states)
    finally:
        it.lane_mask = saved
    return [_select(lm, n, s, it.nb) for n, s in zip(new, states, strict=True)]


def _carry_track(it: Interpreter, op: Operation, body: Block) -> None:
    """Footprints flow from carried operands into the body's arguments."""
    if it.track:
        d = it.track[-1][1]
        for o, a in zip(op.operands, body.args, strict=False):
            if o.name in d:
                d[a.name] = d[o.name]


def _finish_track(it: Interpreter, op: Operation, body: Block) -> None:
    if it.track:
        d = it.track[-1][1]
        y = body.terminator
        for r, v in zip(op.results, y.operands if y else (), strict=False):
            if v.name in d:
                d[r.name] = d[v.name]


@rule("serial")
def _serial(it: Interpreter, op: Operation) -> None:
    shape, points = domain_points(it, op)
    if op.attrs["order"] == "reverse":
        points = points[::-1]
    body = op.regions[0]
    _carry_track(it, op, body)
    states = _iterate(it, op, body, [it.val(o) for o in op.operands], points)
    _finish_track(it, op, body)
    for r, v in zip(op.results, states, strict=True):
        it.set(r, v)


@rule("pipeline")
def _pipeline(it: Interpreter, op: Operation) -> None:
    shape, points = domain_points(it, op, regroup=it.opts.check_pipelines)
    body = op.regions[0]
    _carry_track(it, op, body)
    states = [it.val(o) for o in op.operands]
    if not it.opts.check_pipelines:
        states = _iterate(it, op, body, states, points)
    else:
        from . import pipelines

        records: dict[tuple[int, int], list] = {}
        saved = it.stage_rec
        whole = not any(o.name == "stage" for o in body.ops)
        try:
            for i, pt in enumerate(points):
                it.stage_rec = (op, i, records)
                if whole:
                    it.effects.sinks.append(records.setdefault((i, 0), []))
                try:
                    states = _iterate(it, op, body, states, [pt])
                finally:
                    if whole:
                        it.effects.sinks.pop()
        finally:
            it.stage_rec = saved
        pipelines.check(op, records, len(points))
    _finish_track(it, op, body)
    for r, v in zip(op.results, states, strict=True):
        it.set(r, v)


@rule("stage")
def _stage(it: Interpreter, op: Operation) -> None:
    # a stage's block runs once each time the stage does: the values whose last
    # use in the enclosing block is this stage die at their last use inside it
    dying = it.dying
    rec = it.stage_rec
    if rec is not None and op in rec[0].regions[0].ops:
        sink = rec[2].setdefault((rec[1], op.attrs["ordinal"]), [])
        it.effects.sinks.append(sink)
        try:
            outs = it.block(op.regions[0], [], dying)
        finally:
            it.effects.sinks.pop()
    else:
        outs = it.block(op.regions[0], [], dying)
    for r, v in zip(op.results, outs, strict=True):
        it.set(r, v)
    if it.track:
        _finish_track(it, op, op.regions[0])


@rule("if")
def _if(it: Interpreter, op: Operation) -> None:
    c = it.val(op.operands[0])
    cond = c.a
    then_b, else_b = op.regions
    if c.lo is not None and np.any(c.lo != c.hi):
        it.undetermined.append(op)  # admitted executions may take either branch
    live = cond.reshape(-1)
    if c.nb and it.lane_mask is not None:
        # only the active instances' conditions count (the others are masked out)
        live = np.broadcast_to(cond.reshape(cond.shape + (1,) * (it.nb - c.nb)),
                               it.bshape)[it.active_lanes()]
    if c.nb == 0 or live.size == 0 or np.all(live == live[0]):
        # one branch for every active instance (none active: nothing runs either way)
        take = bool(live[0]) if live.size else False
        b = then_b if take else else_b
        outs = it.block(b, [])
        if it.track:
            _finish_track(it, op, b)
    else:
        saved = it.lane_mask
        cc = np.broadcast_to(cond, it.bshape[:c.nb]).reshape(it.bshape[:c.nb] +
                                                              (1,) * (it.nb - c.nb))
        cc = np.broadcast_to(cc, it.bshape)
        try:
            it.lane_mask = cc if saved is None else (saved & cc)
            t_outs = it.block(then_b, [])
            it.lane_mask = ~cc if saved is None else (saved & ~cc)
            e_outs = it.block(else_b, [])
        finally:
            it.lane_mask = saved
        outs = [_select(cc, a, b, it.nb) for a, b in zip(t_outs, e_outs, strict=True)]
        if it.track:
            d = it.track[-1][1]
            for r, a, b in zip(op.results, then_b.terminator.operands,
                               else_b.terminator.operands, strict=True):
                ma, mb = d.get(a.name), d.get(b.name)
                if ma is not None or mb is not None:
                    ma = np.asarray(ma if ma is not None else False)
                    mb = np.asarray(mb if mb is not None else False)
                    rank = r.type.rank if hasattr(r.type, "rank") else 0
                    c = cc.reshape(cc.shape + (1,) * rank)  # lanes first, then tile axes
                    d[r.name] = np.where(c, ma, mb)
    for r, v in zip(op.results, outs, strict=True):
        it.set(r, v)


@rule("while")
def _while(it: Interpreter, op: Operation) -> None:
    cond_b, body = op.regions
    states = [it.val(o) for o in op.operands]
    _carry_track(it, op, body)
    saved = it.lane_mask
    n = 0
    try:
        while True:
            (c,) = it.block(cond_b, states)
            cv = c.a
            if c.lo is not None and np.any(c.lo != c.hi):
                it.undetermined.append(op)
            if c.nb == 0:
                if not bool(cv):
                    break
                states = it.block(body, states)
            else:
                cc = np.broadcast_to(cv.reshape(cv.shape + (1,) * (it.nb - c.nb)), it.bshape)
                act = cc if saved is None else (saved & cc)
                if not np.any(act):
                    break
                it.lane_mask = act
                new = it.block(body, states)
                it.lane_mask = saved
                states = [_select(act, x, s, it.nb) for x, s in zip(new, states, strict=True)]
            n += 1
            if n > MAX_WHILE_ITERATIONS:
                raise RuntimeSemanticError(
                    f"while loop ran {MAX_WHILE_ITERATIONS} iterations without finishing",
                    op.loc, "check that the loop condition eventually becomes false")
    finally:
        it.lane_mask = saved
    _finish_track(it, op, body)
    for r, v in zip(op.results, states, strict=True):
        it.set(r, v)


_ = StateRT
