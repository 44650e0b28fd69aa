"""Loops that only accumulate matrix products, run as one contraction
(``fast`` mode).

A ``serial`` or ``pipeline`` loop of the shape

    for k: acc = mma(a_k, b_k, acc)        (a_k, b_k read no carried value)

computes ``acc_0 + sum_k a_k b_k``. When every carried value is updated by
one ``mma`` that allows reassociation, with the carried value as its
accumulator and read by nothing else, the sum over the iterations is part of
the sum that ``mma`` may group as it likes (``spec/reductions.md``, R-8), so
the loop may add the products of all iterations in one contraction whose
contraction dims are the ``mma``'s and the loop's. ``fast`` mode promises an
admitted grouping rather than the source order, and already runs each
``mma`` as one BLAS product; this module extends that product over the loop:
the operands of all iterations are evaluated at once, with the iteration on
a batch axis (``batching.contributions``, which logs their reads as if made
one iteration at a time), and the iteration axis joins the contraction. A
tiled GEMM's K loop is then one matrix product of the whole K extent.

What qualifies (:func:`plan`): besides the ``mma`` updates, the body holds
only pure ops and reads (``batching.BATCHABLE``) whose tile shapes do not
vary with the iteration, possibly grouped in ``stage`` regions; the
accumulator's dtype is one the ``mma`` accumulates in directly (not f16 or
bf16, whose products ``fast`` mode sums in f32 and rounds per ``mma``).
Where a run cannot batch (the conditions of ``batching.can_batch``, a read
that fails or conflicts, an oracle or a checked pipeline), the iterations run
one by one as before, from the first one not yet added.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..semantics import expr as E
from ..semantics import numerics as N
from ..semantics.ir import Block, Operation
from ..semantics.ops.values import mma_roles
from ..semantics.types import TileType
from . import batching
from .core import Interpreter
from .pipelines import _uses
from .runtime import RV


@dataclass(frozen=True)
class LoopPlan:
    """The ops evaluated for all iterations at once (``contrib``), per carried
    value in order the ``mma`` that updates it, and the names that stage
    results alias (``_flatten``)."""

    contrib: tuple[Operation, ...]
    updates: tuple[Operation, ...]
    alias: dict[str, str]


def plan(op: Operation) -> LoopPlan | None:
    """How ``op``'s body splits (module docstring), or None."""
    body = op.regions[0]
    flat = _flatten(body)
    if flat is None or body.terminator is None:
        return None
    ops, alias = flat
    states = {a.name for a in body.args}
    rvars = set(op.attrs["vars"])
    contrib: list[Operation] = []
    updates: dict[str, Operation] = {}
    for o in ops:
        uses = _uses(o)
        if uses & (states | set(updates)):
            if not _is_update(o, states | set(updates)):
                return None
            updates[o.results[0].name] = o
            continue
        if o.name not in batching.BATCHABLE:
            return None
        for r in o.results:  # one tile shape for every iteration
            if isinstance(r.type, TileType) and any(
                    isinstance(f, E.Var) and f.name in rvars
                    for x in r.type.extents for f in E.leaves(x)):
                return None
        contrib.append(o)
    ordered = []
    for a, v in zip(body.args, body.terminator.operands, strict=True):
        m = updates.get(alias.get(v.name, v.name))
        if m is None or m.operands[2].name != a.name or m in ordered:
            return None
        ordered.append(m)
    if len(ordered) != len(updates) or not ordered:
        return None
    return LoopPlan(tuple(contrib), tuple(ordered), alias)


def _is_update(o: Operation, carried: set[str]) -> bool:
    """``o`` is ``mma(a, b, s)`` allowing reassociation, with ``s`` carried,
    ``a`` and ``b`` not, and an accumulator dtype summed in itself."""
    if o.name != "mma" or not o.attrs["allow_reassociation"]:
        return False
    a, b, c = o.operands
    if a.name in carried or b.name in carried or c.name not in carried:
        return False
    return c.type.dtype.name not in ("f16", "bf16")


def _flatten(body: Block) -> tuple[list[Operation], dict[str, str]] | None:
    """The body's ops with ``stage`` regions inlined, and the names their
    results alias (a stage result -> the value its region yields); None when
    the body holds another region."""
    ops: list[Operation] = []
    alias: dict[str, str] = {}
    for o in body.ops:
        if o.name == "yield":
            continue
        if o.name == "stage":
            inner = _flatten(o.regions[0])
            y = o.regions[0].terminator
            if inner is None or y is None:
                return None
            ops += inner[0]
            alias.update(inner[1])
            for r, v in zip(o.results, y.operands, strict=True):
                alias[r.name] = alias.get(v.name, v.name)
            continue
        if o.regions:
            return None
        ops.append(o)
    return ops, alias


def run(it: Interpreter, op: Operation, states: list[RV], shape: tuple[int, ...],
        points: Any, reverse: bool) -> list[RV] | None:
    """The carried values after all iterations of loop ``op`` (``points`` in
    execution order over the box ``shape``), added as one contraction per
    batch of iterations; None when this run does not qualify (nothing done)."""
    if not (it.opts.fast and not it.opts.oracle and shape and int(np.prod(shape))):
        return None
    if any(s.lo is not None for s in states):
        return None
    p = batching.cached_plan(it, op, plan)
    if p is None or not batching.can_batch(it, op):
        return None
    from .regions import _iterate

    n0 = shape[0]
    lo = n0 - 1 if reverse else 0
    rows = 1  # the first batch is one row: its values measure a row's size
    with it.progress(op, len(points)) as step:
        while 0 <= lo < n0 if reverse else lo < n0:
            a, z = (max(0, lo - rows + 1), lo + 1) if reverse else (lo, min(n0, lo + rows))
            b = batching.contributions(it, op, p.contrib, a, z, shape, reverse)
            if b is None:
                left = [pt for pt in points if (pt[0] < z if reverse else pt[0] >= a)]
                return _iterate(it, op, op.regions[0], states, left)
            states = [_contract(it, m, b, s, p.alias) for m, s in zip(p.updates, states, strict=True)]
            it.batched_iterations += b.n
            step(advance=b.n)
            most = max([v.a.size for v in b.values.values()] + [1]) // (z - a)
            lo = a - 1 if reverse else z
            rows = max(1, batching.CHUNK_ELEMENTS // max(1, most))
    return states


#: the loop's dim in a contraction, beside the mma's own dims
_LOOP = object()


def _contract(it: Interpreter, m: Operation, b: batching.Batch, s: RV,
              alias: dict[str, str]) -> RV:
    """``s + sum over the batch's iterations of mma's a_k b_k``, in one product."""
    at, bt, ct = (o.type for o in m.operands)
    dt = ct.dtype
    nb = b.nb0
    arrs = []
    for v, t in ((m.operands[0], at), (m.operands[1], bt)):
        name = alias.get(v.name, v.name)
        val = b.values[name] if name in b.values else it.values[name]
        x = batching.flat_iterations(b, val, False).a
        x = np.moveaxis(x, nb, -1)  # the iterations become the last tile dim
        arrs.append(N.cast(x, t.dtype, dt) if t.dtype != dt else x)
    A, B = arrs
    roles = mma_roles(at, bt, ct)
    ext = dict(roles, contraction=(_LOOP,) + tuple(roles["contraction"]))
    from .values import _matmul

    prod = _matmul(A, B, _Dims(at.dims + (_LOOP,)), _Dims(bt.dims + (_LOOP,)), ct, ext, nb)
    if prod is None:
        letter = {d: chr(ord("a") + i) for i, d in
                  enumerate(dict.fromkeys(at.dims + bt.dims + ct.dims + (_LOOP,)))}
        sa, sb, sc = ("".join(letter[d] for d in dims)
                      for dims in (at.dims + (_LOOP,), bt.dims + (_LOOP,), ct.dims))
        prod = np.einsum(f"...{sa},...{sb}->...{sc}", A, B)
    return RV(N.binary("add", s.lift(nb), np.asarray(prod, dtype=dt.np), dt), nb)


@dataclass(frozen=True)
class _Dims:
    """A tile type's dims with the loop's appended (all ``_matmul`` reads)."""

    dims: tuple
