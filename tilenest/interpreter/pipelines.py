"""Checking that a pipeline does not rely on an order its dependences don't give.

The reference meaning of a pipeline is the serial iteration of its stage
sequence. An implementation may overlap iterations: any issue order of the
stage instances ``(i, s)`` that respects the *declared* dependences -- values
passed between stages (SSA, including Memory state tokens) and values carried
from one iteration to the next -- and keeps at most ``window`` iterations in
flight (``window = 0`` leaves it open; 1 forbids overlap) is permitted.

After a pipeline runs in reference order with its accesses recorded per stage
instance, this module builds the most eager permitted order (every stage
instance issued as soon as its declared inputs exist and the window allows:
software prefetch) and looks for two instances whose order it swaps while
their accesses conflict (same element, at least one write). Such a pair means
the result depends on an undeclared order; it is reported with both sites.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from ..errors import RaceError
from ..semantics.ir import Block, Operation


class PipelineOrderError(RaceError):
    """A race between pipeline stage instances that a permitted overlap reorders."""

    kind = "pipeline order race"


def stage_deps(body: Block) -> tuple[list[Operation], dict[int, set[int]], dict[int, set[int]]]:
    """Stage ops, same-iteration deps (t -> stages whose results t uses) and
    carried deps (t -> stages producing the carried values t uses next time)."""
    stages = [op for op in body.ops if op.name == "stage"]
    if not stages:
        return [], {}, {}
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
        for name in _uses(s):
            if name in producer and producer[name] != k:
                same[k].add(producer[name])
            if name in args:
                p = carried_from.get(args[name])
                if p is not None:
                    carried[k].add(p)
    return stages, same, carried


def _uses(op: Operation) -> set[str]:
    out = {o.name for o in op.operands}
    for r in op.regions:
        for inner in r.ops:
            out |= _uses(inner)
    from ..semantics import expr as E

    for v in op.attrs.values():
        for leaf in _leaves(v):
            if isinstance(leaf, E.Val):
                out.add(leaf.name)
    return out


def _leaves(v: Any) -> list:
    from ..semantics import expr as E

    if isinstance(v, (E.Expr, E.Pred)):
        return list(E.leaves(v))
    if isinstance(v, tuple):
        return [x for i in v for x in _leaves(i)]
    return []


def eager_order(n_iter: int, n_stage: int, same: dict, carried: dict, window: int
                ) -> list[tuple[int, int]]:
    """The prefetching issue order: repeatedly issue the ready instance of the
    smallest stage index (earliest iteration first) within the window."""
    done: set[tuple[int, int]] = set()
    order: list[tuple[int, int]] = []
    nxt = [0] * n_stage  # next iteration to issue per stage
    win = window if window > 0 else n_iter
    total = n_iter * n_stage
    while len(order) < total:
        oldest = min((i for i in range(n_iter)
                      if any((i, s) not in done for s in range(n_stage))), default=n_iter)
        picked = None
        for s in range(n_stage):
            i = nxt[s]
            if i >= n_iter or i >= oldest + win:
                continue
            ready = all((i, p) in done for p in same.get(s, ())) and \
                all(i == 0 or (i - 1, p) in done for p in carried.get(s, ())) and \
                (s == 0 or True)
            # a stage's own earlier iterations come first (in-order per stage)
            if ready and (i == 0 or (i - 1, s) in done):
                picked = (i, s)
                break
        if picked is None:  # fall back to the reference order's next instance
            picked = min(((i, s) for i in range(n_iter) for s in range(n_stage)
                          if (i, s) not in done))
        done.add(picked)
        nxt[picked[1]] = picked[0] + 1
        order.append(picked)
    return order


def check(op: Operation, records: dict[tuple[int, int], list], n_iter: int) -> None:
    """Raise PipelineOrderError if the eager order swaps two conflicting instances."""
    body = op.regions[0]
    stages, same, carried = stage_deps(body)
    n_stage = max(1, len(stages))
    window = op.attrs["policy"].window
    if window == 1 or n_iter < 2:
        return
    order = eager_order(n_iter, n_stage, same, carried, window)
    pos = {inst: k for k, inst in enumerate(order)}
    insts = sorted(records)
    for a in insts:
        for b in insts:
            if not (a < b and pos[b] < pos[a]):
                continue
            hit = _conflict(records[a], records[b])
            if hit is not None:
                (opa, opb, where, _) = hit
                name = (lambda k: stages[k].attrs["name"] if stages else "body")
                raise PipelineOrderError(
                    f"pipeline relies on an order its dependences don't give: stage "
                    f"'{name(b[1])}' of iteration {b[0]} may be issued before stage "
                    f"'{name(a[1])}' of iteration {a[0]} (window {window}), and both touch "
                    f"{where} ({opa.name} / {opb.name})",
                    tuple(s for s in (opa.loc, opb.loc, op.loc) if s is not None),
                    "pass the value between stages as a carried value or through a Memory "
                    "object (whose state orders the accesses), or use window=1")


def _conflict(ra: list, rb: list) -> Any:
    by_buf_a: dict[Any, list] = defaultdict(list)
    for e in ra:
        by_buf_a[e[0].key].append(e)
    for eb in rb:
        for ea in by_buf_a.get(eb[0].key, ()):
            if not (ea[2] or eb[2]):
                continue
            common = np.intersect1d(ea[1], eb[1])
            if common.size:
                return ea[3], eb[3], ea[0].describe(int(common[0])), None
    return None
