"""Meaning of ``reduce`` regions (``spec/reductions.md``).

For contributions at the active domain points ``r0 < r1 < ... < rn-1``
(lexicographic order) and seed ``z``:

* ``fold_left``  -- the body runs at ``r0, r1, ...`` in order: exactly
  ``u(...u(u(z, x0), x1)..., xn-1)`` with the update ``u`` as written;
* ``fold_right`` -- the body runs at ``rn-1, ..., r0``: ``u(x0, u(x1, ... u(xn-1, z)))``
  with the orientation written in the body (``right = x - right``);
* tree policies admit any grouping (``ordered_tree``) and, for
  ``unordered_tree``, any permutation of the lifted contributions, merged with
  the contract's merge and the seed included once. The canonical evaluation is
  the serial one (a member of the admitted set); the ``random`` schedule builds
  a random tree (and for unordered, a random permutation); ``fast`` mode uses
  numpy's reductions for the expression-reduce shape.
An empty domain yields the seed.

A realization may commit to one fixed tree (``Options.trees``: a
:class:`~tilenest.semantics.trees.BlockTree` per reduce op, e.g. the CUDA
block tree of a custom contract); the reference then evaluates that tree
(:func:`_block_tree`) instead of the canonical fold, so that a contract
whose merge has no closed-form envelope is still checked bitwise against a
member of its admitted set.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import warnings

from ..errors import ContractError, TilenestWarning
from ..semantics.ir import Block, Operation
from ..semantics.policies import ReductionPolicy
from ..semantics.reducers import BUILTINS, tree_laws
from ..semantics import expr as E
from ..semantics import numerics as N
from . import batching, contraction
from . import shadow as S
from .core import Interpreter, rule
from .regions import (_bind_point, _carry_track, _finish_track, _iterate, _pred_value,
                      _run_masked, domain_points)
from .runtime import RV, align


@rule("reduce")
def _reduce(it: Interpreter, op: Operation) -> None:
    policy: ReductionPolicy = op.attrs["policy"]
    contracts = op.attrs["contracts"]
    if policy.is_tree and any(c is None for c in contracts):
        raise ContractError(
            f"reduce with policy {policy.value} has a state without a reducer contract", op.loc,
            "a tree policy needs a lawful merge; use fold_left/fold_right for a strict order")
    if policy.is_tree:
        _warn_unproved(it, op)
    shape, points = domain_points(it, op)
    body = op.regions[0]
    seeds = [it.val(o) for o in op.operands]
    _carry_track(it, op, body)
    out = None
    batches: list | None = None
    random_tree = policy.is_tree and it.opts.schedule.kind == "random"
    fixed = (it.opts.trees or {}).get(op.oid) if policy.is_tree else None
    if policy.is_tree and it.opts.fast and not it.opts.oracle:
        out = _fast_expression_reduce(it, op, seeds, shape)
        if out is None and not random_tree and fixed is None:
            out = contraction.run(it, op, seeds, shape, points)
    if fixed is not None:
        out = _block_tree(it, op, body, seeds, points, fixed)
    plan = None if out is not None or random_tree else batching.eligible(it, op)
    if plan is not None:
        out, batches = batching.run(it, op, plan, seeds, shape, points,
                                    policy is ReductionPolicy.fold_right)
    elif out is None:
        if policy is ReductionPolicy.fold_right:
            out = _iterate(it, op, body, seeds, points[::-1])
        elif random_tree:
            out = _random_tree(it, op, body, seeds, points, policy)
        else:
            out = _iterate(it, op, body, seeds, points)
    if it.opts.oracle and policy.is_tree and fixed is None:
        # (a fixed tree is the one evaluation admitted: its own operations'
        # envelopes bound it, as they do any other computation)
        leaves = None
        if batches is not None and plan is not None:
            leaves = batching.lifted(it, op, plan, batches)
        out = _tree_bounds(it, op, body, seeds, points, out, leaves)
    _finish_track(it, op, body)
    for r, v in zip(op.results, out, strict=True):
        it.set(r, v)


#: custom reducers already warned about in this process (by identity; the
#: values keep each one alive so that an identity is never reused)
_WARNED: dict[int, Any] = {}


def _warn_unproved(it: Interpreter, op: Operation) -> None:
    """A tree policy over a custom reducer whose laws are not proved admits
    results that depend on the grouping: say so, once per reducer."""
    policy: ReductionPolicy = op.attrs["policy"]
    for c in dict.fromkeys(op.attrs["contracts"]):
        if c is None or not c.startswith("@"):
            continue
        red = next((r for r in it.prog.reducers if r.name == c[1:]), None)
        if red is None or id(red) in _WARNED:
            continue
        proved, why = tree_laws(it.prog, red, policy is ReductionPolicy.unordered_tree)
        _WARNED[id(red)] = red
        if proved:
            continue
        site = op.loc
        warnings.warn_explicit(
            f"reduce runs {policy.value} over reducer {c}, whose laws are not proved ({why}); "
            "the trees this policy admits may give different results, and compiling it is "
            "refused (use policy=tn.fold_left, or correct the merge)", TilenestWarning,
            (site.file if site is not None else None) or "<unknown>",
            site.line if site is not None else 0)


def _tree_bounds(it: Interpreter, op: Operation, body: Block, seeds: list, points: list,
                 out: list, lifted: list[RV] | None = None) -> list:
    """Bounds of every admitted tree evaluation (spec R-8): the leaves are the seed
    and the contributions (the body applied to the identity); float ``add``,
    ``mul``, ``max`` and ``min`` are bounded by :func:`shadow.tree_envelope` over
    them. Other contracts are exact laws (R-7): their canonical value stands, and
    is unbounded only when an input already was.

    ``lifted``: the contributions already computed together (one exact value per
    state, the points on batch axis ``it.nb`` in source order;
    :func:`batching.lifted`) instead of running the body once more per point."""
    contracts = op.attrs["contracts"]
    need = [i for i, s in enumerate(seeds) if isinstance(s, RV) and (
        op.operands[i].type.dtype.is_float or not s.exact)]
    if not need:
        return out
    idents = [BUILTINS[c].identity(o.type.dtype) if c in BUILTINS else 0
              for c, o in zip(contracts, op.operands, strict=True)]
    contribs = [] if lifted is not None else \
        _contributions(it, op, body, seeds, points, idents)
    if contribs is None:
        return [_unbounded(v) for v in out]
    res = list(out)
    for i in need:
        c = contracts[i]
        dt = op.operands[i].type.dtype
        leaves = [seeds[i]] + [cb[i] for cb in contribs]
        exact_inputs = all(v.exact for v in leaves)
        if c in ("max", "min") and exact_inputs:
            continue  # order-independent and exact: the canonical value
        if c not in ("add", "mul", "max", "min") or not dt.is_float:
            if not exact_inputs:
                res[i] = _unbounded(out[i])
            continue
        block = lifted[i] if lifted is not None else None  # nb: it.nb + 1 (the points)
        nb = max([out[i].nb] + [v.nb for v in leaves])
        bnb = 0 if block is None else block.nb - 1
        nb = max(nb, bnb)
        shapes = [out[i].lift(nb).shape] + [v.lift(nb).shape for v in leaves]
        if block is not None:
            pts = np.moveaxis(block.a, bnb, 0)  # points first
            pts = pts.reshape(pts.shape[:1 + bnb] + (1,) * (nb - bnb) + pts.shape[1 + bnb:])
            shapes.append(pts.shape[1:])
        shape = np.broadcast_shapes(*shapes)
        cols: list[list[np.ndarray]] = [[], [], [], [], []]
        for v in leaves:
            canon = _as_f64(v.lift(nb))
            lo, hi, nan = (v.lift(nb, b) for b in v.shadow())
            pt = np.ones(canon.shape, bool) if v.exact else (
                (S.singleton((lo, hi, nan)) & ((lo == canon) | np.isnan(canon))))
            for col, a in zip(cols, (lo, hi, nan, pt, canon), strict=True):
                col.append(np.broadcast_to(a, shape)[None])
        if block is not None:  # exact leaves: each one alone
            canon = _as_f64(pts)
            lo, hi, nan = S.point_of(pts)
            for col, a in zip(cols, (lo, hi, nan, np.ones(canon.shape, bool), canon),
                              strict=True):
                col.append(np.broadcast_to(a, (a.shape[0],) + shape))
        lo, hi, nan, pt = S.tree_envelope(c, dt, *(np.concatenate(col) for col in cols))
        if bool(np.all(pt)):
            continue  # the same value in every tree: the canonical one, bitwise
        ref = S.point_of(np.broadcast_to(out[i].lift(nb), shape))
        parts = [np.where(pt, r, b) for r, b in zip(ref, (lo, hi, nan), strict=True)]
        res[i] = RV(out[i].a, out[i].nb).with_bounds(*_fit(parts, out[i], nb))
    return res


def _as_f64(a: np.ndarray) -> np.ndarray:
    """Float values widened exactly to float64 (16-bit formats through f32)."""
    a = np.asarray(a)
    return (a.astype(np.float32) if a.dtype.itemsize == 2 else a).astype(np.float64)


def _fit(parts: list[np.ndarray], v: RV, nb: int) -> list[np.ndarray]:
    """A shadow shaped like ``v.a`` (``v`` may have fewer batch axes)."""
    shape = v.a.shape
    out = []
    for b in parts:
        if b.ndim != len(shape) and nb > v.nb and all(n == 1 for n in b.shape[v.nb:nb]):
            b = b.reshape(b.shape[:v.nb] + b.shape[nb:])
        out.append(np.broadcast_to(b, shape).copy())
    return out


def _unbounded(v: Any) -> Any:
    if not isinstance(v, RV):
        return v
    return RV(v.a, v.nb).with_bounds(*S.full_of(v.a.shape))


def _merge_groups(it: Interpreter, op: Operation) -> list[tuple[list[int], Any, list]] | None:
    """The states merged together, in order: ``(state indices, merge, identities)``.

    A builtin contract merges its one state; a custom reducer of ``k``
    components merges the ``k`` consecutive states it covers jointly (R-10,
    R-11), ``merge(a_1..a_k, b_1..b_k)``. None when a custom contract's arity
    does not match the states it is attached to (no joint merge exists)."""
    contracts = list(op.attrs["contracts"])
    groups: list[tuple[list[int], Any, list]] = []
    i = 0
    while i < len(contracts):
        c = contracts[i]
        if c.startswith("@"):
            red = next(r for r in it.prog.reducers if r.name == c[1:])
            k = len(red.state)
            if contracts[i:i + k] != [c] * k:
                return None

            dims = [tuple(op.operands[i + j].type.dims) for j in range(k)]

            def merge(a: list, b: list, red: Any = red, dims: list = dims) -> list:
                if len(set(dims)) == 1:
                    return it.block(red.merge, [*a, *b])
                return _merge_by_dims(it, red, dims, a, b)

            groups.append((list(range(i, i + k)), merge, list(red.identity)))
            i += k
            continue
        bi = BUILTINS[c]
        dt = op.operands[i].type.dtype

        def merge1(a: list, b: list, bi: Any = bi, dt: Any = dt) -> list:
            x, y = a[0], b[0]
            n = max(x.nb, y.nb)
            return [RV(N.binary(bi.op, x.lift(n), y.lift(n), dt), n)]

        groups.append(([i], merge1, [bi.identity(dt)]))
        i += 1
    return groups


def _merge_by_dims(it: Interpreter, red: Any, dims: list, a: list, b: list) -> list:
    """``merge(a, b)`` of a custom group whose states have different dims (a
    narrower one among the widest's, R-11): every component laid out over
    the widest state's dims (size-1 axes where it lacks one), the scalar
    merge run with numpy's broadcasting, and each narrower result taken back
    to its own dims (the verifier's dependence rule makes it constant along
    the others); a widest result computed from narrower states only is
    broadcast to the widest state's shape."""
    wide = max(dims, key=len)
    vals = [*a, *b]
    nb = max(v.nb for v in vals)

    def each(v: RV, f: Any) -> RV:  # ``f`` on the values and on their bounds
        out = RV(f(v.lift(nb)), nb)
        if v.lo is not None:
            out.lo, out.hi, out.nan = (f(v.lift(nb, x)) for x in (v.lo, v.hi, v.nan))
        return out

    def narrow(x: np.ndarray, src: tuple) -> np.ndarray:
        y = x[(slice(None),) * nb + tuple(slice(None) if d in src else 0 for d in wide)]
        order = [d for d in wide if d in src]
        return y.transpose(list(range(nb)) + [nb + order.index(d) for d in src])

    def widen(v: RV, src: tuple) -> RV:
        out = RV(align(v, src, wide, nb), nb)
        if v.lo is not None:
            out.lo, out.hi, out.nan = (align(v, src, wide, nb, x) for x in (v.lo, v.hi, v.nan))
        return out

    k = len(dims)
    ins = [widen(v, dims[n % k]) for n, v in enumerate(vals)]
    full = np.broadcast_shapes(*(v.a.shape for v in ins))
    outs = it.block(red.merge, ins)
    return [(v if v.lift(nb).shape == full else each(v, lambda x: np.broadcast_to(x, full).copy()))
            if d == wide else each(v, lambda x, d=d: narrow(x, d))
            for v, d in zip(outs, dims, strict=True)]


def _contributions(it: Interpreter, op: Operation, body: Block, seeds: list, points: list,
                   idents: list) -> list[list[RV]] | None:
    """Each active point's lifted contribution: the body applied to the identity
    state(s). Where the point is active for some batched instances only (a
    domain predicate or extent that differs between them), the others
    contribute the identity itself, which leaves every grouping's value as it
    is for that instance's own points."""
    states = [RV(np.broadcast_to(N.constant(i, o.type.dtype), s.a.shape), s.nb)
              for i, s, o in zip(idents, seeds, op.operands, strict=True)]
    out: list[list[RV]] = []
    with it.progress(op, len(points), "each contribution") as step:
        for pt in points:
            step()
            _bind_point(it, op.attrs["vars"], pt)
            pv = _pred_value(it, op)
            if pv is True or bool(np.all(pv)):
                out.append(it.block(body, states))
            elif np.any(pv):
                out.append(_run_masked(it, body, states, np.asarray(pv, dtype=bool)))
    return out


def _random_tree(it: Interpreter, op: Operation, body: Block, seeds: list, points: list,
                 policy: ReductionPolicy) -> list:
    """A randomly grouped (and for unordered_tree, permuted) evaluation: the
    contributions (the body applied to the identity) merged pairwise at random
    positions, then merged into the seed."""
    groups = _merge_groups(it, op)
    if groups is None:
        return _iterate(it, op, body, seeds, points)  # no joint merge: the source order
    idents: list = [None] * len(seeds)
    for idx, _, ids in groups:
        for j, e in zip(idx, ids, strict=True):
            idents[j] = e
    contribs = _contributions(it, op, body, seeds, points, idents)
    if not contribs:
        return seeds
    order = list(range(len(contribs)))
    if policy is ReductionPolicy.unordered_tree:
        it.rng.shuffle(order)
    out = list(seeds)
    for idx, merge, _ in groups:
        items = [[contribs[j][i] for i in idx] for j in order]
        while len(items) > 1:
            k = it.rng.randrange(len(items) - 1)
            items[k:k + 2] = [merge(items[k], items[k + 1])]
        for i, v in zip(idx, merge([seeds[i] for i in idx], items[0]), strict=True):
            out[i] = v
    return out


def _block_tree(it: Interpreter, op: Operation, body: Block, seeds: list, points: Any,
                tree: Any) -> list:
    """The states as ``tree`` (a ``BlockTree`` or ``RunTree``) evaluates them: each thread
    folds its segment of the domain's points with the body from the
    identities, the partials are merged as the tree says, and the seed is
    merged on the left (``semantics/trees.py``). Where the instances run
    together have domains of different extents, no one tree stands for all
    of them: their states are left unbounded (every value admitted)."""
    groups = _merge_groups(it, op)
    if groups is None:
        return _iterate(it, op, body, seeds, points)
    if op.oid in it.ragged:
        return [_unbounded(v) for v in _iterate(it, op, body, seeds, points)]
    idents: list = [None] * len(seeds)
    for idx, _, ids in groups:
        for j, e in zip(idx, ids, strict=True):
            idents[j] = e
    start = [RV(np.broadcast_to(N.constant(e, o.type.dtype), s.a.shape), s.nb)
             for e, s, o in zip(idents, seeds, op.operands, strict=True)]
    pts = list(points)

    def merge(a: list, b: list) -> list:
        out = list(a)
        for idx, mg, _ in groups:
            for i, v in zip(idx, mg([a[i] for i in idx], [b[i] for i in idx]), strict=True):
                out[i] = v
        return out

    parts = [_iterate(it, op, body, start, [pts[i] for i in seg])
             for seg in tree.segments(len(pts))]
    total = tree.combine(parts, merge)
    return list(seeds) if total is None else merge(list(seeds), total)


def _fast_expression_reduce(it: Interpreter, op: Operation, seeds: list, shape: tuple
                            ) -> list | None:
    """numpy reduction for the shape ``s = merge(s, x.at(r))`` (one state)."""
    body = op.regions[0]
    if len(seeds) != 1 or len(body.ops) != 3 or op.attrs["contracts"][0].startswith("@"):
        return None
    if op.attrs["domain"].pred != E.TRUE or op.oid in it.ragged:
        return None  # not the whole box for every instance
    rx, mg, y = body.ops
    if rx.name != "reindex" or y.operands[0] != mg.result:
        return None
    b = BUILTINS[op.attrs["contracts"][0]]
    if mg.name != b.op or set(mg.operands) != {body.args[0], rx.result}:
        return None
    xv = rx.operands[0]
    if xv.name not in it.values:
        return None
    rvars = op.attrs["vars"]
    m = rx.attrs["map"]
    axes, keep = [], []
    for k, e in enumerate(m):
        if isinstance(e, E.Var) and e.name in rvars:
            axes.append((k, rvars.index(e.name)))
        elif isinstance(e, E.Var) and e.name in rx.attrs["vars"]:
            keep.append((k, rx.attrs["vars"].index(e.name)))
        else:
            return None
    if len(axes) != len(rvars) or [j for _, j in keep] != list(range(len(keep))):
        return None
    x = it.val(xv)
    if [x.tile_shape[k] for k, _ in axes] != [shape[j] for _, j in axes]:
        return None
    dt = xv.type.dtype
    red = _np_reduce(b.name, x.a, tuple(x.nb + k for k, _ in axes), dt)
    s = seeds[0]
    nb = max(s.nb, x.nb)
    red_rv = RV(red, x.nb)
    return [RV(N.binary(b.op, s.lift(nb), red_rv.lift(nb), dt), nb)]


def _np_reduce(name: str, a: np.ndarray, axes: tuple[int, ...], dt: Any) -> np.ndarray:
    if a.size == 0 or any(a.shape[k] == 0 for k in axes):
        ident = BUILTINS[name].identity(dt)
        shp = tuple(n for k, n in enumerate(a.shape) if k not in axes)
        return np.broadcast_to(N.constant(ident, dt), shp).copy()
    if name == "add":
        # numpy's pairwise sum starts from +0.0 unless told otherwise, which would turn an
        # all-(-0.0) sum into +0.0 -- outside every admitted grouping
        if dt.name in ("f16", "bf16"):
            return N.cast(np.add.reduce(a.astype(np.float32), axis=axes, initial=-0.0), _f32(),
                          dt)
        if dt.is_float:
            return np.add.reduce(a, axis=axes, initial=-0.0)
        return np.add.reduce(a, axis=axes)
    if name == "mul":
        return np.multiply.reduce(a, axis=axes)
    if name in ("max", "min"):
        r = (np.max if name == "max" else np.min)(a, axis=axes)
        if dt.is_float:
            zero = r == 0
            if np.any(zero):
                neg = np.signbit(a) & (a == 0)
                pos = ~np.signbit(a) & (a == 0)
                if name == "max":
                    any_pos = np.any(pos, axis=axes)
                    r = np.where(zero, np.where(any_pos, np.zeros_like(r), -np.zeros_like(r)), r)
                else:
                    any_neg = np.any(neg, axis=axes)
                    r = np.where(zero, np.where(any_neg, -np.zeros_like(r), np.zeros_like(r)), r)
        return r
    if name == "and":
        return np.logical_and.reduce(a, axis=axes) if dt.is_bool else \
            np.bitwise_and.reduce(a, axis=axes)
    if name == "or":
        return np.logical_or.reduce(a, axis=axes) if dt.is_bool else \
            np.bitwise_or.reduce(a, axis=axes)
    if name == "xor":
        return np.logical_xor.reduce(a, axis=axes) if dt.is_bool else \
            np.bitwise_xor.reduce(a, axis=axes)
    raise KeyError(name)


def _f32() -> Any:
    from ..semantics import dtypes as D

    return D.f32
