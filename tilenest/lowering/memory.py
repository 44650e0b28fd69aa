"""Lowering of the addressable effects (``semantics/ops/memory.py``).

A view access touches tensor element ``map(u)`` for tile coordinate ``u``; it is
*in view* when every coordinate lies inside the tensor and ``valid`` holds.
The in-view condition is a conjunction of comparisons, so loop nests over the
tile are range-restricted by it (``facts.py``): the main range accesses memory
unguarded, the ragged rest is guarded.

* bounds ``zero``/``fill`` -- out-of-view reads give 0 / the fill value and
  out-of-view writes are dropped;
* ``checked`` -- an out-of-view access records an error (the runtime raises
  ``BoundsError`` naming the op) and is not performed;
* ``assume`` -- the promise is taken: no guard at all; under a schedule with
  ``check_assumes`` (a checked build) the promise is checked like ``checked``,
  so a broken one is reported as the interpreter reports it (M-7).

A ``tensor.load`` that the storage plan inlines reads global memory at its use;
otherwise it is copied into a local buffer (a snapshot). ``memory.alloc``
gives a per-program buffer of the layout's size; ``memory.store`` writes the
whole tile through the layout offsets; ``memory.load`` copies it out (a
snapshot later stores cannot change).
"""

from __future__ import annotations

import math
from typing import Any

from ..semantics import expr as E
from ..semantics.ir import Operation
from ..semantics.policies import Bounds
from ..semantics.types import MemoryType, TileType
from . import loopir as L
from .core import Lowerer, rule, unsupported
from .facts import conjuncts
from .handles import BufH, Index, LazyH, MemH, StateH, TensorBox, TensorH
from .values import constant


def _kind(lw: Lowerer, pol: object) -> tuple[Bounds, str]:
    """The bounds behaviour an access is lowered with and the name of the rule
    its error cites: ``assume`` is ``checked`` in a checked build."""
    kind = pol.kind  # type: ignore[attr-defined]
    if kind is Bounds.assume and lw.sched.check_assumes:
        return Bounds.checked, "breaks its bounds.assume promise"
    return kind, "(bounds.checked)"


def _view(lw: Lowerer, op: Operation, t: TensorH, dims: tuple) -> tuple:
    """``coords(q)`` (tensor coordinates of tile element q) and ``conj(q)`` (its
    in-view conjuncts), with region variables bound now."""
    vars_ = op.attrs["vars"]
    maps = [lw.ix(m) for m in op.attrs["map"]]
    valid = lw.ix(op.attrs["valid"])

    def sub(q: Index) -> dict:
        return {E.Var(v): q[d] for v, d in zip(vars_, dims, strict=True)}

    def coords(q: Index) -> list[E.Expr]:
        m = sub(q)
        return [E.subst(x, m) for x in maps]

    def conj(q: Index) -> list[E.Pred]:
        return t.in_bounds(coords(q)) + conjuncts(E.subst(valid, sub(q)))

    return coords, conj


def _positive_zero(v: object) -> bool:
    """Whether the fill value ``v`` is exactly ``+0`` (``False`` and ``0`` too)."""
    return isinstance(v, (bool, int, float)) and v == 0 and math.copysign(1.0, float(v)) > 0


@rule("tensor.load")
def _tload(lw: Lowerer, op: Operation) -> None:
    t: TensorH = lw.handle(op.operands[0])
    rt: TileType = op.results[0].type
    pol = op.attrs["bounds"]
    coords, conj = _view(lw, op, t, rt.dims)
    fill = constant(pol.fill if pol.kind is Bounds.fill else 0, rt.dtype)
    ext = lw.extents(rt)
    kind, why = _kind(lw, pol)
    checked = kind is Bounds.checked
    code = lw.error("out of bounds", f"load of {t.buf.name} through %{op.results[0].name} is "
                    f"outside its view {why}", op.loc) if checked else 0

    def fn(lw_: Lowerer, q: Index) -> L.Expr:
        off = L.IExpr(t.offset(coords(q)))
        if kind is Bounds.assume:
            return L.Load(t.buf, off)
        g = lw_.guard_of(conj(q))
        if g is None:
            return L.Load(t.buf, off)
        if checked:
            lw_.check(g.p, code)
        return L.Load(t.buf, off, g, fill)

    gfn = (lambda q: []) if kind is Bounds.assume else conj
    padded = kind in (Bounds.zero, Bounds.fill) and _positive_zero(fill.value)
    # a box of the tensor, zero outside it: a bulk copy may fetch it
    plain = not conjuncts(lw.ix(op.attrs["valid"])) and t.strides is None
    box = TensorBox(t, coords) if plain and (padded or kind is Bounds.assume) else None
    h = LazyH(rt.dtype, rt.dims, ext, fn, gfn, frozenset({t.buf.name}),
              zero_where=conj if padded else None, box=box)
    if lw.plan.get(op.results[0].name) == "inline" and not checked and not lw.expr_mode:
        lw.env[op.results[0].name] = h
    elif lw.expr_mode:
        raise unsupported(op, lw.target, "a tensor read inside an inlined region")
    else:
        lw.env[op.results[0].name] = lw.materialize(h, op.results[0].name)
    lw.def_depth[op.results[0].name] = lw.depth


def store_elements(lw: Lowerer, op: Operation, v: Any) -> tuple[Any, Any, bool]:
    """How ``tensor.store`` ``op`` stores the tile ``v``: ``(body, guards,
    checked)``, ``body(q)`` emitting the store of element ``q`` (guarded by
    the view, or checked), ``guards`` the view's conjuncts to range-restrict
    a nest over the tile by (None: no guard)."""
    t: TensorH = lw.handle(op.operands[0])
    coords, conj = _view(lw, op, t, v.dims)
    kind, why = _kind(lw, op.attrs["bounds"])
    checked = kind is Bounds.checked
    code = lw.error("out of bounds", f"store to {t.buf.name} is outside its view {why}",
                    op.loc) if checked else 0

    def body(q: Index) -> None:
        off = L.IExpr(t.offset(coords(q)))
        val = v.at(lw, q)
        if kind is Bounds.assume:
            lw.emit(L.Store(t.buf, off, val))
            return
        g = lw.guard_of(conj(q))
        if g is not None and checked:
            lw.check(g.p, code)
        lw.emit(L.Store(t.buf, off, val, g))

    return body, None if kind is Bounds.assume else conj, checked


def bounds_kind(lw: Lowerer, op: Operation) -> Bounds:
    """The bounds behaviour the access ``op`` is lowered with (:func:`_kind`)."""
    return _kind(lw, op.attrs["bounds"])[0]


@rule("tensor.store")
def _tstore(lw: Lowerer, op: Operation) -> None:
    v = lw.handle(op.operands[1])
    body, guards, checked = store_elements(lw, op, v)
    folded = lw.folded_stores.get(op.oid)
    with lw.collect() as nest:
        lw.nest(v.dims, v.extents, body, guards, exclusive=not checked)
    if folded is None:
        lw.emit(*nest)
    else:  # stored by the last step of the loop (``accumulators.py``)
        lw.emit(L.If(L.IPred(folded), tuple(nest), ()))


@rule("memory.alloc")
def _alloc(lw: Lowerer, op: Operation) -> None:
    mt: MemoryType = op.results[0].type
    size = lw.ix(mt.layout.size)
    lw.count += 1
    buf = L.Buffer(f"%{op.results[0].name}.{lw.count}", mt.dtype, "local", size)
    if any(isinstance(lf, (E.Var, E.Val)) for lf in E.leaves(size)):
        raise unsupported(op, lw.target, "a memory whose size varies inside one program")
    lw.locals.append(buf)
    m = MemH(buf, mt.space.dims, tuple(lw.ix(x) for x in mt.space.extents), mt.layout.vars,
             lw.ix(mt.layout.offset))
    lw.env[op.results[0].name] = m
    lw.env[op.results[1].name] = StateH(m)


@rule("memory.store")
def _mstore(lw: Lowerer, op: Operation) -> None:
    m: MemH = lw.handle(op.operands[0])
    v = lw.handle(op.operands[2])
    mt: MemoryType = op.operands[0].type

    def body(q: Index) -> None:
        val = v.at(lw, {d: q[md] for d, md in zip(v.dims, mt.space.dims, strict=True)})
        lw.emit(L.Store(m.buf, L.IExpr(m.offset_at(q)), val))

    lw.nest(m.dims, m.extents, body)
    lw.env[op.results[0].name] = StateH(m)


@rule("memory.load")
def _mload(lw: Lowerer, op: Operation) -> None:
    m: MemH = lw.handle(op.operands[0])
    rt: TileType = op.results[0].type
    h = LazyH(rt.dtype, rt.dims, m.extents,
              lambda lw_, q: L.Load(m.buf, L.IExpr(m.offset_at(
                  {md: q[d] for d, md in zip(rt.dims, m.dims, strict=True)}))),
              reads=frozenset({m.buf.name}))
    lw.env[op.results[0].name] = lw.materialize(h, op.results[0].name)
    lw.def_depth[op.results[0].name] = lw.depth


_ = BufH
