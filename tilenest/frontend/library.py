"""Library compositions over the core: expression ``reduce``, scans, argmax,
stable sort and top-k, and custom reducer contracts.

None of these is a new primitive: each expands into ``reduce``/``serial``
regions, ``reindex``/``gather`` and elementwise ops when called, so the
interpreter, the proofs and every backend see only core TileIR.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..errors import CaptureError, TypeCheckError
from ..semantics import dtypes as D
from ..semantics import expr as E
from ..semantics.dtypes import DType
from ..semantics.policies import ReductionPolicy
from ..semantics.reducers import BUILTINS, CustomReducer
from ..semantics.space import Dim, DimFactor, IndexSet, Space
from ..semantics.types import TileType
from . import dsl
from .builder import BBlock, BValue
from .context import ScopeFrame, ctx
from .dsl import Fn, Tile


def region(kind: str, shp: dsl.Shape, inits: Sequence[Tile],
           body: Callable[[dsl.ScopeHandle, list[Tile]], Sequence[Tile]],
           label: str = "r", **attrs: Any) -> list[Tile]:
    """Build a region programmatically: ``body(handle, states) -> next states``."""
    c = ctx()
    vars_ = tuple(c.builder.fresh_var(label if shp.rank == 1 else f"{label}{i}")
                  for i in range(shp.rank))
    space = shp.space(labels=label)
    domain = IndexSet(space, vars_)
    level = c.level
    a = {"vars": vars_, "domain": domain}
    if kind == "parallel":
        level = c.next_level
        c.next_level += 1
        c.level_parent[level] = c.level
        a["level"] = level
    a.update(attrs)
    handle = dsl.ScopeHandle(kind, vars_, dsl.space_shape(space), level, c.scope.handle,
                             label, c.site())
    block = BBlock([BValue(t.type, f"{label}_s{i}") for i, t in enumerate(inits)])
    c.builder.push(block)
    c.frames.append(ScopeFrame(kind, handle, block, level))
    try:
        outs = list(body(handle, [Tile(v) for v in block.args]))
        for o, i in zip(outs, inits, strict=True):
            if o.type != i.type:
                raise TypeCheckError(f"library {kind} region changes a state's type")
        c.builder.op("yield", [o.v for o in outs])
    finally:
        c.frames.pop()
        c.builder.pop()
    handle.closed = True
    op = c.builder.op(kind, [t.v for t in inits], a, regions=[block],
                      result_types=tuple(t.type for t in inits))
    return [Tile(r) for r in op.results]


def _reducer_of(r: Any) -> str:
    if isinstance(r, Fn) and r.reducer:
        return r.reducer
    if isinstance(r, str) and r in BUILTINS:
        return r
    raise CaptureError(f"{r!r} is not a reducer for expression reduce",
                       hint="use tn.add, tn.mul, tn.maximum, tn.minimum, tn.logical_and/or/xor")


def reduce_expr(x: Tile, dims: Any, reducer: Any,
                policy: ReductionPolicy = ReductionPolicy.unordered_tree) -> Tile:
    """``reduce(x, dims, r)``: combine ``x`` over ``dims`` with builtin reducer ``r``;
    the result keeps the other dims. Shorthand for a reduce region whose seed is
    the reducer's identity and whose update is ``s = merge(s, x.at(h))``."""
    if dims is None:
        raise CaptureError("reduce(x, dims, reducer) needs the dims to reduce")
    dl = dsl._dims_arg([dims])
    name = _reducer_of(reducer)
    b = BUILTINS[name]
    if not b.accepts(x.dtype):
        raise TypeCheckError(f"reducer {name} is not defined on {x.dtype}")
    for d in dl:
        if not x.type.space.has(d):
            raise TypeCheckError(f"'{d.describe()}' is not a dim of the reduced tile",
                                 hint="obtain dims from the tile itself: x.dim(i)")
    keep = x.type.space.without(dl)
    seed = dsl.full(x.dtype, dsl.space_shape(keep), b.identity(x.dtype))
    dom = dsl.Shape([(d, x.type.space.extent_of(d)) for d in dl])

    def body(h: dsl.ScopeHandle, st: list[Tile]) -> list[Tile]:
        (s,) = st
        return [dsl._binary(b.op, s, x.at(h))]

    return region("reduce", dom, [seed], body, label="r", policy=policy, contracts=(name,))[0]


def _axis_dim(x: Tile, axis: Any) -> Dim:
    return axis if isinstance(axis, Dim) else x.dim(int(axis))


def _fresh_copy_dim(d: Dim) -> Dim:
    return Dim.fresh((d.label or "d") + "'")


def _rename_dim(x: Tile, old: Dim, new: Dim) -> Tile:
    """``x`` with dim ``old`` retyped to identity ``new`` (a reindex)."""
    space = Space(tuple(DimFactor(new if f.dim == old else f.dim, f.extent)
                        for f in x.type.space.factors))
    vars_ = tuple(str(i) for i in range(x.rank))
    return dsl._emit("reindex", [x], {"vars": vars_, "map": tuple(E.Var(v) for v in vars_)},
                     (TileType(x.dtype, space),))[0]


def scan(x: Tile, axis: Any, reducer: Any = "add",
         policy: ReductionPolicy = ReductionPolicy.fold_left) -> Tile:
    """Inclusive scan along ``axis``. ``fold_left``: each prefix is the strict left
    fold (a serial region carrying the running state); ``ordered_tree``: every
    prefix is an ordered-tree reduction of its leaves (regrouping allowed, order
    kept; quadratic work, which keeps the whole admitted set visible)."""
    name = _reducer_of(reducer)
    b = BUILTINS[name]
    d = _axis_dim(x, axis)
    n = x.type.space.extent_of(d)
    if policy is ReductionPolicy.fold_left:
        keep = x.type.space.without([d])
        run = dsl.full(x.dtype, dsl.space_shape(keep), b.identity(x.dtype))
        out = dsl.zeros(x.dtype, dsl.space_shape(x.type.space))
        ax = x.type.space.index(d)

        def body(h: dsl.ScopeHandle, st: list[Tile]) -> list[Tile]:
            s, o = st
            s2 = dsl._binary(b.op, s, x.at(h))
            patch = dsl.broadcast(s2, dsl.space_shape(Space(tuple(
                DimFactor(f.dim, E.Const(1)) if f.dim == d else f for f in x.type.space.factors))))
            origin = [h.index() if i == ax else 0 for i in range(x.rank)]
            return [s2, dsl.put(o, origin, patch)]

        return region("serial", dsl.Shape([(d, n)]), [run, out], body, label="scan",
                      order="forward")[1]
    if policy is ReductionPolicy.ordered_tree:
        # prefix[j] = reduce_{i <= j} x[i] under ordered_tree: each prefix may be
        # regrouped but keeps its leaf order (masked-out leaves are the identity,
        # which is exact for every builtin merge)
        di = _fresh_copy_dim(d)
        pair = Space(x.type.space.factors + (DimFactor(di, n),))
        xi = dsl.broadcast(_rename_dim(x, d, di), dsl.space_shape(pair))
        ax = x.type.space.index(d)
        jj = dsl.iota(dsl.space_shape(pair), ax)
        ii = dsl.iota(dsl.space_shape(pair), x.rank)
        ident = dsl.full(x.dtype, dsl.space_shape(pair), b.identity(x.dtype))
        return reduce_expr(dsl.ite(ii <= jj, xi, ident), di, name,
                           policy=ReductionPolicy.ordered_tree)
    raise CaptureError(f"scan policy {policy.value} is not available",
                       hint="use fold_left or ordered_tree (scan never permutes)")


def cumsum(x: Tile, axis: Any, policy: ReductionPolicy = ReductionPolicy.fold_left) -> Tile:
    return scan(x, axis, "add", policy)


def argmax(x: Tile, axis: Any) -> Tile:
    """First index of the maximum along ``axis`` (NaN counts as the maximum; ties
    -- including -0.0 vs +0.0 -- go to the lowest index)."""
    d = _axis_dim(x, axis)
    m = reduce_expr(x, d, "max")
    idx = dsl.iota(dsl.space_shape(x.type.space), x.type.space.index(d))
    hit = (x == m)
    if x.dtype.is_float:
        hit = hit | (dsl._unary("isnan", x) & dsl._unary("isnan", m))
    n = x.type.space.extent_of(d)
    big = dsl.Index(n).value()
    cand = dsl.ite(hit, idx, big)
    return reduce_expr(cand, d, "min")


def _less_pairs(x: Tile, d: Dim, dj: Dim, descending: bool) -> Tile:
    """``less[i, j]`` = element j sorts strictly before element i (stable total
    order, NaN last): compared by value, then by original index."""
    ax = x.type.space.index(d)
    space_ij = Space(x.type.space.factors + (DimFactor(dj, x.type.space.extent_of(d)),))
    xi = dsl.broadcast(x, dsl.space_shape(space_ij))
    xj = dsl.broadcast(_rename_dim(x, d, dj), dsl.space_shape(space_ij))
    ii = dsl.iota(dsl.space_shape(space_ij), ax)
    jj = dsl.iota(dsl.space_shape(space_ij), x.rank)
    before = (xj > xi) if descending else (xj < xi)
    if x.dtype.is_float:
        ni, nj = dsl._unary("isnan", xi), dsl._unary("isnan", xj)
        before = (before & ~nj) | (ni & ~nj)
        tie = (xj == xi) | (ni & nj)
    else:
        tie = xj == xi
    return before | (tie & (jj < ii))


def sort(x: Tile, axis: Any, descending: bool = False, k: int | None = None
         ) -> tuple[Tile, Tile]:
    """Stable sort along ``axis`` (NaN last, ties by original index); returns
    ``(values, source_indices)``. With ``k``, only the first ``k`` (top-k)."""
    d = _axis_dim(x, axis)
    n = x.type.space.extent_of(d)
    dj = _fresh_copy_dim(d)
    less = _less_pairs(x, d, dj, descending)
    rank = reduce_expr(dsl.cast(less, D.i64), dj, "add")  # rank[i]
    kk = n if k is None else E.Const(k)
    if k is not None and isinstance(n, E.Const) and k > n.value:
        raise TypeCheckError(f"top-k with k={k} > extent {n.value}")
    dr = Dim.fresh("rank")
    ax = x.type.space.index(d)
    out_space = Space(tuple(DimFactor(dr, kk) if f.dim == d else f for f in x.type.space.factors))
    pair = Space(x.type.space.factors + (DimFactor(dr, kk),))
    r_ = dsl.iota(dsl.space_shape(pair), x.rank)
    i_ = dsl.iota(dsl.space_shape(pair), ax)
    src = reduce_expr(dsl.ite(dsl.broadcast(rank, dsl.space_shape(pair)) == r_, i_, 0), d, "add")  # src over out dims + dr
    # move dr into d's position
    order = [f.dim for f in out_space.factors]
    src = dsl.permute(src, order)
    vals = dsl.gather(x, src, ax, 0 if not x.dtype.is_float else 0.0)
    return vals, src


def topk(x: Tile, axis: Any, k: int, largest: bool = True) -> tuple[Tile, Tile]:
    """The ``k`` largest (or smallest) elements in sorted order with their indices;
    ties keep original index order, NaN sorts last."""
    return sort(x, axis, descending=largest, k=k)


def reducer(name: str, identity: Any, merge: Callable[..., Any], dtype: DType | Sequence[DType],
            lift: Callable[..., Any] | None = None, associative: bool = True,
            commutative: bool = True) -> CustomReducer:
    """Declare a custom reducer contract (staged scalar merge/lift bodies)."""
    c = ctx()
    dts = tuple(dtype) if isinstance(dtype, (tuple, list)) else (dtype,)
    ids = tuple(identity) if isinstance(identity, (tuple, list)) else (identity,)
    if len(ids) != len(dts):
        raise CaptureError("reducer identity needs one value per state component")

    def stage(fn: Callable[..., Any], arg_types: Sequence[DType]) -> BBlock:
        blk = BBlock([BValue(TileType(t, Space()), f"a{i}") for i, t in enumerate(arg_types)])
        c.builder.push(blk)
        try:
            out = fn(*(Tile(a) for a in blk.args))
            outs = out if isinstance(out, tuple) else (out,)
            if len(outs) != len(dts):
                raise CaptureError(f"reducer '{name}' must return {len(dts)} components")
            vals = [dsl._as_tile(o, t) for o, t in zip(outs, dts, strict=True)]
            c.builder.op("yield", [v.v for v in vals])
        finally:
            c.builder.pop()
        return blk

    merge_b = stage(merge, dts + dts)
    lift_b = stage(lift, dts) if lift is not None else None
    if name in c.reducer_names:
        raise CaptureError(f"duplicate reducer name '{name}'")
    r = CustomReducer(name, dts, ids, merge_b, lift_b, associative, commutative)
    c.reducers.append(r)
    c.reducer_names.add(name)
    return r
