"""Meaning of the pure value ops (``semantics/ops/values.py``).

Elementwise ops follow the lifting rule: operands are laid out over the
result's dims by identity (missing dims broadcast) and the scalar function of
``semantics/numerics.py`` is applied pointwise. ``reindex`` reads ``x[f(q)]`` and rejects
a source coordinate outside ``x``; ``gather`` substitutes its fallback for an
invalid index; ``put`` replaces one block (its footprint is recorded for the
join of ancestor updates); ``mma`` converts its inputs to the accumulator dtype
and accumulates over the contraction dims -- in source order unless
reassociation is allowed and the interpreter runs in ``fast`` mode.
"""

from __future__ import annotations

import itertools
import string
from typing import Any, Callable

import numpy as np

from ..errors import BoundsError, RuntimeSemanticError
from ..semantics.ir import Operation
from ..semantics.ops.values import BINARY, COMPARE, UNARY, mma_roles
from ..semantics.types import TileType
from ..semantics import numerics as N
from . import fastmath
from . import shadow as S
from .core import Interpreter, rule
from .runtime import RV, align, eval_exprs


def _ty(v: Any) -> TileType:
    return v.type


def operands_on(it: Interpreter, op: Operation) -> tuple[list[np.ndarray], int]:
    """Operands laid out over the result's dims, lifted to a common batch rank."""
    res = op.results[0].type
    rvs = [it.val(o) for o in op.operands]
    nb = max(r.nb for r in rvs)
    return [align(r, o.type.dims, res.dims, nb) for r, o in zip(rvs, op.operands, strict=True)], nb


def shadowed(it: Interpreter, rvs: list[RV]) -> bool:
    """Whether the oracle must bound this op's result (some operand is inexact)."""
    return it.opts.oracle and any(r.lo is not None for r in rvs)


def bounds_on(it: Interpreter, op: Operation, nb: int) -> list[tuple[np.ndarray, ...]]:
    """Operand shadows ``(lo, hi, nan)`` laid out like :func:`operands_on`."""
    res = op.results[0].type
    out = []
    for o in op.operands:
        r = it.val(o)
        out.append(tuple(align(r, o.type.dims, res.dims, nb, b) for b in r.shadow()))
    return out


def _settled(out: RV, name: str, dt: Any, ulp: float, xs: list[np.ndarray],
             ins: list[tuple], res: tuple, declared: bool = False) -> RV:
    """``out`` with the shadow ``res`` of an elementwise op, except where every
    operand element is one value (a point or NaN alone): the op is then computed
    exactly -- the canonical value, or its ulp ball (V-14). An op that reads a
    NaN's sign or bits (``signbit``, ``bitcast``) is not exact on NaN alone, whose
    sign and payload are free. Without any remaining freedom the value is exact."""
    shape = out.a.shape
    single = np.ones(shape, dtype=bool)
    for p in ins:
        one = S.singleton(p)
        if name in ("signbit", "bitcast"):
            one = one & ~S.nan_only(p)
        single = single & np.broadcast_to(one, shape)
    if ulp > 0:
        with np.errstate(all="ignore"):
            pin = S.within_ulp(N.unrounded(name, dt, *xs), out.a, dt, ulp, declared)
    else:
        pin = S.point_of(out.a)
    pin = tuple(np.broadcast_to(b, shape) for b in pin)
    if bool(np.all(single)) and (ulp == 0 or bool(np.all(S.singleton(pin)))):
        return out
    return out.with_bounds(*(np.where(single, q, np.broadcast_to(r, shape))
                             for q, r in zip(pin, res, strict=True)))


def _into(it: Interpreter, op: Operation, xs: list[np.ndarray],
          dead: list[np.ndarray | None]) -> np.ndarray | None:
    """An array the elementwise result of ``op`` may be written into: the array
    ``dead[i]`` of an operand read here for the last time (``it.reusable``,
    taken before the operands ``xs`` were laid out) whose laid-out operand
    ``xs[i]`` is that array itself with the result's shape and dtype (not
    broadcast, not transposed), reshaped to it; None when there is none."""
    shape = np.broadcast_shapes(*(x.shape for x in xs))
    want = op.result.type.dtype.np
    for a, x in zip(dead, xs, strict=True):
        if (a is not None and a.dtype == want and x.shape == shape and x.size == a.size
                and a.flags.c_contiguous and x.flags.c_contiguous
                and x.ctypes.data == a.ctypes.data):
            a.shape = shape  # nothing else holds it (it.reusable)
            return a
    return None


@rule(*UNARY)
def _unary(it: Interpreter, op: Operation) -> None:
    dead = [it.reusable(op.operands[0])]
    (x,), nb = operands_on(it, op)
    dt = op.operands[0].type.dtype
    # numerics.unary's bits, faster
    out = RV(fastmath.unary(op.name, x, dt, out=_into(it, op, [x], dead)), nb)
    declared = op.attr("ulp") is not None
    ulp = N.ulp_bound(op.name, dt, op.attr("ulp"))
    if shadowed(it, [it.val(op.operands[0])]):
        ins = bounds_on(it, op, nb)
        res = S.unary(op.name, ins[0], op.result.type.dtype, ulp)
        out = _settled(out, op.name, dt, ulp, [x], ins, res, declared)
    elif it.opts.oracle and ulp > 0:
        _ulp_bounds(out, op.name, dt, ulp, [x], declared)
    it.set(op.result, out)


def _ulp_bounds(out: RV, name: str, dt: Any, ulp: float, xs: list[np.ndarray],
                declared: bool = False) -> None:
    """A function with an ulp bound on exact operands: its contract is that
    bound around the unrounded float64 value (``numerics.ulp_bound``), for every
    op and dtype, measured as ``shadow.within_ulp`` says (``declared``: the
    program stated the bound); the value stays exact where every element's
    contract is bitwise."""
    parts = S.within_ulp(N.unrounded(name, dt, *xs), out.a, dt, ulp, declared)
    if not np.all(S.singleton(parts)):
        out.with_bounds(*(np.broadcast_to(b, out.a.shape).copy() for b in parts))


@rule(*BINARY, *COMPARE)
def _binary(it: Interpreter, op: Operation) -> None:
    dead = [it.reusable(o) for o in op.operands]
    (a, b), nb = operands_on(it, op)
    dt = op.operands[0].type.dtype
    out = RV(N.binary(op.name, a, b, dt, out=_into(it, op, [a, b], dead)), nb)
    ulp = N.ulp_bound(op.name, dt)
    if shadowed(it, [it.val(o) for o in op.operands]):
        ins = bounds_on(it, op, nb)
        res = S.binary(op.name, ins[0], ins[1], dt)
        out = _settled(out, op.name, dt, ulp, [a, b], ins, res)
    elif it.opts.oracle and ulp > 0:
        _ulp_bounds(out, op.name, dt, ulp, [a, b])
    it.set(op.result, out)


@rule("ite")
def _ite(it: Interpreter, op: Operation) -> None:
    (c, a, b), nb = operands_on(it, op)
    out = RV(N.select(c, a, b), nb)
    if shadowed(it, [it.val(o) for o in op.operands]):
        ins = bounds_on(it, op, nb)
        out = _settled(out, "ite", None, 0.0, [], ins, S.select(*ins))
    it.set(op.result, out)


@rule("cast")
def _cast(it: Interpreter, op: Operation) -> None:
    x = it.val(op.operands[0])
    src, dst = op.operands[0].type.dtype, op.result.type.dtype
    overflow = op.attrs.get("overflow")
    res = N.cast(x.a, src, dst, overflow)
    out = RV(np.reshape(res, x.a.shape), x.nb)
    if shadowed(it, [x]):
        ins = [x.shadow()]
        out = _settled(out, "cast", None, 0.0, [], ins, S.cast(ins[0], src, dst, overflow))
    it.set(op.result, out)


@rule("bitcast")
def _bitcast(it: Interpreter, op: Operation) -> None:
    x = it.val(op.operands[0])
    out = RV(N.bitcast(x.a, op.operands[0].type.dtype, op.result.type.dtype), x.nb)
    if shadowed(it, [x]):
        ins = [x.shadow()]
        out = _settled(out, "bitcast", None, 0.0, [], ins, S.full_of(out.a.shape))
    it.set(op.result, out)


@rule("const")
def _const(it: Interpreter, op: Operation) -> None:
    t: TileType = op.result.type
    c = N.constant(op.attrs["value"], t.dtype)
    shape = tuple(it.extent(x) for x in t.extents)
    it.set(op.result, RV(np.broadcast_to(c, shape) if shape else c, 0))


@rule("per")
def _per(it: Interpreter, op: Operation) -> None:
    it.set(op.result, it.val(op.operands[0]))


@rule("index")
def _index(it: Interpreter, op: Operation) -> None:
    t: TileType = op.result.type
    shape = tuple(it.extent(x) for x in t.extents)
    (v,) = eval_exprs([op.attrs["value"]], it.ienv, it.nb, op.attrs["vars"], shape, it.values, it.index_from_inexact)
    v = np.asarray(v, dtype=np.int64)
    nb = it.nb
    if v.ndim < nb + len(shape):
        v = v.reshape((1,) * (nb + len(shape) - v.ndim) + v.shape)
    if all(n == 1 for n in v.shape[:nb]):
        v, nb = v.reshape(v.shape[nb:]), 0
    v = np.broadcast_to(v, v.shape[:nb] + shape)
    v = np.array(v)  # (ascontiguousarray would make a 0-d array 1-d)
    it.set(op.result, RV(v if t.dtype == _I64 else N.cast(v, _I64, t.dtype), nb))


def _batch_grids(shape: tuple[int, ...], nb: int, r: int) -> list[np.ndarray]:
    """Index grids for the batch axes of an array (size-1 axes index 0)."""
    out = []
    for k in range(nb):
        n = shape[k]
        out.append(np.arange(n).reshape((1,) * k + (n,) + (1,) * (nb - k - 1 + r)))
    return out


def gather_tile(arr: np.ndarray, nb: int, idx: list[Any], r_out: int) -> np.ndarray:
    """``arr[batch..., idx...]`` where ``idx`` broadcast over ``batch + out``."""
    return arr[tuple(_batch_grids(arr.shape, nb, r_out) + list(idx))]


def _active(it: Interpreter, shape: tuple[int, ...], r: int) -> np.ndarray | None:
    if it.lane_mask is None:
        return None
    m = it.lane_mask
    return m.reshape(m.shape + (1,) * (len(shape) - m.ndim)) if r else m


@rule("reindex")
def _reindex(it: Interpreter, op: Operation) -> None:
    x = it.val(op.operands[0])
    t: TileType = op.result.type
    out_shape = tuple(it.extent(e) for e in t.extents)
    nb = max(it.nb, x.nb)
    src = eval_exprs(op.attrs["map"], it.ienv, nb, op.attrs["vars"], out_shape, it.values, it.index_from_inexact)
    xs = x.tile_shape
    full = np.broadcast_shapes(*(np.shape(s) for s in src), (1,) * (nb + len(out_shape)))
    ok = np.ones(full, dtype=bool)
    for s, n in zip(src, xs, strict=True):
        ok &= (np.asarray(s) >= 0) & (np.asarray(s) < n)
    act = _active(it, full, len(out_shape))
    bad = ~ok if act is None else (~ok & act)
    if np.any(bad):
        k = tuple(int(i) for i in np.argwhere(bad)[0])
        coord = [int(np.broadcast_to(s, full)[k]) for s in src]
        raise BoundsError(
            f"reindex reads source coordinate {coord} outside the source extents {list(xs)} "
            f"(at result element {list(k[nb:])})", op.loc,
            "a bare reindex has no fill value; use tn.gather(..., fallback) or clamp the map")
    clipped = [np.clip(s, 0, n - 1) for s, n in zip(src, xs, strict=True)]
    out = RV(gather_tile(x.lift(nb), nb, clipped, len(out_shape)), nb)
    if shadowed(it, [x]):
        out.with_bounds(*(gather_tile(x.lift(nb, b), nb, clipped, len(out_shape))
                          for b in x.shadow()))
    it.set(op.result, out)


def _readable(a: np.ndarray, axis: int) -> np.ndarray:
    """``a`` with one element appended along ``axis`` when that axis is
    empty: an index tile over an empty axis has no valid index (every element
    takes the fallback, spec V-19), but the masked read of index 0 must still
    be a read of something."""
    if a.shape[axis]:
        return a
    pad = list(a.shape)
    pad[axis] = 1
    return np.concatenate([a, np.zeros(pad, a.dtype)], axis=axis)


@rule("gather")
def _gather(it: Interpreter, op: Operation) -> None:
    x, idx = it.val(op.operands[0]), it.val(op.operands[1])
    xt: TileType = op.operands[0].type
    it_t: TileType = op.operands[1].type
    rt: TileType = op.result.type
    ax = op.attrs["axis"]
    nb = max(x.nb, idx.nb)
    out_shape = tuple(it.extent(e) for e in rt.extents)
    r = len(out_shape)
    iv = align(idx, it_t.dims, rt.dims, nb).astype(np.int64)
    n = x.tile_shape[ax]
    coords: list[Any] = []
    for k, f in enumerate(xt.space.factors):
        if k == ax:
            coords.append(iv)
        else:
            p = rt.space.index(f.dim)
            coords.append(np.arange(out_shape[p]).reshape((1,) * (nb + p) + (out_shape[p],)
                                                         + (1,) * (r - p - 1)))
    valid = (iv >= 0) & (iv < n)
    coords[ax] = np.where(valid, iv, 0)
    a = _readable(x.lift(nb), nb + ax)
    got = gather_tile(a, nb, coords, r)
    fb = N.constant(op.attrs["fallback"], xt.dtype)
    vb = np.broadcast_to(valid, got.shape)
    out = RV(np.where(vb, got, fb), nb)
    if shadowed(it, [x, idx]):
        if idx.lo is not None:
            out.with_bounds(*S.full_of(got.shape))
        else:
            out.with_bounds(*(np.where(vb, gather_tile(_readable(x.lift(nb, b), nb + ax), nb,
                                                       coords, r), f)
                              for b, f in zip(x.shadow(), S.point_of(fb), strict=True)))
    it.set(op.result, out)


@rule("broadcast")
def _broadcast(it: Interpreter, op: Operation) -> None:
    x = it.val(op.operands[0])
    t: TileType = op.result.type
    a = align(x, op.operands[0].type.dims, t.dims, x.nb)
    shape = a.shape[:x.nb] + tuple(it.extent(e) for e in t.extents)
    out = RV(np.broadcast_to(a, shape), x.nb)
    if shadowed(it, [x]):
        out.with_bounds(*(np.broadcast_to(align(x, op.operands[0].type.dims, t.dims, x.nb, b),
                                          shape) for b in x.shadow()))
    it.set(op.result, out)


@rule("reshape")
def _reshape(it: Interpreter, op: Operation) -> None:
    x = it.val(op.operands[0])
    t: TileType = op.result.type
    shape = tuple(it.extent(e) for e in t.extents)
    if int(np.prod(shape)) != int(np.prod(x.tile_shape)):
        raise RuntimeSemanticError(f"reshape of {list(x.tile_shape)} to {list(shape)} changes "
                                   "the element count", op.loc)
    out = RV(np.ascontiguousarray(x.a).reshape(x.a.shape[:x.nb] + shape), x.nb)
    if shadowed(it, [x]):
        out.with_bounds(*(np.ascontiguousarray(b).reshape(x.a.shape[:x.nb] + shape)
                          for b in x.shadow()))
    it.set(op.result, out)


@rule("permute")
def _permute(it: Interpreter, op: Operation) -> None:
    x = it.val(op.operands[0])
    perm = list(range(x.nb)) + [x.nb + p for p in op.attrs["perm"]]
    out = RV(x.a.transpose(perm), x.nb)
    if shadowed(it, [x]):
        out.with_bounds(*(b.transpose(perm) for b in x.shadow()))
    it.set(op.result, out)


@rule("put")
def _put(it: Interpreter, op: Operation) -> None:
    x, p = it.val(op.operands[0]), it.val(op.operands[1])
    nb = max(x.nb, p.nb, it.nb)
    xs = x.tile_shape
    ps = p.tile_shape
    r = len(xs)
    origin = eval_exprs(op.attrs["origin"], it.ienv, nb, (), (), it.values, it.index_from_inexact)
    base = np.array(np.broadcast_to(x.lift(nb), it.bshape[:nb] + xs if nb else xs))
    grids = []
    for k, (o, m) in enumerate(zip(origin, ps, strict=True)):
        o = np.asarray(o).reshape(np.shape(o) + (1,) * r)
        u = np.arange(m).reshape((1,) * (nb + k) + (m,) + (1,) * (r - k - 1))
        grids.append(o + u)
    full = np.broadcast_shapes(base.shape[:nb] + ps, *(g.shape for g in grids))
    ok = np.ones(full, dtype=bool)
    for g, n in zip(grids, xs, strict=True):
        ok &= (g >= 0) & (g < n)
    act = _active(it, full, r)
    if np.any(~ok if act is None else (~ok & act)):
        raise BoundsError(f"put writes a {list(ps)} patch outside the {list(xs)} tile", op.loc,
                          "the patch's origin + extent must lie within the target tile")
    bg = _batch_grids(full, nb, r)
    sel = ok if act is None else ok & act
    idx = tuple(np.broadcast_to(g, full)[sel] for g in bg + grids)
    base[idx] = np.broadcast_to(p.lift(nb), full)[sel]
    out = RV(base, nb)
    if shadowed(it, [x, p]):
        bs = []
        for xb, pb in zip(x.shadow(), p.shadow(), strict=True):
            bb = np.array(np.broadcast_to(x.lift(nb, xb), base.shape), dtype=xb.dtype)
            bb[idx] = np.broadcast_to(p.lift(nb, pb), full)[sel]
            bs.append(bb)
        out.with_bounds(*bs)
    it.set(op.result, out)
    if it.track:
        d = it.track[-1][1]
        prev = d.get(op.operands[0].name)
        depth = it.track[-1][0]
        if it.anchor_depth(op) < depth and (prev is None or np.ndim(prev) == 0):
            # a collective put (E-11 item 2): the same patch in every child, one
            # update of the ancestor value; it touches nothing per child
            if prev is not None:
                d[op.result.name] = prev
            return
        m = np.zeros(base.shape, dtype=bool)
        m[idx] = True
        d[op.result.name] = m if prev is None else (m | prev)


_LETTERS = string.ascii_letters


@rule("mma")
def _mma(it: Interpreter, op: Operation) -> None:
    at, bt, ct = (o.type for o in op.operands)
    fast = it.opts.fast and op.attrs["allow_reassociation"]
    dead = it.reusable(op.operands[2]) if fast else None
    a, b, c = (it.val(o) for o in op.operands)
    roles = mma_roles(at, bt, ct)
    dt = ct.dtype
    nb = max(a.nb, b.nb, c.nb)
    A = N.cast(a.lift(nb), at.dtype, dt) if at.dtype != dt else a.lift(nb)
    B = N.cast(b.lift(nb), bt.dtype, dt) if bt.dtype != dt else b.lift(nb)
    C = c.lift(nb)
    if fast:
        if dead is not None:
            # the accumulator dies here: add the product into its array
            got = _accumulate(dead, C, A, B, at, bt, ct, roles, nb)
            if got is not None:
                it.set(op.result, RV(got, nb))  # no oracle bounds: reusable says so
                return
        wide = np.float32 if dt.name in ("f16", "bf16") else dt.np
        prod = product(A.astype(wide, copy=False), B.astype(wide, copy=False), at, bt, ct,
                       roles, nb)
        if wide != dt.np:
            prod = N.cast(prod, _wide_dt(dt), dt)
        prod = np.asarray(prod)
        # the product is this rule's own array: the sum may overwrite it
        into = prod if prod.shape == np.broadcast_shapes(C.shape, prod.shape) else None
        out = N.binary("add", C, prod, dt, out=into)
        it.set(op.result, _mma_shadow(it, op, RV(out, nb), a, b, c, roles, nb))
        return
    # reference order: contraction points in lexicographic order (dims of A)
    kdims = roles["contraction"]
    kext = [a.tile_shape[at.dims.index(d)] for d in kdims]
    acc = np.array(np.broadcast_to(C, np.broadcast_shapes(
        C.shape, _out_shape(A, B, at, bt, ct, nb, a, b))))
    for kidx in itertools.product(*(range(n) for n in kext)):
        sel_a = _select(A, at.dims, dict(zip(kdims, kidx, strict=True)), nb)
        sel_b = _select(B, bt.dims, dict(zip(kdims, kidx, strict=True)), nb)
        rest_a = [d for d in at.dims if d not in kdims]
        rest_b = [d for d in bt.dims if d not in kdims]
        pa = align(RV(sel_a, nb), rest_a, ct.dims, nb)
        pb = align(RV(sel_b, nb), rest_b, ct.dims, nb)
        acc = N.binary("add", acc, N.binary("mul", pa, pb, dt), dt)
    it.set(op.result, _mma_shadow(it, op, RV(acc, nb), a, b, c, roles, nb))


def _mma_shadow(it: Interpreter, op: Operation, out: RV, a: RV, b: RV, c: RV, roles: dict,
                nb: int) -> RV:
    """Bounds of every admitted mma result (spec V-22, R-8): a sum over the leaves
    ``c`` and the exact products ``a_k b_k`` (over the operand intervals), each
    leaf rounded at most ``K + 1`` times in any order, with or without fused
    multiply-adds, plus the absolute error of the ``K`` product (or fused)
    roundings under underflow, ``K * eta/2 * (1 + gamma_K)``; a reassociating
    ``mma`` may round every operation faithfully (either neighbour, as the
    tensor cores' truncating adders do), counted as ``2 (K + 1)`` roundings
    and ``K * eta`` of underflow; with FP8 operands those roundings are to
    :data:`shadow.FP8_MMA_BITS` significant bits, the matrix units'
    accumulator (V-24)
    (:class:`shadow.SumLeaves`; overflow, NaN and zero rules included)."""
    at, bt, ct = (o.type for o in op.operands)
    dt = ct.dtype
    inexact = dt.is_float and op.attrs["allow_reassociation"]
    if not it.opts.oracle or not (inexact or not (a.exact and b.exact and c.exact)):
        return out
    kdims = roles["contraction"]
    kext = [a.tile_shape[at.dims.index(d)] for d in kdims]
    rest_a = [d for d in at.dims if d not in kdims]
    rest_b = [d for d in bt.dims if d not in kdims]
    sa, sb, sc = (x.shadow() for x in (a, b, c))
    shape = out.a.shape
    seed = [np.array(np.broadcast_to(c.lift(nb, x), shape)) for x in sc]
    if not dt.is_float:
        lo, hi = seed[0], seed[1]
        with np.errstate(all="ignore"):
            for plo, phi, _ in _mma_products(a, b, at, bt, ct, kdims, kext, rest_a, rest_b,
                                             sa, sb, nb):
                lo, hi = lo + plo, hi + phi
        return out.with_bounds(lo, hi, np.zeros(shape, dtype=bool))
    leaves = S.SumLeaves()
    c_point = np.ones(shape, bool) if c.exact else S.singleton(seed)
    leaves.add(*seed, c_point, S.as_f64(np.broadcast_to(c.lift(nb), shape)), dt)
    # products of values of at most 24 bits are exact in float64; f64 products are
    # rounded once, so their interval is widened by one float64 step
    exact_products = dt.name != "f64" and a.exact and b.exact
    with np.errstate(all="ignore"):
        for plo, phi, pnan in _mma_products(a, b, at, bt, ct, kdims, kext, rest_a, rest_b,
                                            sa, sb, nb):
            if not exact_products:
                plo, phi = np.nextafter(plo, -np.inf), np.nextafter(phi, np.inf)
            plo, phi, pnan = (np.broadcast_to(x, shape) for x in (plo, phi, pnan))
            pt = np.full(shape, exact_products) | S.nan_only((plo, phi, pnan))
            leaves.add(plo, phi, pnan, pt, np.where(S.nan_only((plo, phi, pnan)), np.nan, plo),
                       dt)
        K = int(np.prod(kext))
        # a reassociating mma may round each operation faithfully (matrix
        # units truncate): one such rounding is within two nearest ones,
        # (1 + 2u) <= (1 + u)^2, and loses under a whole subnormal step
        faithful = bool(op.attrs["allow_reassociation"])
        rounds = 2 * (K + 1) if faithful else K + 1
        # FP8 operands: the matrix units' narrower accumulator (V-24)
        unit = (2.0 ** -S.FP8_MMA_BITS if faithful and (at.dtype.is_fp8 or bt.dtype.is_fp8)
                else None)
        step = S.eta(dt) if faithful else S.eta(dt) / 2.0
        absolute = K * step * (1.0 + float(S.gamma(rounds, dt, unit)))
        lo, hi, nan, point = leaves.envelope(dt, rounds=rounds, absolute=absolute, unit=unit)
    if bool(np.all(point)):
        return out
    ref = S.point_of(out.a)
    return out.with_bounds(*(np.where(point, r, x) for r, x in zip(ref, (lo, hi, nan),
                                                                     strict=True)))


def _mma_products(a: RV, b: RV, at: TileType, bt: TileType, ct: TileType, kdims: list,
                  kext: list, rest_a: list, rest_b: list, sa: tuple, sb: tuple, nb: int):
    """For each contraction point, the shadow ``(lo, hi, nan)`` of the exact product
    ``a_k * b_k`` (float64, unrounded) laid out over the accumulator's dims."""
    for kidx in itertools.product(*(range(n) for n in kext)):
        fix = dict(zip(kdims, kidx, strict=True))
        xa = [align(RV(_select(a.lift(nb, v), at.dims, fix, nb), nb), rest_a, ct.dims, nb)
              for v in sa]
        xb = [align(RV(_select(b.lift(nb, v), bt.dims, fix, nb), nb), rest_b, ct.dims, nb)
              for v in sb]
        yield S.product(tuple(xa), tuple(xb))


def product(A: np.ndarray, B: np.ndarray, at: Any, bt: Any, ct: TileType, roles: dict,
            nb: int) -> np.ndarray:
    """``A x B`` over ``ct``'s dims (``at``, ``bt``: anything with the
    operands' ``dims``; ``nb`` batch axes): one batched BLAS product where
    :func:`_matmul` can arrange one, else ``einsum``."""
    prod = _matmul(A, B, at, bt, ct, roles, nb)
    if prod is not None:
        return prod
    letter = {d: _LETTERS[i] for i, d in enumerate(dict.fromkeys(at.dims + bt.dims + ct.dims))}
    sa, sb, sc = ("".join(letter[d] for d in t.dims) for t in (at, bt, ct))
    return np.einsum(f"...{sa},...{sb}->...{sc}", A, B)


def _matmul(A: np.ndarray, B: np.ndarray, at: TileType, bt: TileType, ct: TileType,
            roles: dict, nb: int) -> np.ndarray | None:
    """``A x B`` through one batched matrix product (BLAS) when there are no mma
    batch dims (:func:`_matmul_plan`)."""
    plan = _matmul_plan(A, B, at, bt, ct, roles, nb)
    if plan is None:
        return None
    lhs, rhs, lay = plan
    return lay(np.matmul(lhs, rhs))


def _matmul_plan(A: np.ndarray, B: np.ndarray, at: TileType, bt: TileType, ct: TileType,
                 roles: dict, nb: int) -> tuple[np.ndarray, np.ndarray, Callable] | None:
    """``(lhs, rhs, lay)`` with ``A x B == lay(lhs @ rhs)`` over ct's dims: A
    arranged as [batch][free_a][K], B as [batch][K][free_b] (batch axes of
    the instances only: None when the mma has batch dims); ``lay`` views the
    product's array over ct's dims without copying it."""
    if roles["batch"]:
        return None
    fa, k, fb = roles["free_a"], roles["contraction"], roles["free_b"]
    pa = list(range(nb)) + [nb + at.dims.index(d) for d in fa + k]
    pb = list(range(nb)) + [nb + bt.dims.index(d) for d in k + fb]
    a2, b2 = A.transpose(pa), B.transpose(pb)
    ea = [a2.shape[nb + i] for i in range(len(fa))]
    eb = [b2.shape[nb + len(k) + i] for i in range(len(fb))]
    kk = int(np.prod([a2.shape[nb + len(fa) + i] for i in range(len(k))]))
    a3 = a2.reshape(a2.shape[:nb] + (int(np.prod(ea)), kk))
    b3 = b2.reshape(b2.shape[:nb] + (kk, int(np.prod(eb))))
    order = list(fa) + list(fb)
    to_ct = list(range(nb)) + [nb + order.index(d) for d in ct.dims]

    def tiles(r: np.ndarray) -> np.ndarray:
        r = r.reshape(r.shape[:nb] + tuple(ea) + tuple(eb))
        return r.transpose(to_ct)

    sa = [i for i in range(nb) if a3.shape[i] > 1 and b3.shape[i] == 1]
    sb = [i for i in range(nb) if b3.shape[i] > 1 and a3.shape[i] == 1]
    if not nb or any(a3.shape[i] > 1 and b3.shape[i] > 1 for i in range(nb)):
        return a3, b3, tiles
    # outer-product batch structure: fold A-only lanes into M and B-only lanes into
    # N, making one large matrix product instead of many small ones
    m, n = a3.shape[-2], b3.shape[-1]
    am = a3.reshape([a3.shape[i] for i in sa] + [m, kk])
    am = am.reshape(-1, kk) if sa else am.reshape(m, kk)
    bm = b3.reshape([b3.shape[i] for i in sb] + [kk, n])
    bm = np.moveaxis(bm, -2, 0).reshape(kk, -1)
    na, nbb = len(sa), len(sb)
    full_b = [1] * nb
    for i in sa:
        full_b[i] = a3.shape[i]
    for i in sb:
        full_b[i] = b3.shape[i]
    order_b = sa + sb
    inv = [order_b.index(i) for i in range(nb) if i in order_b]

    def lanes(r: np.ndarray) -> np.ndarray:
        # r: (prod(sa)*m, prod(sb)*n) -> batch axes (sa then sb, in place order) + (m, n)
        r = r.reshape([a3.shape[i] for i in sa] + [m] + [b3.shape[i] for i in sb] + [n])
        perm = list(range(na)) + list(range(na + 1, na + 1 + nbb)) + [na, na + 1 + nbb]
        r = r.transpose(perm)
        r = r.reshape([full_b[i] for i in order_b] + [m, n])
        r = r.transpose(inv + [len(order_b), len(order_b) + 1]) if order_b else r
        return tiles(r.reshape(full_b + [m, n]))

    return am, bm, lanes


def _accumulate(dead: np.ndarray, C: np.ndarray, A: np.ndarray, B: np.ndarray,
                at: TileType, bt: TileType, ct: TileType, roles: dict,
                nb: int) -> np.ndarray | None:
    """``C + A x B`` written into ``C``'s own array ``dead`` (the accumulator's,
    read here for the last time: ``it.reusable``): ``out += lhs @ rhs``, one
    2-D BLAS product added into it (a grouping of the sum a reassociating
    ``mma`` admits: R-9, V-22); ``C`` itself, or None where the product is not
    one 2-D BLAS product, the dtype not f32/f64, or ``C`` not laid out in
    ``dead``'s memory as that product's output is."""
    if dead.dtype not in (np.float32, np.float64) or not (A.dtype == B.dtype == dead.dtype):
        return None
    plan = _matmul_plan(A, B, at, bt, ct, roles, nb)
    if plan is None or plan[0].ndim != 2:
        return None
    lhs, rhs, lay = plan
    owner = dead if dead.base is None else dead.base
    shape = (lhs.shape[0], rhs.shape[1])
    if (owner.dtype != dead.dtype or owner.size != shape[0] * shape[1]
            or not owner.flags.c_contiguous):
        return None
    out = owner.reshape(shape)
    if not _same_memory_layout(lay(out), C):
        return None
    # numpy's BLAS and an in-place add, not a second BLAS library's product
    # that adds into its output: the workers of two BLAS thread pools, each
    # spinning after its calls, would compete for the same cores
    np.add(out, np.matmul(lhs, rhs), out=out)
    return C


def _same_memory_layout(x: np.ndarray, y: np.ndarray) -> bool:
    """``x`` and ``y`` address the same elements in the same positions."""
    return (x.shape == y.shape and x.ctypes.data == y.ctypes.data
            and all(sx == sy for sx, sy, n in zip(x.strides, y.strides, y.shape, strict=True)
                    if n > 1))


def _out_shape(A, B, at, bt, ct, nb, a, b) -> tuple[int, ...]:
    ext = {}
    for arr, t in ((A, at), (B, bt)):
        for d, n in zip(t.dims, arr.shape[nb:], strict=True):
            ext[d] = n
    bshape = np.broadcast_shapes(A.shape[:nb], B.shape[:nb])
    return tuple(bshape) + tuple(ext[d] for d in ct.dims)


def _select(arr: np.ndarray, dims: tuple, fixed: dict, nb: int) -> np.ndarray:
    idx: list[Any] = [slice(None)] * nb
    for d in dims:
        idx.append(fixed[d] if d in fixed else slice(None))
    return arr[tuple(idx)]


def _wide_dt(dt: Any) -> Any:
    from ..semantics import dtypes as D

    return D.f32 if dt.name in ("f16", "bf16") else dt


def _i64() -> Any:
    from ..semantics import dtypes as D

    return D.i64


_I64 = _i64()


@rule("map")
def _map(it: Interpreter, op: Operation) -> None:
    """The scalar body runs once, vectorized: the tile's axes act as extra batch axes."""
    rt: TileType = op.results[0].type
    rvs = [it.val(o) for o in op.operands]
    nb = max(r.nb for r in rvs)
    arrs = [align(r, o.type.dims, rt.dims, nb) for r, o in zip(rvs, op.operands, strict=True)]
    shape = np.broadcast_shapes(*(a.shape for a in arrs))
    saved = it.bshape, it.lane_mask
    it.bshape = tuple(shape)
    it.lane_mask = None
    args = [RV(np.broadcast_to(a, shape), len(shape)) for a in arrs]
    if shadowed(it, rvs):
        for arg, parts in zip(args, bounds_on(it, op, nb), strict=True):
            arg.with_bounds(*(np.broadcast_to(b, shape) for b in parts))
    try:
        outs = it.block(op.regions[0], args)
    finally:
        it.bshape, it.lane_mask = saved
    for r, o in zip(op.results, outs, strict=True):
        res = RV(np.broadcast_to(o.lift(len(shape)), shape), nb)
        if o.lo is not None:
            res.with_bounds(*(np.broadcast_to(o.lift(len(shape), x), shape) for x in o.shadow()))
        it.set(r, res)
