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
    space = shp.space(labels=label, made_by=f"the domain dim of a library {kind} region")
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
                policy: ReductionPolicy | str = ReductionPolicy.unordered_tree) -> Tile:
    """``reduce(x, dims, r)``: combine ``x`` over ``dims`` with builtin reducer ``r``;
    the result keeps the other dims. Shorthand for a reduce region whose seed is
    the reducer's identity and whose update is ``s = merge(s, x.at(h))``."""
    if dims is None:
        raise CaptureError("reduce(x, dims, reducer) needs the dims to reduce")
    policy = dsl.as_reduction_policy(policy, "reduce(x, dims, reducer, policy=...)")
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
    return Dim.fresh((d.label or "d") + "'", dsl.made_here(f"a copy of dim '{d.describe()}'"))


def _rename_dim(x: Tile, old: Dim, new: Dim) -> Tile:
    """``x`` with dim ``old`` retyped to identity ``new`` (a reindex)."""
    space = Space(tuple(DimFactor(new if f.dim == old else f.dim, f.extent)
                        for f in x.type.space.factors))
    vars_ = tuple(str(i) for i in range(x.rank))
    return dsl._emit("reindex", [x], {"vars": vars_, "map": tuple(E.Var(v) for v in vars_)},
                     (TileType(x.dtype, space),))[0]


def scan(x: Tile, axis: Any, reducer: Any = "add",
         policy: ReductionPolicy | str = ReductionPolicy.fold_left) -> Tile:
    """Inclusive scan along ``axis``. ``fold_left``: each prefix is the strict left
    fold (a serial region carrying the running state); ``ordered_tree``: every
    prefix is an ordered-tree reduction of its leaves (regrouping allowed, order
    kept; quadratic work, which keeps the whole admitted set visible)."""
    name = _reducer_of(reducer)
    b = BUILTINS[name]
    policy = dsl.as_reduction_policy(policy, "scan(policy=...)")
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


def cumsum(x: Tile, axis: Any, policy: ReductionPolicy | str = ReductionPolicy.fold_left
           ) -> Tile:
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


def while_loop(inits: Sequence[Tile], cond: Callable[[list[Tile]], Tile],
               body: Callable[[list[Tile]], Sequence[Tile]], label: str = "w") -> list[Tile]:
    """Build a ``while`` op programmatically (the library form of ``while
    tn.while_(...)``): ``cond(states)`` is the bool scalar evaluated before each
    iteration, ``body(states)`` the next states; returns the final states."""
    c = ctx()
    blocks = []
    for i, fn in enumerate((cond, body)):
        blk = BBlock([BValue(t.type, f"{label}_s{j}") for j, t in enumerate(inits)])
        c.builder.push(blk)
        c.frames.append(ScopeFrame("while", None, blk, c.level))
        try:
            states = [Tile(a) for a in blk.args]
            if i == 0:
                cv = fn(states)
                if not cv.type.is_scalar or not cv.dtype.is_bool:
                    raise TypeCheckError("library while condition must be a bool scalar")
                c.builder.op("yield", [cv.v])
            else:
                outs = list(fn(states))
                for o, t in zip(outs, inits, strict=True):
                    if o.type != t.type:
                        raise TypeCheckError("library while loop changes a state's type")
                c.builder.op("yield", [o.v for o in outs])
        finally:
            c.frames.pop()
            c.builder.pop()
        blocks.append(blk)
    op = c.builder.op("while", [t.v for t in inits], {}, regions=blocks,
                      result_types=tuple(t.type for t in inits))
    return [Tile(r) for r in op.results]


def _before(av: Tile, ai: Tile, bv: Tile, bi: Tile, descending: bool) -> Tile:
    """Whether element ``(av, ai)`` (value, source index) sorts strictly before
    ``(bv, bi)`` in the stable total order of R-15: numeric order (reversed when
    ``descending``), ``-0.0`` tied with ``+0.0``, every NaN after every number,
    NaNs tied, ties broken by the lower source index. Strict and total on
    distinct source indices."""
    num = (av > bv) if descending else (av < bv)
    if av.dtype.is_float:
        an, bn = dsl._unary("isnan", av), dsl._unary("isnan", bv)
        num = num | (~an & bn)
        tie = (av == bv) | (an & bn)
    else:
        tie = av == bv
    return num | (tie & (ai < bi))


def _merge_sort(x: Tile, d: Dim, descending: bool) -> tuple[Tile, Tile]:
    """Stable bottom-up merge sort of ``x`` along ``d``: ``(values, source
    indices)``, both in ``x``'s space.

    Pass ``p`` (run width ``w = 2**p``, while ``w < n``) merges each pair of
    adjacent sorted runs ``A = [b, b+w)``, ``B = [b+w, b+2w)`` (``b`` a multiple of
    ``2w``; the last runs may be short or ``B`` empty). Every output position
    ``t`` (local ``u = t - b``) finds its source by itself, so a pass is a
    gather: ``l`` = how many of the first ``u`` outputs come from ``A`` is the
    largest ``l <= min(u, |A|)`` with ``l == 0`` or ``A[l-1]`` before ``B[u-l]``
    (``B`` past its end counting as after everything) -- a predicate that holds
    on a prefix of ``l`` values, found by binary lifting over the steps ``w, w/2,
    ..., 1``; output ``u`` is then ``A[l]`` if that exists and comes before
    ``B[u-l]`` (or ``B`` is exhausted), else ``B[u-l]``. Because the order is a
    strict total order on (value, source index), the merge is exactly the
    stable merge, and the whole sort equals the stable sort of R-15.

    Work: ``ceil(log2 n)`` passes of ``log2(w) + 1`` lifting steps, each a
    fixed number of elementwise ops and gathers over ``n`` elements:
    ``O(n log^2 n)`` operations on tiles of ``x``'s size (no ``n x n`` tile)."""
    I = D.INDEX
    space = x.type.space
    ax = space.index(d)
    n = space.extent_of(d)
    shp = dsl.space_shape(space)
    nv = dsl.Index(n).value(I)
    last = nv - 1
    fb = 0.0 if x.dtype.is_float else (False if x.dtype.is_bool else 0)

    def clamp(i: Tile) -> Tile:
        """``i`` clamped into ``[0, n)`` (positions a lifting step may probe past a
        run's end are masked by the step's own condition)."""
        return dsl._binary("maximum", dsl._binary("minimum", i, last), dsl.scalar(0, I))

    def take(v: Tile, ix: Tile, at: Tile) -> tuple[Tile, Tile]:
        return dsl.gather(v, at, ax, fb), dsl.gather(ix, at, ax, 0)

    def merge_pass(st: list[Tile]) -> list[Tile]:
        vals, idx, w = st
        t = dsl.iota(shp, ax, I)
        w2 = w * 2
        base = (t // w2) * w2
        u = t - base
        len_a = dsl._binary("minimum", w, nv - base)
        len_b = dsl._binary("maximum", dsl._binary("minimum", w, nv - base - w),
                            dsl.scalar(0, I))
        hi = dsl._binary("minimum", u, len_a)

        def lift(s2: list[Tile]) -> list[Tile]:
            lo, step = s2
            cand = lo + step
            av, ai = take(vals, idx, clamp(base + cand - 1))
            bl = u - cand
            bv, bi = take(vals, idx, clamp(base + w + bl))
            ok = (cand <= hi) & ((bl >= len_b) | _before(av, ai, bv, bi, descending))
            return [dsl.ite(ok, cand, lo), step // 2]

        l, _ = while_loop([dsl.zeros(I, shp, dims=space.dims), w],
                          lambda s2: s2[1] > 0, lift, label="lift")
        ja, jb = base + l, base + w + (u - l)
        av, ai = take(vals, idx, clamp(ja))
        bv, bi = take(vals, idx, clamp(jb))
        from_a = (l < len_a) & (((u - l) >= len_b) | _before(av, ai, bv, bi, descending))
        return [dsl.ite(from_a, av, bv), dsl.ite(from_a, ai, bi), w2]

    idx0 = dsl.iota(shp, ax, I)
    vals, idx, _ = while_loop([x, idx0, dsl.scalar(1, I)], lambda st: st[2] < nv, merge_pass,
                              label="merge")
    return vals, idx


def sort(x: Tile, axis: Any, descending: bool = False, k: int | None = None
         ) -> tuple[Tile, Tile]:
    """Stable sort along ``axis`` (NaN last, ties by original index); returns
    ``(values, source_indices)`` whose sorted axis is a fresh dim ``rank`` in the
    place of ``axis``. With ``k``, only the first ``k`` (top-k): ``k`` is a
    compile-time integer, ``0 <= k <= extent`` -- checked at capture when the
    extent is a constant, made an assumption of the kernel (checked when a call
    binds the extent) when it is an expression of kernel parameters, and a
    bounds check of the selecting reindex at run time otherwise."""
    d = _axis_dim(x, axis)
    n = x.type.space.extent_of(d)
    if k is not None:
        import numbers

        if not isinstance(k, numbers.Integral) or isinstance(k, bool) or k < 0:
            raise CaptureError(f"top-k needs a non-negative integer k, got {k!r}",
                               hint="k is a compile-time constant")
        k = int(k)
        if isinstance(n, E.Const):
            if k > n.value:
                raise TypeCheckError(f"top-k with k={k} > extent {n.value} of "
                                     f"'{d.describe()}'",
                                     hint="k counts selected elements; it cannot exceed "
                                          "the extent")
        elif all(isinstance(lf, E.Sym) for lf in E.leaves(n)):
            c = ctx()
            fact = E.cmp("<=", E.Const(k), n)
            if fact not in c.assumptions:
                c.assumptions.append(fact)
        # an extent over region coordinates or runtime values cannot be a kernel
        # assumption: the bare reindex that takes the first k below reads outside
        # the sorted tile when k > extent, which is a bounds error at run time
    vals, src = _merge_sort(x, d, descending)
    kk = n if k is None else E.Const(k)
    dr = Dim.fresh("rank", dsl.made_here("the sorted axis made by tn.sort/tn.topk"))
    out_space = Space(tuple(DimFactor(dr, kk) if f.dim == d else f
                            for f in x.type.space.factors))
    vars_ = tuple(str(i) for i in range(x.rank))
    m = tuple(E.Var(v) for v in vars_)

    def retype(t: Tile) -> Tile:
        return dsl._emit("reindex", [t], {"vars": vars_, "map": m},
                         (TileType(t.dtype, out_space),))[0]

    return retype(vals), dsl.cast(retype(src), D.i64)


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
        raise CaptureError(f"reducer '{name}' has {len(dts)} state component(s) but "
                           f"{len(ids)} identity value(s)",
                           hint="give one identity per state component: identity=(e_1, ..., e_k) "
                           "for dtype=(T_1, ..., T_k)")

    def stage(fn: Callable[..., Any], arg_types: Sequence[DType], what: str) -> BBlock:
        blk = BBlock([BValue(TileType(t, Space()), f"a{i}") for i, t in enumerate(arg_types)])
        c.builder.push(blk)
        try:
            out = fn(*(Tile(a) for a in blk.args))
            outs = out if isinstance(out, tuple) else (out,)
            if len(outs) != len(dts):
                raise CaptureError(
                    f"the {what} of reducer '{name}' returns {len(outs)} value(s), but its "
                    f"state has {len(dts)} component(s)",
                    hint="return one value per state component (a tuple for k > 1); a "
                    "merge takes (a_1..a_k, b_1..b_k)")
            vals = [dsl._as_tile(o, t) for o, t in zip(outs, dts, strict=True)]
            c.builder.op("yield", [v.v for v in vals])
        finally:
            c.builder.pop()
        return blk

    merge_b = stage(merge, dts + dts, "merge")
    lift_b = stage(lift, dts, "lift") if lift is not None else None
    if name in c.reducer_names:
        raise CaptureError(f"duplicate reducer name '{name}'")
    r = CustomReducer(name, dts, ids, merge_b, lift_b, associative, commutative)
    c.reducers.append(r)
    c.reducer_names.add(name)
    return r
