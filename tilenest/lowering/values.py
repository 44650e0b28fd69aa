"""Lowering of the pure value ops (``semantics/ops/values.py``).

Elementwise ops, constants, index tiles and views become lazy handles: the
element ``f(v0, ..., vn)[q]`` is the scalar op applied to each operand's
element at ``q`` projected onto its dims (the lifting rule; a missing dim
broadcasts). Whether a lazy value is then kept lazy or materialized is the
storage plan's decision (``schedule.storage_plan``), never the rule's.

``reindex`` reads ``x[f(q)]``; a source coordinate that cannot be proved
inside ``x`` is clamped and checked (the interpreter's ``BoundsError``).
``mma`` materializes its result: ``acc[q] += conv(a[q,k]) * conv(b[q,k])`` with
the contraction points in lexicographic order for every output element, in
the register-blocked loop nest of ``mma.py``; with ``allow_reassociation`` the
update may use a fused multiply-add. ``put`` copies the target and overwrites
the patch (checked to lie inside), ``gather`` substitutes its fallback for an
index outside the source.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from ..errors import TilenestError
from ..semantics import numerics as N
from ..semantics import dtypes as D
from ..semantics import expr as E
from ..semantics.ir import Operation
from ..semantics.ops.values import BINARY, COMPARE, UNARY, mma_roles
from ..semantics.policies import Bounds
from ..semantics.types import TileType
from . import loopir as L
from .core import Lowerer, rule, unsupported
from .handles import BufH, Index, LazyH, VarH, const_handle, linear, project, union_reads
from .mma import MMA_UNITS, Clamp, Edges, TensorPlan, contract, tensor_contract, tensor_plan


#: i64 operations whose result is an index expression when their operands
#: are: the extremes (exact), and the ring operations, which wrap in 64-bit
#: two's complement exactly as index arithmetic is evaluated
INDEX_EXACT = {"minimum": E.minimum, "maximum": E.maximum, "add": E.add,
               "sub": lambda a, b: E.add(a, E.mul(-1, b)), "mul": E.mul}


def _index_operand(a: L.Expr) -> E.Expr | None:
    """``a`` as an index expression: an ``IExpr``'s own, an i64 literal's
    value; else None."""
    if isinstance(a, L.IExpr):
        return a.e
    if isinstance(a, L.Const) and a.dtype == L.INDEX:
        return E.Const(int(a.value))
    return None


def scalar_op(op: Operation, args: list[L.Expr], flags: frozenset[str]) -> L.Expr:
    """The loop-IR expression of elementwise ``op`` on scalar operands."""
    n = op.name
    rt = op.results[0].type.dtype
    if n in UNARY:
        return L.Un(n, args[0], rt, op.attr("ulp"))
    ix = [_index_operand(a) for a in args] if n in INDEX_EXACT and rt == L.INDEX else []
    if ix and all(e is not None for e in ix):
        # the least or greatest, sum, difference or product of index
        # expressions (or literals) is one with the same value, so code that
        # bounds by it (a loop's trip count, a clamp, a block's first key)
        # keeps index arithmetic the width proof can bound
        return L.IExpr(INDEX_EXACT[n](ix[0], ix[1]))
    if n in BINARY or n in COMPARE:
        return L.Bin(n, args[0], args[1], rt, flags)
    if n == "ite":
        return L.Select(args[0], args[1], args[2])
    if n == "cast":
        return args[0] if args[0].dtype == rt else L.Cast(args[0], rt, op.attrs.get("overflow"))
    if n == "bitcast":
        return args[0] if args[0].dtype == rt else L.Bitcast(args[0], rt)
    raise KeyError(n)


@rule(*UNARY, *BINARY, *COMPARE, "ite", "cast", "bitcast")
def _elementwise(lw: Lowerer, op: Operation) -> None:
    hs = [lw.handle(o) for o in op.operands]
    rt: TileType = op.results[0].type
    # integer and bool merges are exact in any order: they need no permission
    reassoc = op.oid in lw.reassoc and rt.dtype.is_float
    flags = frozenset({"reassoc"}) if reassoc else frozenset()

    def fn(lw_: Lowerer, q: Index) -> L.Expr:
        return scalar_op(op, [h.at(lw_, project(q, h.dims)) for h in hs], flags)

    def gfn(q: Index) -> list[E.Pred]:
        out: list[E.Pred] = []
        for h in hs:
            out.extend(h.guards(project(q, h.dims)))
        return out

    lw.define(op.results[0], LazyH(rt.dtype, rt.dims, lw.extents(rt), fn, gfn, union_reads(*hs)))


def constant(value: object, dt: D.DType) -> L.Const:
    """A literal of ``dt`` with the interpreter's rounding (``numerics.constant``)."""
    v = N.constant(value, dt).item()
    if dt.name == "bf16" or dt.name == "f16":
        v = float(v)
    return L.Const(v, dt)


@rule("const")
def _const(lw: Lowerer, op: Operation) -> None:
    rt: TileType = op.results[0].type
    lw.define(op.results[0], const_handle(constant(op.attrs["value"], rt.dtype), rt.dims,
                                          lw.extents(rt)))


@rule("index")
def _index(lw: Lowerer, op: Operation) -> None:
    rt: TileType = op.results[0].type
    value = lw.ix(op.attrs["value"])
    vars_ = op.attrs["vars"]

    def fn(lw_: Lowerer, q: Index) -> L.Expr:
        m = {E.Var(v): q[d] for v, d in zip(vars_, rt.dims, strict=True)}
        x: L.Expr = L.IExpr(E.subst(value, m))
        return x if rt.dtype == L.INDEX else L.Cast(x, rt.dtype)

    lw.define(op.results[0], LazyH(rt.dtype, rt.dims, lw.extents(rt), fn, cheap=True))


@rule("broadcast", "per")
def _broadcast(lw: Lowerer, op: Operation) -> None:
    x = lw.handle(op.operands[0])
    rt: TileType = op.results[0].type
    lw.define(op.results[0], LazyH(rt.dtype, rt.dims, lw.extents(rt),
                                   lambda lw_, q: x.at(lw_, project(q, x.dims)),
                                   lambda q: x.guards(project(q, x.dims)), x.reads, cheap=True))


@rule("permute")
def _permute(lw: Lowerer, op: Operation) -> None:
    x = lw.handle(op.operands[0])
    rt: TileType = op.results[0].type
    lw.define(op.results[0], LazyH(rt.dtype, rt.dims, lw.extents(rt), x.at, x.guards, x.reads,
                                   cheap=True))


def checked_coords(lw: Lowerer, coords: list[E.Expr], extents: tuple[E.Expr, ...],
                   code: Callable[[], int]) -> list[E.Expr]:
    """``coords`` when the facts prove them inside ``extents``; otherwise clamped
    into the box, with a check raising error ``code`` where they are outside."""
    preds: list[E.Pred] = []
    for c, n in zip(coords, extents, strict=True):
        preds += [c.ge(0), c.lt(n)]
    g = lw.guard_of(preds)
    if g is None:
        return coords
    lw.check(g.p, code())
    return [E.maximum(E.minimum(c, n - 1), 0) for c, n in zip(coords, extents, strict=True)]


@rule("reindex")
def _reindex(lw: Lowerer, op: Operation) -> None:
    x = lw.handle(op.operands[0])
    rt: TileType = op.results[0].type
    vars_ = op.attrs["vars"]
    maps = [lw.ix(m) for m in op.attrs["map"]]
    code = lw.lazy_error("out of bounds", f"reindex %{op.results[0].name} reads outside its "
                         f"source %{op.operands[0].name}", op.loc)

    def coords(q: Index) -> Index:
        m = {E.Var(v): q[d] for v, d in zip(vars_, rt.dims, strict=True)}
        return {d: E.subst(e, m) for d, e in zip(x.dims, maps, strict=True)}

    def fn(lw_: Lowerer, q: Index) -> L.Expr:
        c = coords(q)
        safe = checked_coords(lw_, [c[d] for d in x.dims], x.extents, code)
        return x.at(lw_, dict(zip(x.dims, safe, strict=True)))

    lw.define(op.results[0], LazyH(rt.dtype, rt.dims, lw.extents(rt), fn,
                                   lambda q: x.guards(coords(q)), x.reads, cheap=True))


@rule("reshape")
def _reshape(lw: Lowerer, op: Operation) -> None:
    x = lw.handle(op.operands[0])
    rt: TileType = op.results[0].type
    ext = lw.extents(rt)

    def coords(q: Index) -> Index:
        lin = linear(ext, [q[d] for d in rt.dims])
        out: dict = {}
        for i in range(len(x.dims) - 1, -1, -1):
            n = x.extents[i]
            out[x.dims[i]] = lin % n if i else lin
            lin = lin // n
        return out

    lw.define(op.results[0], LazyH(rt.dtype, rt.dims, ext, lambda lw_, q: x.at(lw_, coords(q)),
                                   lambda q: x.guards(coords(q)), x.reads, cheap=True))


@rule("map")
def _map(lw: Lowerer, op: Operation) -> None:
    hs = [lw.handle(o) for o in op.operands]
    body = op.regions[0]
    rts = [r.type for r in op.results]

    def result(i: int):
        def fn(lw_: Lowerer, q: Index) -> L.Expr:
            args = [const_handle(h.at(lw_, project(q, h.dims))) for h in hs]
            lw_.expr_mode += 1
            try:
                outs = lw_.lower_block(body, args)
            finally:
                lw_.expr_mode -= 1
            return outs[i].at(lw_, {})
        return fn

    def gfn(q: Index) -> list[E.Pred]:
        out: list[E.Pred] = []
        for h in hs:
            out.extend(h.guards(project(q, h.dims)))
        return out

    for i, r in enumerate(op.results):
        rt = rts[i]
        lw.define(r, LazyH(rt.dtype, rt.dims, lw.extents(rt), result(i), gfn, union_reads(*hs)))


# ---------------------------------------------------------------------------
# materializing ops


def _writable(lw: Lowerer, op: Operation, i: int) -> BufH | None:
    """Operand ``i``'s buffer when ``op`` may overwrite it in place: the operand
    is materialized, used only here, and defined at the same loop depth."""
    v = op.operands[i]
    h = lw.handle(v)
    if (isinstance(h, BufH) and lw.uses.get(v.name, 0) == 1 and v.name not in lw.frozen
            and lw.def_depth.get(v.name, -1) == lw.depth):
        return h
    return None


@rule("mma")
def _mma(lw: Lowerer, op: Operation) -> None:
    a, b, c = (lw.handle(o) for o in op.operands)
    at, bt, ct = (o.type for o in op.operands)
    roles = mma_roles(at, bt, ct)
    dt = ct.dtype
    res = _writable(lw, op, 2)
    in_place = res is not None
    if res is None:
        ext = lw.extents(ct)
        res = BufH(lw.local(op.results[0].name, dt, ext), ct.dims, ext)
    fuse = bool(op.attrs["allow_reassociation"]) and lw.sched.fma and dt.is_float
    ext_of = dict(zip(at.dims, a.extents, strict=True)) | dict(zip(bt.dims, b.extents,
                                                                  strict=True))

    def conv(x: L.Expr, src: D.DType) -> L.Expr:
        return x if src == dt else L.Cast(x, dt)

    def update(q: Index) -> None:
        qa, qb, qc = project(q, at.dims), project(q, bt.dims), project(q, ct.dims)
        pa = conv(a.at(lw, qa), at.dtype)
        pb = conv(b.at(lw, qb), bt.dtype)
        off = L.IExpr(res.offset(qc))
        old = L.Load(res.buf, off)
        if fuse:
            new: L.Expr = L.Fma(pa, pb, old)
        else:
            new = L.Bin("add", old, L.Bin("mul", pa, pb, dt), dt)
        lw.emit(L.Store(res.buf, off, new))

    def settle(qc: Index) -> None:
        off = L.IExpr(res.offset(qc))
        lw.emit(L.Store(res.buf, off, L.Bin("add", L.Load(res.buf, off), constant(0, dt), dt)))

    plan = _mma_unit(lw, op, a, b, res, roles, ext_of)
    # a warpgroup mma starts a zero accumulator itself (WarpMma.fresh)
    fresh = (not in_place and isinstance(plan, TensorPlan) and plan.group == 4
             and not plan.batch and _is_zero(lw, c, ct))
    if not in_place and not fresh:
        lw.store_into(c, res)
    if isinstance(plan, TensorPlan):
        tensor_contract(lw, res, plan, fresh)
    else:
        clamp = _padding_clamp(lw, op, a, b, roles, ext_of)
        edges = _edges(lw, op, res, ct.dims) if in_place else None
        if contract(lw, res, roles, ext_of, update, op.loc,
                    clamp and Clamp(clamp[0], clamp[1], settle), edges) and edges:
            acc = lw.accums[op.oid]
            if edges.fill is not None:
                lw.folded.add((acc.loop.oid, acc.position))
            if edges.store is not None:
                lw.folded_stores[acc.store.oid] = lw.steps[acc.loop.oid][2]
    lw.env[op.results[0].name] = res
    lw.def_depth[op.results[0].name] = lw.depth


def _is_zero(lw: Lowerer, c: Any, ct: TileType) -> bool:
    """Whether the accumulator operand ``c`` is +0.0 everywhere (``tn.zeros``):
    a cheap lazy value (a constant or its broadcast: building its element
    emits nothing) whose element at a symbolic index is the literal +0.0."""
    if not (isinstance(c, LazyH) and c.cheap) or not ct.dtype.is_float:
        return False
    q = {d: E.Var(f"zero.{i}") for i, d in enumerate(ct.dims)}
    x = c.at(lw, q)
    return isinstance(x, L.Const) and x.value == 0 and math.copysign(1.0, x.value) > 0


def _edges(lw: Lowerer, op: Operation, res: BufH, dims: tuple) -> Edges | None:
    """The fill and the store that an ``mma`` updating its loop's carried
    tile in place may fold into its micro-kernels (``accumulators.py``), or
    None: ``res`` is the carried tile, the loop's steps are known and
    nothing is left to fold."""
    from .memory import bounds_kind, store_elements

    acc = lw.accums.get(op.oid)
    steps = lw.steps.get(acc.loop.oid) if acc is not None else None
    if steps is None:
        return None
    first, last, _ = steps
    fill = store = None
    if acc.fill is not None:
        value = constant(acc.fill, res.dtype)

        def fill(q: Index) -> None:
            lw.emit(L.Store(res.buf, L.IExpr(res.offset(project(q, dims))), value))
    if acc.store is not None and bounds_kind(lw, acc.store) is not Bounds.checked:
        body = store_elements(lw, acc.store, res)[0]

        def store(q: Index) -> None:
            body(project(q, dims))
    if fill is None and store is None:
        return None
    return Edges(first, fill, last, store)


def _padding_clamp(lw: Lowerer, op: Operation, a: Any, b: Any, roles: dict,
                   ext_of: dict) -> tuple[dict, E.Pred] | None:
    """The contraction extents past which both operands are zero padding, and
    the condition that some padding is skipped; None when nothing is known.

    Where both ``a`` and ``b`` hold exactly ``+0`` (``BufH.zero_from``: the
    copies of ``bounds.zero`` reads past the tensors' edge) every product is
    ``+0``. Dropping them and adding one ``+0`` instead (``Clamp.settle``)
    gives the same value bit for bit: ``x + 0 = x`` except ``-0 + 0 = +0``,
    and a sum with a ``+0`` term is never ``-0``. Without reassociation the
    skipped products must come last in the contraction order, so there only
    a single contraction dim is clamped. The operand copies must be made at
    the ``mma``'s loop depth (their bounds name the variables in scope)."""
    red = list(roles["contraction"])
    if not op.attrs["allow_reassociation"] and len(red) != 1:
        return None
    names = [o.name for o in op.operands[:2]]
    if not all(isinstance(h, BufH) and h.zero_from for h in (a, b)) or any(
            lw.def_depth.get(n, -1) != lw.depth for n in names):
        return None
    ext = {}
    skipped = []
    for d in red:
        if d in a.zero_from and d in b.zero_from:
            live = E.maximum(E.Const(0), E.maximum(a.zero_from[d], b.zero_from[d]))
            ext[d] = E.minimum(ext_of[d], live)
            skipped.append(ext[d].lt(ext_of[d]))
    if not ext:
        return None
    return ext, E.por(*skipped)


def _mma_unit(lw: Lowerer, op: Operation, a: Any, b: Any, res: BufH, roles: dict,
              ext_of: dict) -> Any:
    """The schedule's ``mma_unit`` decision for ``op``: a tensor-core plan, or
    the reason for SIMT (``mma.tensor_plan``; ``"tensor"`` and ``"wgmma"``
    require the plan)."""
    unit = lw.sched.mma_unit
    if unit not in MMA_UNITS:
        raise TilenestError(f"schedule field mma_unit={unit!r} is not one of "
                            f"{', '.join(MMA_UNITS)}", op.loc, "mma_unit='auto'")
    if unit == "simt" or (unit == "auto" and not lw.profile.tensor_cores):
        return None
    plan = tensor_plan(lw, op, a, b, res, roles, ext_of)
    if isinstance(plan, str):
        if unit in ("tensor", "wgmma"):
            raise TilenestError(f"mma_unit={unit!r}: this mma cannot run on tensor cores: {plan}",
                                op.loc, "use mma_unit='auto' (SIMT where tensor cores do not "
                                "apply) or change the tile")
        lw.emit(L.Comment(f"mma on the SIMT units: {plan}"))
    return plan


@rule("put")
def _put(lw: Lowerer, op: Operation) -> None:
    x, p = lw.handle(op.operands[0]), lw.handle(op.operands[1])
    rt: TileType = op.results[0].type
    res = lw.put_into.get(op.oid) or _writable(lw, op, 0)
    if res is None:
        res = lw.materialize(x, op.results[0].name)
        if res is x or isinstance(res, VarH):
            ext = lw.extents(rt)
            res2 = BufH(lw.local(op.results[0].name, rt.dtype, ext), rt.dims, ext)
            lw.store_into(x, res2)
            res = res2
    origin = [lw.ix(o) for o in op.attrs["origin"]]
    code = lw.lazy_error("out of bounds", f"put writes outside the target tile "
                         f"%{op.operands[0].name}", op.loc)
    pt = op.operands[1].type

    def body(u: Index) -> None:
        coords = [o + u[d] for o, d in zip(origin, pt.dims, strict=True)]
        preds: list[E.Pred] = []
        for cc, n in zip(coords, res.extents, strict=True):
            preds += [cc.ge(0), cc.lt(n)]
        g = lw.guard_of(preds)
        if g is not None:
            lw.check(g.p, code())
        off = L.IExpr(res.offset(dict(zip(res.dims, coords, strict=True))))
        lw.emit(L.Store(res.buf, off, p.at(lw, u), g))

    lw.nest(p.dims, p.extents, body)
    lw.env[op.results[0].name] = res
    lw.def_depth[op.results[0].name] = lw.depth


@rule("gather")
def _gather(lw: Lowerer, op: Operation) -> None:
    x = lw.materialize(lw.handle(op.operands[0]), op.operands[0].name)
    idx = lw.handle(op.operands[1])
    xt: TileType = op.operands[0].type
    rt: TileType = op.results[0].type
    ax = op.attrs["axis"]
    fb = constant(op.attrs["fallback"], xt.dtype)
    if not isinstance(x, BufH):
        raise unsupported(op, lw.target, "gather from a scalar")

    def fn(lw_: Lowerer, q: Index) -> L.Expr:
        i = L.Cast(idx.at(lw_, project(q, idx.dims)), L.INDEX) \
            if idx.dtype != L.INDEX else idx.at(lw_, project(q, idx.dims))
        n = x.extents[ax]
        valid = L.Bin("and", L.Bin("ge", i, L.Const(0, L.INDEX), D.bool_),
                      L.Bin("lt", i, L.IExpr(n), D.bool_), D.bool_)
        coords = {d: (E.Const(0) if k == ax else q[d]) for k, d in enumerate(x.dims)}
        stride: E.Expr = E.Const(1)
        for m in x.extents[ax + 1:]:
            stride = stride * m
        off = L.Bin("add", L.IExpr(x.offset(coords)),
                    L.Bin("mul", L.Select(valid, i, L.Const(0, L.INDEX)), L.IExpr(stride),
                          L.INDEX), L.INDEX)
        return L.Select(valid, L.Load(x.buf, off), fb)

    lw.define(op.results[0], LazyH(rt.dtype, rt.dims, lw.extents(rt), fn, None,
                                   union_reads(x, idx)))
