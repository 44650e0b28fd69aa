"""Phases of a kernel whose root holds effects besides its top-level ``parallel`` s.

The root of a program runs in program order; a phase boundary is a full
barrier (every program of one phase finishes before the next phase starts),
so cutting the root into consecutive phases keeps its meaning as long as
each phase runs its part of the root in order. The cut:

* each top-level ``parallel`` without carried values is a **parallel phase**
  (its programs are its domain points, ``regions.lower_phase_parallel``);
* the other root ops with effects (stores, loads of tensors the kernel
  writes, ``parallel`` s with carried values, loops holding them...) form
  **ordered phases** of one program: a maximal run of them between two
  parallel phases is one phase;
* root ops without effects that read no tensor the kernel writes
  (*replayable*) are placed nowhere: every phase that needs one (directly
  or through another replayable op) computes it again, in program order
  among its own ops. Their value does not depend on when they run. An
  unused one runs in the ordered phase of its place (a checked access
  still reports its error);
* a root ``reduce`` that may be regrouped (:func:`splittable`: a tree
  policy, built-in contracts, every update the contract's merge of the state
  with a state-independent contribution, a body without effects, scalar
  states or tile states of extents fixed per call, a domain of any number of
  axes) becomes a **partials phase** -- program ``c`` folds the ``c``-th run
  of :func:`points_per_program` domain points, in lexicographic order (a
  multi-axis domain flattened), starting from the merge's identity, each
  state in a tile of its own -- and the start of the ordered phase after it,
  which merges, element by element, the seed with the partials in chunk
  order. Each partial is a contiguous part of the reference fold and the
  merge is elementwise, so the result is a regrouping of the fold of every
  element: admitted by both tree policies (R-5/R-6), never applied to
  ``fold_left`` / ``fold_right`` or to a schedule asking for a
  ``sequential`` reduction.

A value an ordered phase defines and a later phase reads crosses the
boundary in a **scratch buffer**: global memory of the kernel
(``Param.kind == "scratch"``), written right after its definition and read
by every later phase that needs it (the runtime of each backend allocates
it per call). Partials live in scratch too. When a crossing value has no
fixed size (a memory state, or extents read from data),
:func:`lower_phases` returns None and the caller keeps the whole root in one
ordered phase.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..semantics import expr as E
from ..semantics.ir import Operation
from ..semantics.reducers import BUILTINS
from ..semantics.types import TileType
from . import loopir as L
from .core import Lowerer, _effect_free
from .handles import BufH, LazyH, VarH, const_handle, linear
from .values import constant

#: elements of work per program of a partials phase (64 KiB of f32: enough
#: to hide the phase's start, few enough partials to merge)
CHUNK = 1 << 14


def uses(op: Operation) -> set[str]:
    """Names of every value ``op`` reads: operands, data-dependent indices in
    its attributes and domains, and the same inside its regions."""
    out = {o.name for o in op.operands}
    for v in op.attrs.values():
        out.update(_vals(v))
    for r in op.regions:
        for inner in r.ops:
            out |= uses(inner)
    return out


def _vals(v: Any) -> list[str]:
    if isinstance(v, (E.Expr, E.Pred)):
        return [lf.name for lf in E.leaves(v) if isinstance(lf, E.Val)]
    if isinstance(v, (tuple, list)):
        return [n for x in v for n in _vals(x)]
    space = getattr(v, "space", None)
    if space is not None and hasattr(v, "pred"):  # an IndexSet
        return _vals(tuple(space.extents)) + _vals(v.pred)
    return []


#: op names with effects a split ``reduce`` body must not hold (its partials
#: programs run at the same time)
_EFFECTS = frozenset({"tensor.store", "memory.alloc", "memory.store", "memory.load", "parallel"})

#: elements assumed for a symbolic extent when sizing a program's work
SYM_GUESS = 64


def splittable(lw: Lowerer, op: Operation) -> bool:
    """Whether root op ``op`` is a ``reduce`` that may run as partials and a
    combine (module docstring)."""
    from .reductions import merge_ops

    if op.name != "reduce" or not op.attrs["policy"].is_tree:
        return False
    if lw.sched.reduction(op.oid) != "auto":
        return False
    contracts = op.attrs["contracts"]
    if any(c not in BUILTINS for c in contracts):
        return False
    if not all(isinstance(o.type, TileType) and _fixed(o.type) for o in op.operands):
        return False
    if len(merge_ops(op)) != len(op.operands):
        return False
    body = op.regions[0]
    readers = [o for o in body.walk() for v in o.operands if v.name in
               {a.name for a in body.args}]
    if len(readers) != len(body.args):
        return False  # a state read besides its merge (a check there sees other values)
    if any(o.name in _EFFECTS for o in op.regions[0].walk()):
        return False
    inside = uses(op) - {o.name for o in op.operands}
    if any(o.name in inside for o in op.operands):
        return False  # a seed read by the body too: partials start from the identity
    if any(x == E.Const(0) for x in op.attrs["domain"].space.extents):
        return False  # empty: nothing to split (and no division by the empty axis)
    return not _vals(op.attrs["domain"])


def _fixed(t: TileType) -> bool:
    """Whether ``t`` has extents fixed per call (no region or data index)."""
    return not any(isinstance(lf, (E.Var, E.Val)) for x in t.extents for lf in E.leaves(x))


def _elements(exts: Any) -> int:
    n = 1
    for x in exts:
        n *= x.value if isinstance(x, E.Const) else SYM_GUESS
    return n


def _work(ops: Any) -> int:
    """Elements of the largest tile one run of ``ops`` computes (a nested
    region counts its body's times its domain's points)."""
    most = 1
    for o in ops:
        for r in o.results:
            if isinstance(r.type, TileType):
                most = max(most, _elements(r.type.extents))
        dom = o.attrs.get("domain") if hasattr(o.attrs, "get") else None
        points = _elements(dom.space.extents) if dom is not None else 1
        for reg in o.regions:
            most = max(most, points * _work(reg.ops))
    return most


def points_per_program(op: Operation) -> int:
    """Domain points one program of ``op``'s partials phase folds: about
    :data:`CHUNK` elements of work (the largest tile a domain point computes,
    symbolic extents counted as :data:`SYM_GUESS`), at least one point."""
    return max(1, CHUNK // _work(op.regions[0].ops))


@dataclass
class _Group:
    """One phase to be: ``kind`` is ``parallel``, ``ordered`` or ``partials``;
    ``ops`` the root positions it runs (replayed ops come on top)."""

    kind: str
    ops: list[int]
    need: list[int] = field(default_factory=list)
    inputs: set[str] = field(default_factory=set)


def _groups(lw: Lowerer, root: list[Operation], stored: set[str]) -> tuple[list[_Group], set[int]]:
    """The phases in program order and the root positions of the split reduces."""
    groups: list[_Group] = []
    split: set[int] = set()
    cur: _Group | None = None
    for i, op in enumerate(root):
        if op.name == "parallel" and not op.operands:
            groups.append(_Group("parallel", [i]))
            cur = None
            continue
        tree = splittable(lw, op) and any(lw.uses.get(r.name, 0) for r in op.results)
        if tree:
            split.add(i)
            groups.append(_Group("partials", [i]))
            cur = _Group("ordered", [i])  # the combine opens the next ordered phase
            groups.append(cur)
            continue
        if _effect_free(op, stored) and any(lw.uses.get(r.name, 0) for r in op.results):
            continue  # replayed where needed; an unused one still runs in order
        if cur is None:
            cur = _Group("ordered", [])
            groups.append(cur)
        cur.ops.append(i)
    return groups, split


def _plan(root: list[Operation], groups: list[_Group], split: set[int]) -> set[str]:
    """Fill each group's ``need`` (the root positions it lowers, in program
    order) and ``inputs`` (values of earlier phases it reads); returns every
    value that crosses a phase boundary. The combine of a split reduce reads
    only its seeds (its body ran in the partials phase)."""
    defs = {r.name: i for i, op in enumerate(root) for r in op.results}
    home: dict[int, int] = {}
    for g, grp in enumerate(groups):
        if grp.kind == "ordered":
            for i in grp.ops:
                home[i] = g
    crossing: set[str] = set()
    for g, grp in enumerate(groups):
        need: set[int] = set() if grp.kind == "partials" else set(grp.ops)
        work = [n for i in grp.ops for n in (
            [o.name for o in root[i].operands] if i in split and grp.kind == "ordered"
            else uses(root[i]))]
        while work:
            n = work.pop()
            j = defs.get(n)
            if j is None or j in need:
                continue
            if j in home:
                if home[j] != g:
                    grp.inputs.add(n)
                    crossing.add(n)
                continue
            need.add(j)  # replayable: computed again here
            work.extend(uses(root[j]))
        grp.need = sorted(need)
    return crossing


def _scratch_ok(lw: Lowerer, root: list[Operation], names: set[str]) -> bool:
    types = {r.name: r.type for op in root for r in op.results}
    for n in names:
        t = types[n]
        if not isinstance(t, TileType):
            return False
        if any(isinstance(lf, (E.Var, E.Val)) for x in t.extents for lf in E.leaves(x)):
            return False
    return True


def _new_scratch(lw: Lowerer, base: str, dtype: Any, size: E.Expr) -> L.Buffer:
    """A kernel scratch buffer of ``size`` elements (a hidden parameter)."""
    lw.count += 1
    buf = L.Buffer(f"%{base}.{lw.count}", dtype, "global", size, len(lw.params))
    lw.params.append(L.Param(buf.name, "scratch", dtype, (size,)))
    lw.globals.append(buf)
    return buf


def _size(ext: tuple[E.Expr, ...]) -> E.Expr:
    size: E.Expr = E.Const(1)
    for x in ext:
        size = E.mul(size, x)
    return size


def lower_phases(lw: Lowerer, root: list[Operation], stored: set[str]) -> list[L.Phase] | None:
    """The phases of ``root`` (module docstring), or None when a value that
    would cross a phase boundary cannot be kept in scratch."""
    from .regions import lower_phase_parallel

    groups, split = _groups(lw, root, stored)
    crossing = _plan(root, groups, split)
    if not _scratch_ok(lw, root, crossing):
        return None
    types = {r.name: r.type for op in root for r in op.results}
    scratch: dict[str, BufH | L.Buffer] = {}
    for n in sorted(crossing):
        t: TileType = types[n]
        ext = lw.extents(t)
        buf = _new_scratch(lw, f"keep_{n}", t.dtype, _size(ext))
        scratch[n] = buf if t.rank == 0 else BufH(buf, t.dims, ext)
    lw.kept = dict(scratch)
    base = dict(lw.env)
    parts: dict[int, tuple[list[L.Buffer], E.Expr]] = {}
    phases: list[L.Phase] = []
    for grp in groups:
        lw.env = dict(base)
        for n in grp.inputs:
            lw.env[n] = _reader(scratch[n])
        name_k = len(phases)
        if grp.kind == "parallel":
            prefix = [root[i] for i in grp.need if i not in grp.ops]
            phases.append(lower_phase_parallel(lw, root[grp.ops[0]], prefix, name_k))
        elif grp.kind == "partials":
            phases.append(_partials(lw, root, grp, parts, name_k))
        else:
            ph = _ordered(lw, root, grp, split, parts, scratch, crossing, name_k)
            if ph.body:  # (unused ops may emit nothing)
                phases.append(ph)
    lw.env = base
    return phases


def _reader(s: BufH | L.Buffer) -> Any:
    """The handle of a value read back from its scratch buffer."""
    if isinstance(s, BufH):
        return s
    ld = L.Load(s, L.IExpr(E.Const(0)))
    return LazyH(s.dtype, (), (), lambda lw_, q, ld=ld: ld, cheap=True)


def _partials(lw: Lowerer, root: list[Operation], grp: _Group,
              parts: dict[int, tuple[list[L.Buffer], E.Expr]], k: int) -> L.Phase:
    """Program ``c`` folds its run of :func:`points_per_program` domain points
    (lexicographic order) from the merge's identity, each state in a tile of
    its own, and writes element ``q`` of each state's partial to
    ``part[lin(q) * P + c]`` (``P`` programs: one state's partials of an
    element lie side by side for the combine)."""
    (i,) = grp.ops
    op = root[i]
    per = points_per_program(op)
    n = _size(tuple(lw.ix(x) for x in op.attrs["domain"].space.extents))
    count = E.cdiv(n, per)
    bufs = [_new_scratch(lw, f"part_{r.name}", r.type.dtype,
                         E.mul(count, _size(lw.extents(r.type)))) for r in op.results]
    parts[i] = (bufs, count)
    pid = lw.fresh("pid", L.INDEX)
    c = E.Var(pid.name)
    with lw.collect() as body:
        mark = lw.facts.push([c.ge(0), c.lt(count)])
        for j in grp.need:
            lw.lower_op(root[j])
        for o, name in zip(op.operands, op.attrs["contracts"], strict=True):
            t: TileType = o.type
            lw.env[o.name] = const_handle(constant(BUILTINS[name].identity(t.dtype), t.dtype),
                                          t.dims, lw.extents(t))
        lw.chunks[op.oid] = (E.mul(c, per), E.mul(c, per) + per)
        try:
            lw.lower_op(op)
        finally:
            del lw.chunks[op.oid]
        for r, b in zip(op.results, bufs, strict=True):
            h, ext = lw.handle(r), lw.extents(r.type)

            def put(q: Any, h: Any = h, b: L.Buffer = b, ext: Any = ext, dims: Any = r.type.dims
                    ) -> None:
                at = E.mul(linear(ext, [q[d] for d in dims]), count) + c
                lw.emit(L.Store(b, L.IExpr(at), h.at(lw, q)))

            lw.nest(r.type.dims, ext, put, kind="serial")
        lw.facts.pop(mark)
    return L.Phase(f"{lw.prog.name}_{k}", (count,), pid, tuple(body), True)


def _combine(lw: Lowerer, op: Operation, bufs: list[L.Buffer], count: E.Expr) -> None:
    """Per state element ``q``: ``s[q] = merge(s[q], part[lin(q) * P + c])``
    for ``c`` in chunk order from the seed; the merge carries ``reassoc`` for
    floats (the partials regroup the fold anyway, and the policy permits
    it)."""
    for o, r, b, name in zip(op.operands, op.results, bufs, op.attrs["contracts"], strict=True):
        t: TileType = r.type
        dt, ext = t.dtype, lw.extents(t)
        seed = lw.handle(o)
        out = lw.new_storage(t, r.name)
        flags = frozenset({"reassoc"}) if dt.is_float else frozenset()

        def element(q: Any, seed: Any = seed, out: Any = out, b: L.Buffer = b, ext: Any = ext,
                    dims: Any = t.dims, name: str = name, dt: Any = dt, flags: Any = flags
                    ) -> None:
            acc = lw.fresh(f"acc_{r.name}", dt)
            lw.emit(L.Assign(acc, seed.at(lw, q)))
            c = lw.fresh("c", L.INDEX)
            at = E.mul(linear(ext, [q[d] for d in dims]), count) + E.Var(c.name)
            step = L.Assign(acc, L.Bin(BUILTINS[name].op, L.Ref(acc),
                                       L.Load(b, L.IExpr(at)), dt, flags))
            lw.emit(L.For(c, E.Const(0), count, (step,), "vector", False))
            if isinstance(out, VarH):
                lw.emit(L.Assign(out.var, L.Ref(acc)))
            else:
                lw.emit(L.Store(out.buf, L.IExpr(out.offset(q)), L.Ref(acc)))

        lw.nest(t.dims, ext, element, kind="serial")
        lw.env[r.name] = out
        lw.def_depth[r.name] = lw.depth


def _ordered(lw: Lowerer, root: list[Operation], grp: _Group, split: set[int],
             parts: dict[int, tuple[list[L.Buffer], E.Expr]], scratch: dict[str, Any],
             crossing: set[str], k: int) -> L.Phase:
    """One program running the group's ops in program order; each crossing
    value it defines is written to its scratch buffer right away."""
    pid = lw.fresh("pid", L.INDEX)
    mine = set(grp.ops)
    with lw.collect() as body:
        for j in grp.need:
            op = root[j]
            if j in split and j in mine:
                _combine(lw, op, *parts[j])
            else:
                lw.lower_op(op)
            if j not in mine:
                continue
            for r in op.results:
                if r.name in crossing and lw.handle(r) is not scratch[r.name]:
                    _keep(lw, lw.handle(r), scratch[r.name])
    return L.Phase(f"{lw.prog.name}_{k}", (E.Const(1),), pid, tuple(body), False)


def _keep(lw: Lowerer, h: Any, dst: BufH | L.Buffer) -> None:
    if isinstance(dst, BufH):
        lw.store_into(h, dst)
    else:
        lw.emit(L.Store(dst, L.IExpr(E.Const(0)), h.at(lw, {})))
