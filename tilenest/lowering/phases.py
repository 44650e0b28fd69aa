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
  policy, every state under a contract -- a builtin one updated by its
  merge of the state with a state-independent contribution, a custom one by
  its declared ``merge(s, lift(x))`` --, a body without effects, scalar
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

A top-level ``parallel`` whose program body holds such a ``reduce`` may, on
the schedule's request (``reduce_splits``), run it over several programs
per program: :func:`parallel_phases`. A split with a custom contract
commits to a :class:`~tilenest.semantics.trees.RunTree` (``lw.trees``),
which the reference evaluates.

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

import math

from dataclasses import dataclass, field
from typing import Any

from ..semantics import expr as E
from ..semantics.ir import Operation
from ..semantics.reducers import CustomReducer
from ..semantics.trees import RunTree
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
    """Whether ``op`` is a ``reduce`` that may run as partials and a combine
    (module docstring): a tree policy under the schedule's ``auto``, every
    state in a contract group, a builtin state updated by its merge alone, a
    custom group by the declared ``merge(s, lift(x))`` (R-11; its laws are
    required at the legality gate)."""
    from .reductions import contract_groups, merge_ops

    if op.name != "reduce" or not op.attrs["policy"].is_tree:
        return False
    if lw.sched.reduction(op.oid) != "auto":
        return False
    plan = contract_groups(lw, op)
    if plan is None:
        return False
    if not all(isinstance(o.type, TileType) and _fixed(o.type) for o in op.operands):
        return False
    builtin = [j for idx, r in plan if r.__class__ is not CustomReducer for j in idx]
    if len(merge_ops(op)) != len(builtin):
        return False
    body = op.regions[0]
    for j in builtin:
        name = body.args[j].name
        if sum(v.name == name for o in body.walk() for v in o.operands) != 1:
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
            phases.extend(parallel_phases(lw, root[grp.ops[0]], prefix, name_k))
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
        _fold_run(lw, op, c, per, count, bufs, _side_by_side(count), RunTree(per=per))
        lw.facts.pop(mark)
    return L.Phase(f"{lw.prog.name}_{k}", (count,), pid, tuple(body), True)


#: where element ``lin(q)`` of run ``c`` of a state of ``|s|`` elements lies in
#: its scratch buffer: ``place(|s|, lin(q), c)``
Place = Any


def _side_by_side(count: E.Expr) -> Place:
    """A root split's layout: one element's partials side by side
    (``lin(q) * count + c``), so the combine's run loop reads consecutive
    values (a vector loop on a CPU)."""
    return lambda size, q, c: E.mul(q, count) + c


def _per_run(base: E.Expr, count: E.Expr) -> Place:
    """A program split's layout: program ``base``'s run ``c`` holds each state
    whole (``(base * count + c) * |s| + lin(q)``), so the threads of a run's
    program write consecutive elements, and those of the combine read them."""
    return lambda size, q, c: E.mul(E.mul(base, count) + c, size) + q


def _fold_run(lw: Lowerer, op: Operation, c: E.Expr, per: Any, count: E.Expr,
              bufs: list[L.Buffer], place: Place, tree: RunTree, kind: str = "serial"
              ) -> None:
    """Fold run ``c`` (``per`` domain points) of reduce ``op`` from its
    contracts' identities and write element ``q`` of each state to
    ``part[place(|state|, lin(q), c)]`` in a nest of ``kind``; with a custom
    contract the reduce is committed to ``tree`` (the same runs)."""
    from .reductions import contract_groups, identity_of

    plan = contract_groups(lw, op)
    assert plan is not None  # splittable
    if has_custom(plan):
        lw.trees[op.oid] = tree
    for idx, r in plan:
        for n, j in enumerate(idx):
            o = op.operands[j]
            t: TileType = o.type
            lw.env[o.name] = const_handle(constant(identity_of(r, t.dtype, n), t.dtype),
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
            at = place(_size(ext), linear(ext, [q[d] for d in dims]), c)
            lw.emit(L.Store(b, L.IExpr(at), h.at(lw, q)))

        lw.nest(r.type.dims, ext, put, kind=kind)


def _combine(lw: Lowerer, op: Operation, bufs: list[L.Buffer], count: E.Expr,
             place: Place | None = None, kind: str = "serial") -> None:
    """Per state element ``q`` (nests of ``kind``), the partials
    ``part[place(|s|, lin(q), c)]`` (default :func:`_side_by_side`) merged
    into the seed. With builtin contracts only: ``s[q] =
    merge(s[q], part[..c])`` for ``c`` in chunk order from the seed, the merge
    carrying ``reassoc`` for floats (the partials regroup the fold anyway,
    and the policy permits it). With a custom contract (whose merge has no
    closed-form envelope, so the reference evaluates the same tree, its
    :class:`~tilenest.semantics.trees.RunTree`): the partials folded left,
    then merged into the seed, each group jointly (:func:`_fold_runs`)."""
    from .reductions import contract_groups

    plan = contract_groups(lw, op)
    assert plan is not None  # splittable
    custom = has_custom(plan)
    place = place or _side_by_side(count)
    for idx, r in plan:
        types: list[TileType] = [op.results[j].type for j in idx]
        t = max(types, key=lambda x: x.rank)  # the group's widest state
        ext = lw.extents(t)
        dts = [x.dtype for x in types]
        seeds = [lw.handle(op.operands[j]) for j in idx]
        outs = [lw.new_storage(op.results[j].type, op.results[j].name) for j in idx]
        parts = [bufs[j] for j in idx]

        def at(q: Any, n: int, run: E.Expr, types: Any = types) -> E.Expr:
            e_n = lw.extents(types[n])
            return place(_size(e_n), linear(e_n, [q[d] for d in types[n].dims]), run)

        runs = _fold_runs(lw, r, t, types, dts, parts, count, at, kind) if custom else None

        def element(q: Any, seeds: Any = seeds, outs: Any = outs, parts: Any = parts,
                    types: Any = types, dims: Any = t.dims, r: Any = r, dts: Any = dts,
                    idx: Any = idx, runs: Any = runs, at: Any = at) -> None:
            accs = [lw.fresh(f"acc_{op.results[j].name}", dt)
                    for j, dt in zip(idx, dts, strict=True)]
            mine = [{d: q[d] for d in x.dims} for x in types]  # each state's own element
            for a, sd, qq in zip(accs, seeds, mine, strict=True):
                lw.emit(L.Assign(a, sd.at(lw, qq)))
            if runs is not None:  # s = merge(seed, T), T the runs folded left
                with lw.collect() as seeded:
                    tot = [lw.fresh("runs", dt) for dt in dts]
                    for tv, h in zip(tot, runs, strict=True):
                        lw.emit(L.Assign(tv, h.at(lw, q)))
                    _merge_into(lw, r, accs, tot, dts)
                lw.emit(L.If(L.IPred(E.Const(0).lt(count)), tuple(seeded)))
            else:
                dt = dts[0]
                c = lw.fresh("c", L.INDEX)
                flags = frozenset({"reassoc"}) if dt.is_float else frozenset()
                step1 = L.Assign(accs[0], L.Bin(r.op, L.Ref(accs[0]),
                                                L.Load(parts[0], L.IExpr(at(q, 0, E.Var(c.name)))),
                                                dt, flags))
                lw.emit(L.For(c, E.Const(0), count, (step1,), "vector", False))
            for a, out, x, qq in zip(accs, outs, types, mine, strict=True):
                if isinstance(out, VarH):
                    lw.emit(L.Assign(out.var, L.Ref(a)))
                    continue
                st = L.Store(out.buf, L.IExpr(out.offset(qq)), L.Ref(a))
                extra = [q[d] for d in dims if d not in x.dims]
                if extra:  # a narrower state: stored once, at the first element it spans
                    lw.emit(L.If(L.IPred(E.conj([v.eq(0) for v in extra])), (st,)))
                else:
                    lw.emit(st)

        lw.nest(t.dims, ext, element, kind=kind)
        for j, out in zip(idx, outs, strict=True):
            lw.env[op.results[j].name] = out
            lw.def_depth[op.results[j].name] = lw.depth


def _fold_runs(lw: Lowerer, r: Any, t: TileType, types: list[TileType], dts: list[Any],
               parts: list[L.Buffer], count: E.Expr, at: Any, kind: str) -> list[BufH]:
    """The partials of one custom contract group folded left,
    ``T = merge(..merge(p_0, p_1).., p_last)``, into tiles ``T`` of each
    state's own type (``at(q, n, c)``: where component ``n`` of run ``c``
    lies).

    The runs loop is outermost and each of its steps one nest over the
    elements ``q`` of the group's widest state ``t``, so the merges of
    different elements are independent statements of one step (on a SIMT
    target a thread's elements overlap their loads and arithmetic) and every
    element is still folded in run order. The joint merge at ``q`` reads each
    component at ``q``'s projection onto its own dims (the elements of a row
    read one statistic, the same load) and writes the merged components into
    the other version of ``T`` (below), a narrower one only from the first
    element it spans.

    When the narrower components share their dims (the rows), a step first
    runs a nest over the rows: it merges them and keeps, in row tiles, the
    merge values that depend on them alone and that the wider components'
    merge reads (:func:`~.reductions.row_values`: the online-softmax
    rescaling factors); the nest over ``t`` then merges only the wider
    components, reading those values instead of computing them at each
    element of a row. The merging nests read only the version they do not
    write, so either may run again from the same state (a guarded lane
    group's second run).

    Each step first copies its run's components, unchanged, into staging
    tiles of their own types, and the merges read them there: a copy in from
    global memory that the ring of ``double_buffer.py`` can keep a run ahead
    (run ``c + 1`` on its way while run ``c`` merges), where loads inside
    the merges would wait out their latency at every step, twice (the row
    nest's, then the wide one's after its barrier).

    The running state lives in two versions of each tile and the steps take
    turns: step ``c`` reads version ``(count - c) mod 2`` and writes version
    ``(count - 1 - c) mod 2``, so no pass copies the merged state back (and
    no barrier waits for such a copy), and the last step, whatever ``count``
    is, writes version 0: the tiles ``T`` returned.
    Runs only when there is a run (``0 < count``); returns the tiles ``T``."""
    from .reductions import merge_needs, merge_values, merged_names, row_values

    exts = [lw.extents(x) for x in types]
    # version 0 of each running tile; version 1 follows it, ``sizes`` apart
    tot = [BufH(lw.local("runs", dt, (E.Const(2), *e)), x.dims, e)
           for dt, x, e in zip(dts, types, exts, strict=True)]
    sizes = [math.prod(e, start=E.Const(1)) for e in exts]
    stage = [BufH(lw.local("stage", dt, e), x.dims, e) for dt, x, e in zip(dts, types, exts,
                                                                          strict=True)]

    narrow = [n for n, x in enumerate(types) if x.dims != t.dims]
    rows = {types[n].dims for n in narrow}
    held = row_values(r, narrow) if len(rows) == 1 and len(narrow) < len(types) else []
    row_t = types[narrow[0]] if held else t
    dtype_of = {x.name: x.type.dtype for o in r.merge.ops for x in o.results}
    row_ext = lw.extents(row_t)
    kept = {nm: BufH(lw.local("held", dtype_of[nm], row_ext), row_t.dims, row_ext)
            for nm in held}
    outs = merged_names(r)
    k = len(types)
    # a step's nests, each (the tile it runs over, its components): the rows,
    # then the wider ones; with no kept values one nest over t for all
    nests = ([(row_t, narrow), (t, [n for n in range(k) if n not in narrow])] if held
             else [(t, list(range(k)))])

    def wanted(comps: list[int]) -> list[str]:
        """The merge values the nest over ``comps`` computes: its components'
        and, in the row nest, the kept ones (which the other nest is given)."""
        return [outs[n] for n in comps] + (held if held and comps == narrow else [])

    def loaded(comps: list[int]) -> set[int]:
        """The components whose running and run values the nest over ``comps``
        reads (a component that none of its wanted values reads is not)."""
        _, reads = merge_needs(r, wanted(comps), set(kept) if comps != narrow else set())
        return {n for n in range(k) if {r.merge.args[n].name, r.merge.args[k + n].name} & reads}

    read = {tuple(comps): loaded(comps) for _, comps in nests}

    def version(n: int, q: Any, v: E.Expr) -> L.IExpr:
        """Where element ``q`` of version ``v`` of running tile ``n`` lies."""
        return L.IExpr(v * sizes[n] + tot[n].offset(q, lw.facts))

    def merge_at(q: Any, c: E.Expr, comps: list[int]) -> None:
        """Merge run ``c`` (its staged components) into ``T`` at element
        ``q`` for components ``comps``, writing their next version: in the row nest
        (the narrow components) the kept values too; in the nest over ``t``
        (the wider ones) reading them from ``kept``; with no kept values,
        every component at every element of ``t``."""
        want = wanted(comps)
        given = {}
        if held and comps != narrow:
            for nm, h in kept.items():
                v = lw.fresh(nm, dtype_of[nm])
                lw.emit(L.Assign(v, h.at(lw, q)))
                given[nm] = v
        used = read[tuple(comps)]
        acc = [lw.fresh("runs", dt) for dt in dts]
        got = [lw.fresh("part", dt) for dt in dts]
        src = (count - c) % 2
        dst = 1 - src  # the other version, (count - 1 - c) mod 2
        for n, (a, b) in enumerate(zip(acc, got, strict=True)):
            zero = L.Const(0, dts[n])
            lw.emit(L.Assign(a, L.Load(tot[n].buf, version(n, q, src)) if n in used else zero))
            lw.emit(L.Assign(b, stage[n].at(lw, q) if n in used else zero))
        vals = merge_values(lw, r, acc, got, want, given)
        for n in comps:
            x = types[n]
            st = L.Store(tot[n].buf, version(n, q, dst), vals[outs[n]])
            extra = [q[d] for d in t.dims if d not in x.dims and d in q]
            lw.emit(L.If(L.IPred(E.conj([v.eq(0) for v in extra])), (st,)) if extra else st)
        for nm in want[len(comps):]:
            lw.emit(L.Store(kept[nm].buf, L.IExpr(kept[nm].offset(q)), vals[nm]))

    def step(c: E.Expr) -> None:
        for x, comps in nests:
            lw.nest(x.dims, lw.extents(x), lambda q, comps=comps: merge_at(q, c, comps),
                    kind=kind)

    def each(fn: Any) -> None:
        for n, (x, e) in enumerate(zip(types, exts, strict=True)):
            lw.nest(x.dims, e, lambda q, n=n: fn(n, q), kind=kind)

    def first(n: int, q: Any) -> None:
        lw.emit(L.Store(tot[n].buf, version(n, q, (count - 1) % 2),
                        L.Load(parts[n], L.IExpr(at(q, n, E.Const(0))))))

    def staged(c: E.Expr) -> None:
        """Run ``c``'s components that a merge reads, copied into ``stage``."""
        for n in sorted(set().union(*read.values())):
            h = stage[n]
            lw.nest(types[n].dims, exts[n], lambda q, n=n, h=h: lw.emit(L.Store(
                h.buf, L.IExpr(h.offset(q)), L.Load(parts[n], L.IExpr(at(q, n, c))))), kind=kind)

    c = lw.fresh("c", L.INDEX)
    with lw.collect() as body:
        each(first)
        with lw.collect() as steps:
            staged(E.Var(c.name))
            step(E.Var(c.name))
        lw.emit(L.For(c, E.Const(1), count, tuple(steps), "serial", False))
    lw.emit(L.If(L.IPred(E.Const(0).lt(count)), tuple(body)))
    return tot


def has_custom(plan: list[tuple[list[int], Any]]) -> bool:
    """Whether a contract plan holds a custom reducer: its split then commits
    to a :class:`~tilenest.semantics.trees.RunTree` the reference evaluates."""
    return any(isinstance(r, CustomReducer) for _, r in plan)


def _merge_into(lw: Lowerer, r: Any, acc: list[L.LVar], b: list[L.LVar], dts: list[Any]
                ) -> None:
    """``acc = merge(acc, b)`` for custom contract ``r``, jointly."""
    from .reductions import lower_merge

    got = lower_merge(lw, r, acc, b, dts)
    tmps = [lw.fresh("next", dt) for dt in dts]
    for tv, x in zip(tmps, got, strict=True):
        lw.emit(L.Assign(tv, x))
    for a, tv in zip(acc, tmps, strict=True):
        lw.emit(L.Assign(a, L.Ref(tv)))


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


# ---------------------------------------------------------------------------
# a program's reduce split over programs


def program_split(lw: Lowerer, par: Operation) -> int | None:
    """The position in top-level ``parallel`` ``par``'s body of the reduce
    to split over ``reduce_splits`` programs (:func:`parallel_phases`), or
    None: the schedule asks for no split, or no reduce at the top of the
    body is :func:`splittable`, or an op the reduce needs has effects."""
    if lw.sched.reduce_splits <= 1 or par.operands:
        return None
    ops = [o for o in par.regions[0].ops if o.name != "yield"]
    stored = lw.sched.written(lw.prog)
    for j, op in enumerate(ops):
        if not (splittable(lw, op) and any(lw.uses.get(r.name, 0) for r in op.results)):
            continue
        if all(_effect_free(o, stored) for o in _needed(ops[:j], op)):
            return j
    return None


def _needed(before: list[Operation], op: Operation) -> list[Operation]:
    """The ops of ``before`` whose values ``op``'s body reads (not its
    seeds: a run starts from the identity), transitively, in order."""
    defs = {r.name: i for i, o in enumerate(before) for r in o.results}
    seen: set[int] = set()
    work = list(uses(op) - {o.name for o in op.operands})
    while work:
        i = defs.get(work.pop())
        if i is None or i in seen:
            continue
        seen.add(i)
        work.extend(uses(before[i]))
    return [before[i] for i in sorted(seen)]


def parallel_phases(lw: Lowerer, par: Operation, prefix: list[Operation], k: int
                    ) -> list[L.Phase]:
    """The phases of top-level ``parallel`` ``par`` (root ops ``prefix``
    replayed first in every program): one parallel phase, or, when
    :func:`program_split` finds a reduce to split, two.

    With ``S = reduce_splits``, ``n`` domain points and ``per = ceil(n /
    S)``, the reduce's points form ``R = ceil(n / per)`` runs:

    * **partials**: ``P * R`` programs (``P`` those of ``par``); program
      ``(p, c)`` computes the values of ``p``'s body the reduce reads (they
      have no effects), folds run ``c`` from the contracts' identities and
      writes each state element to a scratch buffer;
    * **combine**: ``P`` programs running ``p``'s body in order, the reduce
      replaced by merging, per state element, its seed with the ``R``
      partials in run order.

    Each partial folds a contiguous run of the reference fold's leaves, so
    the combine evaluates one of the merge trees a tree policy admits
    (R-6); the laws that make it the same value are the legality gate's."""
    from .regions import lower_phase_parallel

    j = program_split(lw, par)
    if j is None:
        return [lower_phase_parallel(lw, par, prefix, k)]
    red = [o for o in par.regions[0].ops if o.name != "yield"][j]
    exts = tuple(lw.ix(x) for x in par.attrs["domain"].space.extents)
    n = _size(tuple(lw.ix(x) for x in red.attrs["domain"].space.extents))
    per = E.maximum(E.cdiv(n, E.Const(lw.sched.reduce_splits)), 1)
    count = E.cdiv(n, per)
    programs = _size(exts)
    bufs = [_new_scratch(lw, f"part_{r.name}", r.type.dtype,
                         E.mul(E.mul(programs, count), _size(lw.extents(r.type))))
            for r in red.results]
    first = _split_partials(lw, par, red, prefix, exts, per, count, bufs, k)

    def combine(lw_: Lowerer, op: Operation) -> None:
        base = linear(exts, [lw.ivars[v] for v in par.attrs["vars"]])
        _combine(lw, op, bufs, count, _per_run(base, count), kind="vector")

    dead = _only_for(par, red)
    lw.instead[red.oid] = combine
    for o in dead:
        lw.instead[o.oid] = _skip
    try:
        second = lower_phase_parallel(lw, par, prefix, k + 1)
    finally:
        for o in [red, *dead]:
            del lw.instead[o.oid]
    return [first, second]


def _only_for(par: Operation, red: Operation) -> list[Operation]:
    """The ops of ``par``'s body before ``red`` that the combine phase need not
    run: ones with results, none of which anything but ``red``'s body reads
    (directly or through other such ops; its seeds and its domain stay
    live), and without effects of their own (no store, no nested
    ``parallel``). The partials phase computed what ``red``'s body read from
    them; the combine merges its partials instead."""
    body = list(par.regions[0].ops)
    j = body.index(red)
    live = {o.name for o in red.operands} | {n for v in red.attrs.values() for n in _vals(v)}
    for o in body[j + 1:]:
        live |= uses(o)
    dead: list[Operation] = []
    for o in reversed(body[:j]):
        if o.results and _pure(o) and not any(r.name in live for r in o.results):
            dead.append(o)
        else:
            live |= uses(o)
    return dead


def _pure(op: Operation) -> bool:
    """Whether leaving ``op`` out changes nothing but its results."""
    if op.name in ("tensor.store", "memory.store", "parallel"):
        return False
    return all(_pure(o) for r in op.regions for o in r.ops if o.name != "yield")


def _skip(lw: Lowerer, op: Operation) -> None:
    """A rule that lowers nothing (an op :func:`_only_for` leaves out)."""


def _split_partials(lw: Lowerer, par: Operation, red: Operation, prefix: list[Operation],
                    exts: tuple[E.Expr, ...], per: E.Expr, count: E.Expr,
                    bufs: list[L.Buffer], k: int) -> L.Phase:
    """The partials phase of :func:`parallel_phases`: the run index is the
    fastest-varying coordinate, so a program's runs are neighbours."""
    dom = par.attrs["domain"]
    ops = [o for o in par.regions[0].ops if o.name != "yield"]
    need = _needed(ops[:ops.index(red)], red)
    pid = lw.fresh("pid", L.INDEX)
    with lw.collect() as body:
        for p in prefix:
            lw.lower_op(p)
        coords = L.delinearize(E.Var(pid.name), exts + (count,))
        mark = lw.facts.push([])
        for v, x, ext in zip(par.attrs["vars"], coords, exts, strict=False):
            cv = lw.fresh(v, L.INDEX)
            lw.emit(L.Assign(cv, L.IExpr(x)))
            lw.ivars[v] = E.Var(cv.name)
            lw.facts.push([E.Var(cv.name).ge(0), E.Var(cv.name).lt(ext)])
        run = lw.fresh("run", L.INDEX)
        lw.emit(L.Assign(run, L.IExpr(coords[-1])))
        c = E.Var(run.name)
        lw.facts.push([c.ge(0), c.lt(count)])
        pred = lw.ix(dom.pred)
        with lw.collect() as inner:
            if pred != E.TRUE:
                lw.facts.push([pred])
            for o in need:
                lw.lower_op(o)
            base = linear(exts, [lw.ivars[v] for v in par.attrs["vars"]])
            _fold_run(lw, red, c, per, count, bufs, _per_run(base, count),
                      RunTree(splits=lw.sched.reduce_splits), kind="vector")
        lw.facts.pop(mark)
        if pred != E.TRUE and inner:
            lw.emit(L.If(L.IPred(pred), tuple(inner)))
        else:
            lw.emit(*inner)
    return L.Phase(f"{lw.prog.name}_{k}", exts + (count,), pid, tuple(body), True)
