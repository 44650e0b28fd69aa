"""The spatial transform basis, each built as a :class:`~.remap.Remap`.

* ``split(L, a, b)``: ``i_a = q*b + r``; ``q`` replaces ``i_a`` in ``L``, ``r`` is a
  new child level guarded by ``q*b + r < N``; rho: ``L -> child``.
* ``fuse(L)``: ``L`` and its only child ``M`` become one level; ``linear``: one
  coordinate ``f``, ``(i, j) = (f div |M|, f mod |M|)`` (mixed radix); rho: both
  to the fused level.
* ``coalesce(L, axes)``: consecutive axes of ``L`` become one mixed-radix
  coordinate; ``reshape(L, extents)``: ``L``'s coordinates re-factored row-major.
* ``permute(L, perm)``: reorders the axes of ``L`` (or of a perfect chain below
  ``L``, keeping each level's rank); ``interchange(L)``: ``L`` and its only child
  swap places; rho preserves depth.
* ``tile(L, factors)``: ``split`` of each axis, then the remainders merged.
* ``insert_unit(L)``: a one-point level below ``L`` takes ``L``'s body (rho:
  ``L -> unit``); ``remove_unit(L)``: ``L``'s coordinates become ``0`` and its
  body moves to the parent (rho: ``L -> parent``).

Every function takes a program, a kernel, or the :class:`~.remap.Transformed`
of an earlier transform (so transforms compose by nesting calls or with
:func:`compose`), and returns a ``Transformed`` holding the candidate program
and the accumulated obligations (not yet discharged). Keyword arguments such as
``outer_extent``, ``guard`` or ``tau`` exist to state deliberately different
witnesses (the mutation tests use them); the defaults are the correct ones.
"""

from __future__ import annotations

import functools
import inspect
import numbers
import types
import typing
from collections import abc
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..semantics import expr as E
from ..semantics.ir import Operation, TileProgram
from ..semantics.space import DimFactor, IndexSet, Space
from . import formula as Fm
from . import rewrite as RW
from .model import Model
from .obligation import Obligation
from .remap import NewLevel, Remap, Transformed, TransformError, apply, program_of

# ---------------------------------------------------------------------------
# the arguments of a transform, checked against its signature

_UNCHECKED = object()


def _resolve(ann: Any, fn: Callable[..., Any]) -> Any:
    """The annotation ``ann`` of ``fn`` as a typing object (annotations are
    strings here); :data:`_UNCHECKED` when it cannot be evaluated."""
    if isinstance(ann, typing.ForwardRef):
        ann = ann.__forward_arg__
    if not isinstance(ann, str):
        return ann
    ns = {**vars(E), **fn.__globals__}
    try:
        return eval(ann, ns)  # the library's own annotation text
    except (NameError, AttributeError, TypeError, SyntaxError):
        return _UNCHECKED


def _fits(v: Any, t: Any, fn: Callable[..., Any]) -> bool:
    """Does the value ``v`` belong to the annotated type ``t``? Ints exclude
    bools; a sequence is a list or tuple (never a string); a parameter whose
    annotation says nothing checkable accepts anything."""
    t = _resolve(t, fn)
    if t is _UNCHECKED or t is Any or t is inspect.Parameter.empty:
        return True
    if t is type(None) or t is None:
        return v is None
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(v, a, fn) for a in args)
    if origin is abc.Callable or t is abc.Callable:
        return callable(v)
    if origin in (abc.Sequence, list, tuple) or t in (abc.Sequence, list, tuple):
        return isinstance(v, (list, tuple)) and (not args or all(_fits(x, args[0], fn)
                                                                  for x in v))
    if origin in (abc.Mapping, dict) or t in (abc.Mapping, dict):
        return isinstance(v, abc.Mapping) and (not args or all(
            _fits(k, args[0], fn) and _fits(x, args[1], fn) for k, x in v.items()))
    if t is bool:
        return isinstance(v, (bool, np.bool_))
    if t is int:
        return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))
    if isinstance(t, type):
        return isinstance(v, t)
    return True


def _type_text(ann: Any) -> str:
    text = ann if isinstance(ann, str) else getattr(ann, "__name__", str(ann))
    return text.replace("E.IntLike", "int | Expr").replace("E.Expr", "Expr")


def signature_text(name: str, fn: Callable[..., Any]) -> str:
    """``name(level: int, axis: int, ...)``: the arguments a transform takes
    after the program it transforms."""
    parts: list[str] = []
    star = False
    for q in list(inspect.signature(fn).parameters.values())[1:]:
        if q.kind is q.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        t = q.name
        if q.annotation is not q.empty:
            t += f": {_type_text(q.annotation)}"
        if q.default is not q.empty:
            t += f" = {q.default!r}"
        parts.append(t)
    return f"{name}({', '.join(parts)})"


def check_arguments(name: str, fn: Callable[..., Any], args: Sequence[Any],
                    kw: typing.Mapping[str, Any]) -> None:
    """Raise a :class:`TransformError` unless ``fn(program, *args, **kw)``
    binds (arity, keyword names) and every argument belongs to its
    parameter's annotated type; the hint is the transform's signature. This
    is the one check of a transform's arguments, for Python calls
    (:func:`transform_entry`) and ``--transform`` specs alike."""
    target = getattr(fn, "__wrapped__", fn)
    sig = inspect.signature(target)
    hint = "signature: " + signature_text(name, target)
    try:
        bound = sig.bind(None, *args, **kw)
    except TypeError as e:
        raise TransformError(f"{name}: {e}".replace(f"{target.__name__}() ", ""),
                             hint=hint) from None
    params = list(sig.parameters.values())
    for q in params[1:]:
        if q.name not in bound.arguments:
            continue
        v = bound.arguments[q.name]
        vals = v.values() if q.kind is q.VAR_KEYWORD else v if q.kind is q.VAR_POSITIONAL \
            else (v,)
        for x in vals:
            if not _fits(x, q.annotation, target):
                raise TransformError(
                    f"{name}: argument '{q.name}' must be {_type_text(q.annotation)}, got "
                    f"{x!r} ({type(x).__name__})", hint=hint)


def transform_entry(fn: Callable[..., Transformed]) -> Callable[..., Transformed]:
    """A public transform whose arguments are checked first
    (:func:`check_arguments`): a wrong arity or type is a TransformError with
    the signature, never a TypeError from deep inside the rewrite."""
    name = fn.__name__

    @functools.wraps(fn)
    def entry(x: Any, *args: Any, **kw: Any) -> Transformed:
        check_arguments(name, fn, args, kw)
        return fn(x, *args, **kw)

    return entry


def _level(p: TileProgram, level: int) -> tuple[Model, Operation, IndexSet]:
    m = Model(p)
    op = m.level_op(level)  # a TransformError naming the program's levels
    return m, op, op.attrs["domain"]


def _child(m: Model, op: Operation) -> Operation:
    kids = [o for o in op.regions[0].ops if o.name == "parallel"]
    if len(kids) != 1:
        raise TransformError(f"level {op.attrs['level']} needs exactly one child level here "
                             f"(it has {len(kids)})", op.loc)
    return kids[0]


def _no_layout(op: Operation) -> None:
    ex = op.attr("exec")
    if ex is not None and ex.layout is not None:
        raise TransformError(f"level {op.attrs['level']} has an exec layout (a ParallelMap); "
                             "remap it before restructuring the level", op.loc)


def _digits(lin: E.Expr, extents: Sequence[E.Expr]) -> list[E.Expr]:
    """Row-major mixed-radix digits of ``lin`` in ``extents``."""
    out: list[E.Expr] = []
    for i in range(len(extents)):
        stride: E.Expr = E.Const(1)
        for e in extents[i + 1:]:
            stride = stride * e
        d = lin // stride
        out.append(d if i == 0 else d % extents[i])
    return out


def _linear(vs: Sequence[E.Expr], extents: Sequence[E.Expr]) -> E.Expr:
    out: E.Expr = E.Const(0)
    for v, e in zip(vs, extents, strict=True):
        out = out * e + v
    return out


def _product(extents: Sequence[E.Expr]) -> E.Expr:
    out: E.Expr = E.Const(1)
    for e in extents:
        out = out * e
    return out


def _with(x: Any, fn: Callable[[TileProgram], Transformed]) -> Transformed:
    """Run ``fn`` on the program of ``x`` and chain the result after ``x``."""
    p = program_of(x)
    t = fn(p)
    if isinstance(x, Transformed):
        composed = {k: t.level_map.get(v, v) for k, v in x.level_map.items()}
        composed.update({k: v for k, v in t.level_map.items() if k not in composed})
        return Transformed(x.source, t.program, x.obligations + t.obligations,
                           x.steps + t.steps, composed, t.reason or x.reason)
    return t


@transform_entry
def split(x: Any, level: int, axis: int, factor: E.IntLike, *, nest: bool = True,
          outer_extent: E.IntLike | None = None, guard: bool = True,
          tau: Callable[[E.Expr, E.Expr], E.Expr] | None = None) -> Transformed:
    """``i = q*factor + r`` on axis ``axis`` of ``level``; ``r`` becomes a new
    child level (``nest=False``: ``q, r`` stay in ``level``). The tail is guarded
    by ``q*factor + r < N`` on ``r``'s domain."""

    def run(p: TileProgram) -> Transformed:
        m, op, dom = _level(p, level)
        _no_layout(op)
        if not 0 <= axis < dom.rank:
            raise TransformError(f"level {level} has {dom.rank} axes; no axis {axis}", op.loc)
        f = E.lift(factor)
        if isinstance(f, E.Const) and f.value < 1:
            raise TransformError(f"split factor must be >= 1, got {f.value}", op.loc)
        names = RW.Names(p)
        v = dom.vars[axis]
        fac = dom.space.factors[axis]
        q, r = names.fresh(v + "_o"), names.fresh(v + "_i")
        n = fac.extent
        qx, rx = E.Var(q), E.Var(r)
        old = (tau or (lambda a, b: a * f + b))(qx, rx)
        tmap = {d: E.Var(d) for d in dom.vars}
        tmap[v] = old
        pred = E.subst(dom.pred, {E.Var(v): old})
        tail = old.lt(n) if guard else E.TRUE
        label = fac.dim.describe()
        qf = DimFactor(RW.fresh_dim(label + "_o"), E.lift(outer_extent) if outer_extent
                       is not None else E.cdiv(n, f))
        rf = DimFactor(RW.fresh_dim(label + "_i"), f)
        facs = list(dom.space.factors)
        vs = list(dom.vars)
        inv = None if tau is not None else {
            **{d: E.Var(d) for d in dom.vars if d != v}, q: E.Var(v) // f, r: E.Var(v) % f}
        if nest:
            facs[axis], vs[axis] = qf, q
            outer = NewLevel(tuple(vs), IndexSet(Space(tuple(facs)), tuple(vs)), op.attr("exec"))
            inner = NewLevel((r,), IndexSet(Space((rf,)), (r,), E.pand(tail, pred)))
            rm = Remap("split", (level,), (outer, inner), tmap, {level: 1}, inverse=inv)
        else:
            facs[axis:axis + 1] = [qf, rf]
            vs[axis:axis + 1] = [q, r]
            one = NewLevel(tuple(vs), IndexSet(Space(tuple(facs)), tuple(vs), E.pand(tail, pred)),
                           op.attr("exec"))
            rm = Remap("split", (level,), (one,), tmap, {level: 0}, inverse=inv)
        t = apply(p, rm)
        if not isinstance(f, E.Const):
            t.obligations.insert(0, Obligation(
                "split.factor", f"split factor {E.to_str(f)} is positive", m.sites(op),
                Fm.Claim((), Fm.TRUE, Fm.atom(f.ge(1)), m.assumptions)))
        return t

    return _with(x, run)


@transform_entry
def fuse(x: Any, level: int, *, linear: bool = True, extent: E.IntLike | None = None
         ) -> Transformed:
    """Fuse ``level`` with its only child level: one level whose coordinates are
    both levels' (``linear``: one mixed-radix coordinate over their product)."""

    def run(p: TileProgram) -> Transformed:
        m, op, dom = _level(p, level)
        child = _child(m, op)
        _no_layout(op)
        _no_layout(child)
        cd: IndexSet = child.attrs["domain"]
        own = {E.Var(v) for v in dom.vars}
        if any(own & E.leaves(e) for e in cd.space.extents):
            raise TransformError("the child's extents depend on the parent's coordinates; "
                                 "fuse needs a rectangular pair", child.loc)
        vs = dom.vars + cd.vars
        facs = dom.space.factors + cd.space.factors
        pred = E.pand(dom.pred, cd.pred)
        levels = (level, child.attrs["level"])
        ident = {v: E.Var(v) for v in vs}
        if not linear:
            nl = NewLevel(vs, IndexSet(Space(facs), vs, pred), op.attr("exec"))
            return apply(p, Remap("fuse", levels, (nl,), ident, {lv: 0 for lv in levels},
                                  inverse=ident))
        names = RW.Names(p)
        fv = names.fresh("".join(v[:1] for v in vs) + "_f")
        exts = [f.extent for f in facs]
        digits = _digits(E.Var(fv), exts)
        tmap = dict(zip(vs, digits, strict=True))
        size = E.lift(extent) if extent is not None else _product(exts)
        ff = DimFactor(RW.fresh_dim("*".join(f.dim.describe() for f in facs)), size)
        nl = NewLevel((fv,), IndexSet(Space((ff,)), (fv,),
                                      E.subst(pred, {E.Var(k): v for k, v in tmap.items()})),
                      op.attr("exec"))
        inv = {fv: _linear([E.Var(v) for v in vs], exts)}
        return apply(p, Remap("fuse", levels, (nl,), tmap, {lv: 0 for lv in levels},
                              inverse=inv))

    return _with(x, run)


@transform_entry
def coalesce(x: Any, level: int, axes: Sequence[int] | None = None) -> Transformed:
    """Replace consecutive ``axes`` of ``level`` (default: all) by one mixed-radix
    coordinate."""

    def run(p: TileProgram) -> Transformed:
        _m, op, dom = _level(p, level)
        _no_layout(op)
        ax = list(axes) if axes is not None else list(range(dom.rank))
        if not ax or ax != list(range(ax[0], ax[0] + len(ax))) or ax[-1] >= dom.rank:
            raise TransformError(f"coalesce needs consecutive axes of level {level}", op.loc)
        names = RW.Names(p)
        a, b = ax[0], ax[-1] + 1
        vs = dom.vars[a:b]
        facs = dom.space.factors[a:b]
        cv = names.fresh("".join(v[:1] for v in vs) + "_c")
        exts = [f.extent for f in facs]
        tmap = {v: E.Var(v) for v in dom.vars}
        tmap.update(zip(vs, _digits(E.Var(cv), exts), strict=True))
        cf = DimFactor(RW.fresh_dim("*".join(f.dim.describe() for f in facs)), _product(exts))
        nvs = dom.vars[:a] + (cv,) + dom.vars[b:]
        nfs = dom.space.factors[:a] + (cf,) + dom.space.factors[b:]
        pred = E.subst(dom.pred, {E.Var(k): v for k, v in tmap.items()})
        nl = NewLevel(nvs, IndexSet(Space(nfs), nvs, pred), op.attr("exec"))
        inv = {d: E.Var(d) for d in nvs if d != cv}
        inv[cv] = _linear([E.Var(x_) for x_ in vs], exts)
        return apply(p, Remap("coalesce", (level,), (nl,), tmap, {level: 0}, inverse=inv))

    return _with(x, run)


@transform_entry
def reshape(x: Any, level: int, extents: Sequence[E.IntLike]) -> Transformed:
    """Re-factor ``level``'s domain row-major into ``extents`` (the obligations
    prove the cardinality is preserved)."""

    def run(p: TileProgram) -> Transformed:
        _m, op, dom = _level(p, level)
        _no_layout(op)
        names = RW.Names(p)
        new_ext = [E.lift(e) for e in extents]
        base = dom.vars[0] if dom.vars else "r"
        nvs = tuple(names.fresh(f"{base}_r{i}") for i in range(len(new_ext)))
        lin = _linear([E.Var(v) for v in nvs], new_ext)
        old_ext = list(dom.space.extents)
        tmap = dict(zip(dom.vars, _digits(lin, old_ext), strict=True))
        label = "*".join(f.dim.describe() for f in dom.space.factors) or "unit"
        nfs = tuple(DimFactor(RW.fresh_dim(f"{label}_r{i}"), e) for i, e in enumerate(new_ext))
        pred = E.subst(dom.pred, {E.Var(k): v for k, v in tmap.items()})
        nl = NewLevel(nvs, IndexSet(Space(nfs), nvs, pred), op.attr("exec"))
        old_lin = _linear([E.Var(v) for v in dom.vars], old_ext)
        inv = dict(zip(nvs, _digits(old_lin, new_ext), strict=True))
        return apply(p, Remap("reshape", (level,), (nl,), tmap, {level: 0}, inverse=inv))

    return _with(x, run)


@transform_entry
def permute(x: Any, level: int, perm: Sequence[int]) -> Transformed:
    """Reorder axes. With ``len(perm)`` equal to ``level``'s rank the axes stay in
    the level; a longer ``perm`` ranges over the axes of the perfect chain of
    levels starting at ``level`` (outermost first) and redistributes them,
    keeping each level's rank and depth (``rho`` preserves depth)."""

    def run(p: TileProgram) -> Transformed:
        m, op, dom = _level(p, level)
        chain = [op]
        total = dom.rank
        while total < len(perm):
            chain.append(_child(m, chain[-1]))
            total += chain[-1].attrs["domain"].rank
        if sorted(perm) != list(range(total)):
            raise TransformError(f"{list(perm)} is not a permutation of {total} axes", op.loc)
        for c in chain:
            _no_layout(c)
        vs = [v for c in chain for v in c.attrs["domain"].vars]
        facs = [f for c in chain for f in c.attrs["domain"].space.factors]
        allv = {E.Var(v) for v in vs}
        if len(chain) > 1 and any(allv & E.leaves(f.extent) for f in facs):
            raise TransformError("extents depend on permuted coordinates", op.loc)
        pred = E.pand(*(c.attrs["domain"].pred for c in chain))
        new: list[NewLevel] = []
        k = 0
        for i, c in enumerate(chain):
            rank = c.attrs["domain"].rank
            sel = perm[k:k + rank]
            k += rank
            nv = tuple(vs[j] for j in sel)
            nf = tuple(facs[j] for j in sel)
            new.append(NewLevel(nv, IndexSet(Space(nf), nv, pred if i == len(chain) - 1
                                             else E.TRUE), c.attr("exec")))
        levels = tuple(c.attrs["level"] for c in chain)
        ident = {v: E.Var(v) for v in vs}
        return apply(p, Remap("permute", levels, tuple(new), ident,
                              {lv: i for i, lv in enumerate(levels)}, inverse=ident))

    return _with(x, run)


@transform_entry
def interchange(x: Any, level: int) -> Transformed:
    """Swap ``level`` with its only child level (a permutation across the cut)."""

    def run(p: TileProgram) -> Transformed:
        m, op, dom = _level(p, level)
        child = _child(m, op)
        cd: IndexSet = child.attrs["domain"]
        for c in (op, child):
            _no_layout(c)
        if any({E.Var(v) for v in dom.vars} & E.leaves(e) for e in cd.space.extents):
            raise TransformError("the child's extents depend on the parent's coordinates",
                                 child.loc)
        outer = NewLevel(cd.vars, IndexSet(cd.space, cd.vars), op.attr("exec"))
        inner = NewLevel(dom.vars, IndexSet(dom.space, dom.vars, E.pand(dom.pred, cd.pred)),
                         child.attr("exec"))
        levels = (level, child.attrs["level"])
        vs = dom.vars + cd.vars
        ident = {v: E.Var(v) for v in vs}
        return apply(p, Remap("interchange", levels, (outer, inner), ident,
                              {levels[0]: 0, levels[1]: 1}, inverse=ident))

    return _with(x, run)


@transform_entry
def insert_unit(x: Any, level: int) -> Transformed:
    """A new one-point level directly below ``level`` takes over its body."""

    def run(p: TileProgram) -> Transformed:
        _m, op, dom = _level(p, level)
        _no_layout(op)
        names = RW.Names(p)
        u = names.fresh("unit")
        uf = DimFactor(RW.fresh_dim("unit"), E.Const(1))
        outer = NewLevel(dom.vars, dom, op.attr("exec"))
        inner = NewLevel((u,), IndexSet(Space((uf,)), (u,)))
        ident = {v: E.Var(v) for v in dom.vars}
        return apply(p, Remap("insert_unit", (level,), (outer, inner), ident, {level: 1},
                              inverse={**ident, u: E.Const(0)}))

    return _with(x, run)


@transform_entry
def remove_unit(x: Any, level: int) -> Transformed:
    """Remove ``level`` (whose domain must be the single point 0, which the
    obligations prove); its body moves into the parent."""

    def run(p: TileProgram) -> Transformed:
        _m, _op, dom = _level(p, level)
        return apply(p, Remap("remove_unit", (level,), (), {v: E.Const(0) for v in dom.vars},
                              {level: -1}, inverse={}))

    return _with(x, run)


@transform_entry
def tile(x: Any, level: int, factors: Sequence[E.IntLike | None]) -> Transformed:
    """Split each axis of ``level`` by its factor (``None``/1: untouched) and merge
    the remainders into one child level, in axis order: ``(i, j) -> (qi, qj) |>
    (ri, rj)``."""
    cur: Any = x
    inner: list[int] = []  # child levels created, outermost first
    axes = [a for a, f in enumerate(factors) if f is not None and E.lift(f) != E.Const(1)]
    if not axes:
        raise TransformError("tile needs at least one factor other than 1")
    for a in axes:
        s = split(cur, level, a, factors[a])  # type: ignore[arg-type]
        if s.program is None:
            return s
        created = max(o.attrs["level"] for o in s.program.walk() if o.name == "parallel")
        inner.insert(0, created)
        cur = s
    # merge the remainder levels: outermost created last is directly under `level`
    for _ in range(len(inner) - 1):
        cur = fuse(cur, inner[0], linear=False)
    if len(inner) > 1:
        # the merged level holds the remainders in reverse axis order
        cur = permute(cur, inner[0], list(range(len(inner) - 1, -1, -1)))
    return cur


def compose(x: Any, steps: Sequence[tuple[str, tuple, dict]]) -> Transformed:
    """Apply ``steps`` = ``[(name, args, kwargs), ...]`` in order."""
    cur: Any = x
    for name, args, kw in steps:
        fn = TRANSFORMS.get(name)
        if fn is None:
            raise TransformError(f"unknown transform '{name}'",
                                 hint="one of " + ", ".join(sorted(TRANSFORMS)))
        cur = fn(cur, *args, **kw)
    if not isinstance(cur, Transformed):
        p = program_of(cur)
        return Transformed(p, p)
    return cur


TRANSFORMS: dict[str, Callable[..., Transformed]] = {
    "split": split, "fuse": fuse, "coalesce": coalesce, "reshape": reshape, "permute": permute,
    "interchange": interchange, "tile": tile, "insert_unit": insert_unit,
    "remove_unit": remove_unit,
}

