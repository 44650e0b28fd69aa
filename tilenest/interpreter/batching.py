"""Batched execution of ``reduce`` regions: many iterations evaluated at once,
with exactly the meaning of running them one by one (``spec/reductions.md``).

A reduce body splits into its *contribution* ops, which do not read the
carried states (directly or through other ops), and its *combine* ops, which
do. When the contribution ops are pure elementwise values and reads
(:data:`BATCHABLE`) whose tile shapes do not depend on the iteration, the
value an iteration gives each of them depends only on the iteration's
coordinates: evaluating them once with the iteration coordinates as an extra
batch axis (as ``parallel`` children are, ``regions.py``) gives every
iteration's values, element for element the same (the rules are elementwise
over batch axes). Then the states are threaded through the iterations in the
order the policy prescribes:

* when every state is updated by one binary op ``s = s ∘ c`` or ``s = c ∘ s``
  with ``c`` a contribution (:class:`Merge`), by a vectorized fold that
  rounds exactly as the one-by-one updates do (:func:`_fold`):
  an associative ``∘`` (integer and bool ring and bit ops, ``maximum`` and
  ``minimum``, whose NaN rule takes the first NaN operand) is grouped as an
  order-preserving tree over the operands in update order; float
  ``add sub mul div`` run as numpy's sequential ``accumulate`` in the dtype
  (one rounding per step, f16/bf16 through f32 as ``numerics.binary``), the
  operands swapped for ``c ∘ s`` only where ``∘`` commutes bitwise
  (add, mul with no NaN contribution, whose payload would pick the side);
* otherwise the combine ops run per iteration on the slices of the batched
  contributions (still one rule call per op, but the reads are batched).

In ``fast`` mode a tree-permitted builtin contract folds float ``add``/``mul``
with numpy's pairwise reduction (an admitted grouping, as ``fast`` promises).

Effects: contribution ops only read. Their reads are held back while the
batch is evaluated and then logged as if made one iteration at a time
(``EffectLog.commit``). Any error met by a batch (a race, a bounds or
uninitialized read, an extent that varies) discards it and runs those
iterations one by one, which meets the error exactly where the unbatched run
does. Batching is not attempted where iterations interact with state the
batch cannot carry: masked lanes, a domain predicate, ragged extents, parent
footprints being tracked, or a checked pipeline's stage recorder.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import TilenestError
from ..semantics import expr as E
from ..semantics import numerics as N
from ..semantics.ir import Block, Operation
from ..semantics.ops.values import BINARY, COMPARE, UNARY
from ..semantics.types import TileType
from .core import RULES, ExtentDiverges, Interpreter
from .runtime import RV, align

#: ops a batched contribution may contain: pure, elementwise over batch axes
BATCHABLE = frozenset(UNARY + BINARY + COMPARE + (
    "ite", "cast", "bitcast", "const", "per", "index", "reindex", "gather", "broadcast",
    "reshape", "permute", "tensor.load"))

#: ops a combine may contain when it runs per iteration (pure values)
COMBINABLE = BATCHABLE - {"tensor.load"} | {"mma"}

#: merge ops whose update order a tree over the operands keeps exactly
#: (associative bit for bit in numerics.binary), by dtype kind
_ASSOCIATIVE_INT = frozenset(("add", "mul", "and", "or", "xor", "maximum", "minimum"))
_ASSOCIATIVE_FLOAT = frozenset(("maximum", "minimum"))
#: float merge ops run as a sequential accumulate (state first)
_ACCUMULATE = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}

#: most elements (of the largest contribution value) evaluated in one batch
CHUNK_ELEMENTS = 1 << 21


@dataclass(frozen=True)
class Merge:
    """State update ``s' = op(s, c)`` (``state_first``) or ``op(c, s)``, with
    ``c`` (value ``other``) not reading any state; ``site`` is the op."""

    op: str
    state_first: bool
    other: Any  # ir Value
    site: Operation


@dataclass(frozen=True)
class Plan:
    """How a reduce body splits (module docstring); ``merges`` is set when each
    state's whole update is one :class:`Merge` and nothing else reads a state."""

    contrib: tuple[Operation, ...]
    combine: tuple[Operation, ...]
    merges: tuple[Merge, ...] | None


def plan(op: Operation) -> Plan | None:
    """The split of ``op``'s body, or None where it cannot be batched."""
    body = op.regions[0]
    rvars = set(op.attrs["vars"])
    dep = {a.name for a in body.args}
    contrib: list[Operation] = []
    combine: list[Operation] = []
    for o in body.ops:
        if o.name == "yield":
            continue
        if o.regions:
            return None
        if any(v.name in dep for v in o.operands):
            if o.name not in COMBINABLE:
                return None
            combine.append(o)
            dep.update(r.name for r in o.results)
            continue
        if o.name not in BATCHABLE:
            return None
        for r in o.results:  # tile shapes must be the same for every iteration
            if isinstance(r.type, TileType) and any(
                    f.name in rvars for x in r.type.extents for f in E.leaves(x)
                    if isinstance(f, E.Var)):
                return None
        contrib.append(o)
    return Plan(tuple(contrib), tuple(combine), _merges(body, combine, dep))


def _merges(body: Block, combine: list[Operation], dep: set[str]) -> tuple[Merge, ...] | None:
    y = body.terminator
    if y is None or len(combine) != len(body.args):
        return None
    by_result = {o.results[0].name: o for o in combine}
    out = []
    for a, v in zip(body.args, y.operands, strict=True):
        m = by_result.get(v.name)
        if m is None or m.name not in BINARY or len(m.operands) != 2:
            return None
        x, z = m.operands
        if x.name == a.name and z.name not in dep:
            out.append(Merge(m.name, True, z, m))
        elif z.name == a.name and x.name not in dep:
            out.append(Merge(m.name, False, x, m))
        else:
            return None
    return tuple(out)


def eligible(it: Interpreter, op: Operation) -> Plan | None:
    """The plan, when this execution of ``op`` can be batched (module docstring)."""
    p = cached_plan(it, op, plan)
    return p if p is not None and can_batch(it, op) else None


def cached_plan(it: Interpreter, op: Operation, make: Any) -> Any:
    """``make(op)``, once per region op and planner of the run (None: never
    batched that way)."""
    key = (op.oid, make)
    p = it.batch_plans.get(key, False)
    if p is False:
        p = it.batch_plans[key] = make(op)
    return p


def can_batch(it: Interpreter, op: Operation) -> bool:
    """Whether this execution of region ``op`` may evaluate its iterations
    together: batching on, no masked lanes, no effect sinks (a checked
    pipeline's stage recorder), one uniform box of iterations with no domain
    predicate, and no footprint being tracked through its body."""
    if not it.opts.batch or it.lane_mask is not None or it.effects.sinks or op.oid in it.ragged:
        return False
    if op.attrs["domain"].pred != E.TRUE:
        return False
    if it.track:
        d = it.track[-1][1]
        body = op.regions[0]
        if any(v.name in d for o in body.ops for v in o.operands) or \
                any(o.name in d for o in op.operands):
            return False
    return True


@dataclass
class Batch:
    """Values of one batch of iterations: ``values`` (contribution name -> RV with
    the iterations on batch axes ``nb0 .. nb0 + k``), ``n`` iterations."""

    values: dict[str, RV]
    nb0: int
    k: int
    n: int


def contributions(it: Interpreter, op: Operation, contrib: tuple[Operation, ...], lo: int,
                  hi: int, shape: tuple[int, ...], reverse: bool) -> Batch | None:
    """Evaluate the ops ``contrib`` (reading no carried state) for the
    iterations of region ``op`` whose first coordinate is in ``[lo, hi)`` (all
    of the remaining axes), in one batch; their reads are logged in iteration
    order (last to first with ``reverse``). None (nothing logged, no value
    kept) when an error, a varying extent or a conflicting read needs the
    one-by-one run."""
    vars_ = op.attrs["vars"]
    nb0, k = it.nb, len(shape)
    box = (hi - lo,) + tuple(shape[1:])
    saved = (it.bshape, dict(it.ienv.vars), dict(it.batch_axes), dict(it.batch_base),
             len(it.inexact_indices), len(it.undetermined))
    log = it.effects
    log.deferred = []
    names = [r.name for o in contrib for r in o.results]
    ok = False
    try:
        it.bshape = it.bshape + box
        for j, v in enumerate(vars_):
            ax = _iota(box[j]) if j or not lo else np.arange(lo, lo + box[j])
            it.ienv.vars[E.Var(v)] = ax.reshape((1,) * (nb0 + j) + (box[j],) + (1,) * (k - j - 1))
            it.batch_axes[E.Var(v)] = nb0 + j
            it.batch_base[E.Var(v)] = lo if j == 0 else 0
        for o in contrib:
            RULES[o.name](it, o)
        ok = True
    except (TilenestError, ExtentDiverges, FloatingPointError):
        pass
    finally:
        reads, log.deferred = log.deferred, None
        it.bshape, it.ienv.vars, it.batch_axes, it.batch_base = saved[:4]
    if ok and (len(it.inexact_indices) != saved[4] or len(it.undetermined) != saved[5]):
        ok = False  # the oracle's notes must come in one-by-one order: run one by one
    if ok and not log.commit(reads, (nb0, nb0 + k), reverse):
        ok = False
    vals = {n: it.values.pop(n) for n in names if n in it.values}
    del it.inexact_indices[saved[4]:], it.undetermined[saved[5]:]
    if not ok:
        return None
    return Batch(vals, nb0, k, int(np.prod(box)))


_IOTA: dict[int, np.ndarray] = {}


def _iota(n: int) -> np.ndarray:
    """``arange(n)`` (int64), read-only; the last few lengths are kept, so that
    repeated calls of one program do not rebuild a long iteration axis."""
    a = _IOTA.get(n)
    if a is None:
        if len(_IOTA) >= 4:
            _IOTA.pop(next(iter(_IOTA)))
        a = np.arange(n, dtype=np.int64)
        a.flags.writeable = False
        if n <= CHUNK_ELEMENTS:
            _IOTA[n] = a
    return a


def flat_iterations(b: Batch, v: RV, reverse: bool) -> RV:
    """``v`` (a batched value, or one that does not vary) with the iterations on
    one batch axis ``nb0`` in execution order, all ``n`` of them."""
    nb = b.nb0 + b.k
    a = v.lift(nb) if v.nb <= nb else v.a
    lead = a.shape[:b.nb0]
    tile = a.shape[nb:]
    box = a.shape[b.nb0:nb]
    if int(np.prod(box)) != b.n:  # does not vary with the iteration: repeat it
        a = np.broadcast_to(a.reshape(lead + (1,) + tile), lead + (b.n,) + tile)
    else:
        a = a.reshape(lead + (b.n,) + tile)
    if reverse:
        a = a[(slice(None),) * b.nb0 + (slice(None, None, -1),)]
    out = RV(a, b.nb0 + 1)
    if v.lo is not None:
        out.with_bounds(*(flat_iterations(b, RV(x, v.nb), reverse).a for x in v.shadow()))
    return out


def operand(it: Interpreter, b: Batch, v: Any) -> RV:
    """A value read by a combine op: a batched contribution or an outer value."""
    return b.values[v.name] if v.name in b.values else it.values[v.name]


def fold(it: Interpreter, op: Operation, p: Plan, b: Batch, states: list[RV],
         reverse: bool) -> list[RV]:
    """Thread ``states`` through the batch's iterations in execution order."""
    if p.merges is not None and all(s.lo is None for s in states):
        out = [_fold(it, op, m, b, s, reverse, i) for i, (m, s) in
               enumerate(zip(p.merges, states, strict=True))]
        if all(o is not None for o in out):
            return out  # type: ignore[return-value]
    return _per_iteration(it, op, p, b, states, reverse)


def _per_iteration(it: Interpreter, op: Operation, p: Plan, b: Batch, states: list[RV],
                   reverse: bool) -> list[RV]:
    """The combine ops run once per iteration on slices of the batch."""
    body = op.regions[0]
    used = {v.name for o in p.combine for v in o.operands} | \
        {v.name for v in body.terminator.operands}
    flat = {n: flat_iterations(b, v, reverse) for n, v in b.values.items() if n in used}
    for i in range(b.n):
        for n, v in flat.items():
            a = v.a[(slice(None),) * b.nb0 + (i,)]
            rv = RV(a, b.nb0)
            if v.lo is not None:
                rv.lo, rv.hi, rv.nan = (x[(slice(None),) * b.nb0 + (i,)] for x in v.shadow())
            it.values[n] = rv
        for a, s in zip(body.args, states, strict=True):
            it.values[a.name] = s
        for o in p.combine:
            try:
                RULES[o.name](it, o)
            except TilenestError as e:
                raise e.with_site(o.loc) from None
        states = [it.values[v.name] for v in body.terminator.operands]
    return states


def _fold(it: Interpreter, op: Operation, m: Merge, b: Batch, s: RV, reverse: bool,
          i: int) -> RV | None:
    """One state's vectorized fold (module docstring), None where none is exact."""
    x = operand(it, b, m.other)
    if x.lo is not None:
        return None
    dt = m.site.operands[0].type.dtype
    res_t: TileType = m.site.results[0].type
    ot = m.other.type
    xv = flat_iterations(b, x, reverse)
    nb = b.nb0
    # operands laid out over the result's dims (as operands_on does)
    xa = align(xv, ot.dims, res_t.dims, nb + 1)
    sa = align(s, op.operands[i].type.dims, res_t.dims, nb)
    sa = np.expand_dims(sa, nb)
    pol = op.attrs["policy"]
    c = op.attrs["contracts"][i]
    from ..semantics.reducers import BUILTINS

    if it.opts.fast and pol.is_tree and dt.is_float and c in BUILTINS and \
            BUILTINS[c].op == m.op and m.op in ("add", "mul"):
        from .reductions import _np_reduce

        red = _np_reduce(c, xa, (nb,), dt)
        sq = sa.reshape(sa.shape[:nb] + sa.shape[nb + 1:])
        pair = (sq, red) if m.state_first else (red, sq)
        return RV(N.binary(m.op, *pair, dt), nb)
    full = np.broadcast_shapes(sa.shape[:nb] + (1,) + sa.shape[nb + 1:],
                               xa.shape[:nb] + (1,) + xa.shape[nb + 1:])
    seed = np.broadcast_to(sa, full)
    xs = np.broadcast_to(xa, full[:nb] + (b.n,) + full[nb + 1:])
    assoc = _ASSOCIATIVE_FLOAT if dt.is_float else _ASSOCIATIVE_INT
    if m.op in assoc:
        # the updates in order are op(...op(op(z, x0), x1)..., xn-1) (state first) or
        # op(xn-1, ...op(x0, z)) (contribution first): one ordered sequence either way
        seq = np.concatenate([seed, xs], axis=nb) if m.state_first else \
            np.concatenate([xs[(slice(None),) * nb + (slice(None, None, -1),)], seed], axis=nb)
        return RV(_ordered_tree(m.op, seq, nb, dt), nb)
    if dt.is_float and m.op in _ACCUMULATE:
        if not m.state_first:
            if m.op not in ("add", "mul"):
                return None
            if np.any(np.isnan(N._wide(np.asarray(xs), dt))):
                return None  # NaN payloads depend on the operand order
        seq = np.concatenate([seed, xs], axis=nb)
        with np.errstate(all="ignore"):
            acc = _ACCUMULATE[m.op].accumulate(seq, axis=nb, dtype=seq.dtype)
        return RV(np.array(acc[(slice(None),) * nb + (-1,)]), nb)
    return None


def _ordered_tree(op: str, seq: np.ndarray, axis: int, dt: Any) -> np.ndarray:
    """``seq`` combined along ``axis`` by ``op`` as a balanced tree that keeps the
    left-to-right order of its operands (each level merges neighbours)."""
    lead = (slice(None),) * axis
    while seq.shape[axis] > 1:
        n = seq.shape[axis]
        even = N.binary(op, seq[lead + (slice(0, n - 1, 2),)], seq[lead + (slice(1, n, 2),)],
                        dt)
        seq = np.concatenate([even, seq[lead + (slice(n - 1, n),)]], axis=axis) if n % 2 \
            else even
    return np.array(seq[lead + (0,)])


def run(it: Interpreter, op: Operation, p: Plan, seeds: list, shape: tuple[int, ...],
        points: list, reverse: bool) -> tuple[list, list[Batch] | None]:
    """The reduce's states after all its iterations, batched chunk by chunk
    (first-axis ranges, in execution order); a chunk that cannot be batched and
    everything after it run one by one. Also the batches (None when some
    iterations ran one by one)."""
    from .regions import _iterate

    n0 = shape[0] if shape else 0
    rest = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    if not shape or n0 * rest == 0:
        return _iterate(it, op, op.regions[0], seeds, points), None
    per_row = rest * max(1, _elements(it, p))
    rows = max(1, CHUNK_ELEMENTS // per_row)
    bounds = [(lo, min(n0, lo + rows)) for lo in range(0, n0, rows)]
    if reverse:
        bounds = bounds[::-1]
    states = list(seeds)
    batches: list[Batch] = []
    with it.progress(op, len(points)) as step:
        for lo, hi in bounds:
            b = contributions(it, op, p.contrib, lo, hi, shape, reverse)
            if b is None:
                left = [pt for pt in points if (pt[0] < hi if reverse else pt[0] >= lo)]
                if reverse:
                    left = left[::-1]
                return _iterate(it, op, op.regions[0], states, left), None
            states = fold(it, op, p, b, states, reverse)
            it.batched_iterations += b.n
            batches.append(b)
            step(advance=b.n)
    return states, batches


def _elements(it: Interpreter, p: Plan) -> int:
    """Largest element count of one iteration's contribution value (times the
    instances executed together)."""
    lanes = int(np.prod(it.bshape)) if it.bshape else 1
    most = 1
    for o in p.contrib:
        for r in o.results:
            if isinstance(r.type, TileType):
                try:
                    n = int(np.prod([it.extent(x) for x in r.type.extents]))
                except ExtentDiverges:
                    return 1 << 30
                most = max(most, n)
    return most * lanes


def lifted(it: Interpreter, op: Operation, p: Plan, batches: list[Batch]) -> list[RV] | None:
    """Each state's lifted contributions, the body applied to the contract's
    identity (``reductions._contributions``), at every point of the batches in
    source order on batch axis ``it.nb``: the merge op on the identity and the
    batched operand, computed once. None where some operand is inexact or a
    contract has no builtin identity (the caller then runs the body per point).

    The reads of the body are not logged again: a second series of the same
    reads in the same order by the same instances leaves the log as the first
    left it (every read is checked against the same writes, an element keeps
    the same readers and the same last reader) and reports nothing new."""
    from ..semantics.reducers import BUILTINS

    if p.merges is None or not batches:
        return None
    out = []
    for i, m in enumerate(p.merges):
        c = op.attrs["contracts"][i]
        if c not in BUILTINS:
            return None
        parts = []
        for b in batches:
            x = operand(it, b, m.other)
            if x.lo is not None:
                return None
            parts.append(flat_iterations(b, x, False))
        nb = batches[0].nb0
        res_t: TileType = m.site.results[0].type
        xs = [align(v, m.other.type.dims, res_t.dims, nb + 1) for v in parts]
        lead = np.broadcast_shapes(*(x.shape[:nb] for x in xs))
        xa = np.concatenate([np.broadcast_to(x, lead + x.shape[nb:]) for x in xs], axis=nb)
        dt = m.site.operands[0].type.dtype
        st = op.operands[i].type
        ident = np.broadcast_to(N.constant(BUILTINS[c].identity(dt), dt),
                                tuple(it.extent(e) for e in st.extents))
        e = align(RV(ident, 0), st.dims, res_t.dims, nb + 1)
        pair = (e, xa) if m.state_first else (xa, e)
        out.append(RV(N.binary(m.op, *pair, dt), nb + 1))
    return out
