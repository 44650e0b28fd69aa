"""Tree reductions of matrix products, run as one contraction (``fast`` mode).

A ``reduce`` region under the ``unordered_tree`` policy (the default) whose
states are updated by ``s = mma(a_r, b_r, s)`` with ``contract=tn.add``
admits every ``add`` tree over the seed and every product of every
contribution, in any order (``spec/reductions.md``, R-9, R-6): the sum over
the iterations and the sum inside each product form one sum that may be
grouped and permuted at will. (``ordered_tree`` keeps the contributions'
order, which a BLAS product over both sums need not: it runs one product
per iteration, as the other policies do.) ``fast`` mode promises an admitted grouping
rather than the canonical one, and already runs each ``mma`` as one BLAS
product; this module extends that product over the region: the operands of
all iterations are evaluated at once, with the iteration on a batch axis
(``batching.contributions``, which logs their reads as if made one iteration
at a time), and the iteration axis joins the contraction. A split-K GEMM
written as such a ``reduce`` then runs as a few matrix products over the
whole K extent (the first iteration alone, whose values size the batches,
then as many iterations per product as :data:`batching.CHUNK_ELEMENTS`
allows).

A ``serial`` or ``pipeline`` loop of ``mma`` updates is not such a sum: its
iterations run in order, each ``mma`` regrouping only its own sum (R-9), so
it keeps one product per iteration.

What qualifies (:func:`plan`): every state is updated by one ``mma`` that
allows reassociation, with the state as its accumulator and read by nothing
else; the other ops only read and compute (``batching.BATCHABLE``) with tile
shapes that do not vary with the iteration; the accumulator's dtype is one
the ``mma`` sums in directly (not f16 or bf16, whose products ``fast`` mode
sums in f32 and rounds per ``mma``). Where a run cannot batch (the
conditions of ``batching.can_batch``, a read that fails or conflicts), the
iterations not yet added run one by one as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..semantics import expr as E
from ..semantics import numerics as N
from ..semantics.ir import Operation
from ..semantics.ops.values import mma_roles
from ..semantics.policies import ReductionPolicy
from ..semantics.types import TileType
from . import batching
from .core import Interpreter
from ..semantics.analysis import values_read
from .runtime import RV


@dataclass(frozen=True)
class ContractionPlan:
    """The ops evaluated for all iterations at once (``contrib``) and, per
    state in order, the ``mma`` that updates it."""

    contrib: tuple[Operation, ...]
    updates: tuple[Operation, ...]


def plan(op: Operation) -> ContractionPlan | None:
    """How ``op``'s body splits (module docstring), or None."""
    body = op.regions[0]
    if body.terminator is None or op.attrs["policy"] is not ReductionPolicy.unordered_tree or \
            any(c != "add" for c in op.attrs["contracts"]):
        return None
    states = {a.name for a in body.args}
    rvars = set(op.attrs["vars"])
    contrib: list[Operation] = []
    updates: dict[str, Operation] = {}
    for o in body.ops:
        if o.name == "yield":
            continue
        if o.regions:
            return None
        if values_read(o) & (states | set(updates)):
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
        m = updates.get(v.name)
        if m is None or m.operands[2].name != a.name or m in ordered:
            return None
        ordered.append(m)
    if len(ordered) != len(updates) or not ordered:
        return None
    return ContractionPlan(tuple(contrib), tuple(ordered))


def _is_update(o: Operation, carried: set[str]) -> bool:
    """``o`` is ``mma(a, b, s)`` allowing reassociation, with ``s`` carried,
    ``a`` and ``b`` not, and an accumulator dtype summed in itself."""
    if o.name != "mma" or not o.attrs["allow_reassociation"]:
        return False
    a, b, c = o.operands
    if a.name in carried or b.name in carried or c.name not in carried:
        return False
    return c.type.dtype.name not in ("f16", "bf16")


def run(it: Interpreter, op: Operation, states: list[RV], shape: tuple[int, ...],
        points: Any) -> list[RV] | None:
    """The states after all iterations of tree ``reduce`` ``op`` (``points``
    over the box ``shape``), added as one contraction per batch of
    iterations; None when this run does not qualify (nothing done)."""
    if not (it.opts.fast and not it.opts.oracle and shape and int(np.prod(shape))):
        return None
    if any(s.lo is not None for s in states):
        return None
    p = batching.cached_plan(it, op, plan)
    if p is None or not batching.can_batch(it, op):
        return None
    from .regions import _iterate

    lo, rows = 0, 1  # the first batch is one row: its values measure a row's size
    with it.progress(op, len(points)) as step:
        while lo < shape[0]:
            hi = min(shape[0], lo + rows)
            b = batching.contributions(it, op, p.contrib, lo, hi, shape, False)
            if b is None:
                return _iterate(it, op, op.regions[0], states, [pt for pt in points
                                                                if pt[0] >= lo])
            states = [_contract(it, m, b, s) for m, s in zip(p.updates, states, strict=True)]
            it.batched_iterations += b.n
            step(advance=b.n)
            most = max([v.a.size for v in b.values.values()] + [1]) // (hi - lo)
            lo, rows = hi, max(1, batching.CHUNK_ELEMENTS // max(1, most))
    return states


#: the iterations' dim in a contraction, beside the mma's own dims
_LOOP = object()


def _contract(it: Interpreter, m: Operation, b: batching.Batch, s: RV) -> RV:
    """``s + sum over the batch's iterations of a_r b_r`` (``m``'s operands), in
    one product whose contraction is the iterations' and ``m``'s."""
    at, bt, ct = (o.type for o in m.operands)
    dt = ct.dtype
    nb = b.nb0
    arrs = []
    for v, t in ((m.operands[0], at), (m.operands[1], bt)):
        x = batching.flat_iterations(b, batching.operand(it, b, v), False).a
        x = np.moveaxis(x, nb, -1)  # the iterations become the last tile dim
        arrs.append(N.cast(x, t.dtype, dt) if t.dtype != dt else x)
    A, B = arrs
    roles = mma_roles(at, bt, ct)
    ext = dict(roles, contraction=(_LOOP,) + tuple(roles["contraction"]))
    from .values import product

    prod = product(A, B, _Dims(at.dims + (_LOOP,)), _Dims(bt.dims + (_LOOP,)), ct, ext, nb)
    return RV(N.binary("add", s.lift(nb), np.asarray(prod, dtype=dt.np), dt), nb)


@dataclass(frozen=True)
class _Dims:
    """A tile type's dims with the iterations' appended (all ``values.product``
    reads of an operand's type)."""

    dims: tuple
