"""Checking that a pipeline does not rely on an order its dependences don't give.

The reference meaning of a pipeline is the serial iteration of its stage
sequence. An implementation may overlap iterations: any issue order of the
stage instances ``(i, s)`` that respects the *declared* dependences -- values
passed between stages (SSA, including Memory state tokens) and values carried
from one iteration to the next -- and keeps at most ``window`` iterations in
flight (``window = 0`` leaves it open; 1 forbids overlap) is permitted.

Within one iteration stages keep their source order; across iterations only
carried values (and Memory states, which are carried values) and the window
order anything (spec P-5, P-7): with ``window = W >= 1``, iterations ``W`` or
more apart are ordered (P-6); a body without stage cuts is one stage. After a
pipeline runs in reference order with its accesses recorded per stage
instance, two instances of different
iterations that no such dependence orders -- a permitted overlap may run them
in either order, or at once -- must not conflict (same element, at least one
write). A conflict means the result depends on an undeclared order; it is
reported with both sites.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from ..errors import RaceError
from ..semantics.analysis import values_read
from ..semantics.ir import Block, Operation


class PipelineOrderError(RaceError):
    """A race between pipeline stage instances that a permitted overlap reorders."""

    kind = "pipeline order race"


def stage_deps(body: Block) -> tuple[list[Operation], dict[int, set[int]], dict[int, set[int]]]:
    """Stage ops, same-iteration deps (t -> stages whose results t uses) and
    carried deps (t -> stages producing the carried values t uses next time)."""
    stages = [op for op in body.ops if op.name == "stage"]
    if not stages:
        # the whole body is one stage: a carried value (or Memory state) that
        # the body uses and redefines orders each iteration after the last
        return [], {}, ({0: {0}} if whole_body_carries(body) else {})
    producer: dict[str, int] = {}
    for k, s in enumerate(stages):
        for r in s.results:
            producer[r.name] = k
    args = {a.name: j for j, a in enumerate(body.args)}
    y = body.terminator
    carried_from = {j: producer.get(v.name) for j, v in enumerate(y.operands)} if y else {}
    same: dict[int, set[int]] = defaultdict(set)
    carried: dict[int, set[int]] = defaultdict(set)
    for k, s in enumerate(stages):
        for name in values_read(s):
            if name in producer and producer[name] != k:
                same[k].add(producer[name])
            if name in args:
                p = carried_from.get(args[name])
                if p is not None:
                    carried[k].add(p)
    return stages, same, carried


def whole_body_carries(body: Block) -> bool:
    """Whether a pipeline body without stages uses a carried value (or Memory
    state) that it also redefines for the next iteration."""
    y = body.terminator
    if y is None:
        return False
    used: set[str] = set()
    for op in body.ops:
        used |= values_read(op)
    return any(a.name in used and v.name != a.name
               for a, v in zip(body.args, y.operands, strict=False))


def check(op: Operation, records: dict[tuple[int, int], list], n_iter: int) -> None:
    """Raise PipelineOrderError for two stage instances that no declared
    dependence orders (so a permitted overlap may run them in either order or
    together) and whose accesses conflict."""
    body = op.regions[0]
    stages, same, carried = stage_deps(body)
    n_stage = max(1, len(stages))
    window = op.attrs["policy"].window
    if window == 1 or n_iter < 2:
        return
    succ_closure = _closure(n_iter, n_stage, carried, window)
    insts = sorted(records)
    name = (lambda k: stages[k].attrs["name"] if stages else "body")
    for x, a in enumerate(insts):
        for b in insts[x + 1:]:
            if b[0] == a[0] or b in succ_closure[a]:
                continue  # same iteration (source order) or ordered by dependences
            hit = _conflict(records[a], records[b])
            if hit is not None:
                opa, opb, where, _ = hit
                raise PipelineOrderError(
                    f"pipeline relies on an order its dependences don't give: stage "
                    f"'{name(a[1])}' of iteration {a[0]} and stage '{name(b[1])}' of iteration "
                    f"{b[0]} are not ordered by any declared dependence (window {window}), "
                    f"and both touch {where} ({opa.name} / {opb.name})",
                    tuple(s for s in (opa.loc, opb.loc, op.loc) if s is not None),
                    "pass the value between iterations as a carried value or through a Memory "
                    "object (whose state orders the accesses), or use window=1")


def _closure(n_iter: int, n_stage: int, carried: dict, window: int
             ) -> dict[Any, set[Any]]:
    """Happens-before successors of every stage instance ``(i, s)``: stage
    order within an iteration, carried edges ``(i, p) -> (i + 1, s)``, and the
    window: with ``window = W >= 1`` every iteration ``j >= i + W`` starts after
    iteration ``i`` completes (P-6: at most ``W`` consecutive iterations are in
    flight). The window edges go through one gate node per iteration (``('g',
    j)``: "iterations ``j`` and later may start"), so the graph stays linear."""
    nodes = [(i, s) for i in range(n_iter) for s in range(n_stage)]
    succ: dict[Any, set[Any]] = {v: set() for v in nodes}
    for i in range(n_iter):
        for s in range(n_stage - 1):
            succ[(i, s)].add((i, s + 1))
        for s in range(n_stage):
            for p in carried.get(s, ()):
                if i + 1 < n_iter:
                    succ[(i, p)].add((i + 1, s))
        if window > 0 and i + window < n_iter:
            succ[(i, n_stage - 1)].add(("g", i + window))
    memo: dict[Any, set[Any]] = {}

    def close(v: Any) -> None:
        out: set[Any] = set()
        for w in succ[v]:
            out.add(w)
            out |= memo[w]
        memo[v] = out

    # reverse topological order: later iterations first; within one iteration
    # the stages from last to first, then the iteration's gate
    for i in reversed(range(n_iter)):
        for s in reversed(range(n_stage)):
            close((i, s))
        g = ("g", i)
        succ[g] = {(i, 0)} | ({("g", i + 1)} if i + 1 < n_iter else set())
        close(g)
    return memo


def _conflict(ra: list, rb: list) -> Any:
    by_buf_a: dict[Any, list] = defaultdict(list)
    for e in ra:
        by_buf_a[e[0].key].append(e)
    for eb in rb:
        for ea in by_buf_a.get(eb[0].key, ()):
            if not (ea[2] or eb[2]):
                continue
            common = np.intersect1d(ea[1].elements(), eb[1].elements(), assume_unique=True)
            if common.size:
                return ea[3], eb[3], ea[0].describe(int(common[0])), None
    return None
