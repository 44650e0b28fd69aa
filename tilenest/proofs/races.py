"""Race obligations beyond storage noninterference: ancestor-value joins (E-11)
and unordered pipeline iterations (P-7).

Together with ``noninterference`` (E-10, :mod:`tilenest.proofs.program`) these
are the *race obligations* of a program: each states that no execution the
program admits has two unordered actors touching one element with a write.
A refutation is a race the interpreter reports on some call; a compiled
target, which cannot observe races while running, refuses a program whose
race obligation is refuted (see ``spec/lowering.md``, "The schedule").

**Ancestor-value joins** (``noninterference.join``, E-11). For a ``parallel``
region ``Q`` carrying a Tile value ``v`` (a region operand), each child ends
with a *footprint*: the union of the boxes ``[o, o + shape(p))`` of the
``put`` ops applied to ``v`` and, for any other op that derives ``v`` from the
entry snapshot and is anchored at ``Q``'s level or deeper (a per-child update),
the whole space of ``v``; a nested ``parallel`` contributes the union of its
children's footprints; collective updates (anchored above ``Q``) contribute
nothing, being the same in every child. With the footprint written as a union
of *pieces* ``F_k(o, q, u)`` (``o`` the enclosing coordinates, ``q`` the child,
``u`` the coordinates of the regions between ``Q`` and the piece's op), the
obligation for each pair of pieces ``k``, ``l`` is::

    forall o, q, q', u, u', c:  q != q' and c in box(v) and
        active_k(o, q, u) and c in F_k(o, q, u) and active_l(o, q', u') and c in F_l(o, q', u')
        =>  false

A refutation names both children, the coordinate of ``v`` and both ops.

**Pipelines** (``noninterference.pipeline``, P-7). Within a pipeline of ``S``
stages, window ``W`` and carried-value edges ``p -> s`` (the last definition of
a carried value in stage ``p`` of iteration ``i`` precedes its use in stage
``s`` of iteration ``i + 1``), stage ``a`` of iteration ``i`` happens before
stage ``b`` of iteration ``i + d`` (``d >= 1``) when ``W >= 1`` and
``d >= W`` (P-6: at most ``W`` consecutive iterations are in flight), or when
a chain of carried edges leads there: ``b >= f_a(d)`` with ``f_a(0) = a``,
``f_a(d + 1) = min {s : p -> s carried, p >= f_a(d)}``. ``f_a`` is monotone and
constant after at most ``S + 1`` steps, so "unordered at distance ``d``" is a
finite union of equalities and one ray in ``d``. For accesses ``x`` in stage
``a`` and ``y`` in stage ``b`` to one object, at least one a write, with
``d`` the distance of their (row-major) iteration indices::

    forall o, k, k', u, u':  d = lin(k') - lin(k) >= 1 and unordered_ab(d) and
        x(o, k, u) active and y(o, k', u') active  =>  elem_x != elem_y

Accesses whose index or guard depends on data make a conflict ``unknown``
(the statement over-approximates the program), never a refutation; a proof
over an over-approximation still holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..semantics import expr as E
from ..semantics.ir import Operation
from ..semantics.types import TileType
from . import formula as Fm
from .model import Access, Instance, Model, VarInfo, op_ref
from .obligation import Obligation

JOIN = "noninterference.join"
PIPELINE = "noninterference.pipeline"
#: every obligation kind whose refutation is a race
RACE_KINDS = ("noninterference", JOIN, PIPELINE)

_TEMPORAL = ("serial", "pipeline", "reduce", "while")


# ---------------------------------------------------------------------------
# ancestor-value joins


@dataclass(frozen=True)
class Piece:
    """One part of a child's footprint: the box written by a ``put`` op, or
    the whole value for another per-child update ``op``."""

    op: Operation
    origin: tuple[E.Expr, ...] | None  # None: the whole space
    extents: tuple[E.Expr, ...] = ()


class _Tracer:
    """Footprint pieces of the values yielded by one ``parallel`` region,
    following the interpreter's footprint rules (see the module docstring)."""

    def __init__(self, m: Model, q: Operation):
        self.m, self.q = m, q
        self.depth = m.an.nest.depth(q.attrs["level"])
        self.args = {a.name for a in q.regions[0].args}
        self.memo: dict[str, tuple[bool, tuple[Piece, ...]]] = {}

    def anchor_depth(self, op: Operation) -> int:
        return self.m.an.nest.depth(self.m.an.anchor[op.oid])

    def value_depth(self, name: str) -> int:
        return self.m.an.nest.depth(self.m.an.value_anchor.get(name, 0))

    def top(self, name: str, arg: str) -> tuple[Piece, ...]:
        """The footprint of the value ``name`` yielded for region argument ``arg``."""
        if name == arg:
            return ()
        derived, pieces = self.trace(name)
        if not derived and self.value_depth(name) >= self.depth:
            d = self.m.defs.get(name)
            return (Piece(d, None),) if d is not None else ()
        return pieces

    def trace(self, name: str) -> tuple[bool, tuple[Piece, ...]]:
        """(is ``name`` derived from an entry snapshot, its footprint pieces)."""
        if name in self.memo:
            return self.memo[name]
        self.memo[name] = (False, ())  # cycles through carried values: no new pieces
        got = self._trace(name)
        self.memo[name] = got
        return got

    def _union(self, names: list[str], fresh: bool = False) -> tuple[bool, tuple[Piece, ...]]:
        """Union of the footprints of ``names``; with ``fresh`` (values flowing
        out of a nested region), a per-child value not derived from an entry
        snapshot is a whole-value update."""
        derived, pieces = False, []
        for n in names:
            d, ps = self.trace(n)
            if fresh and not d and n not in self.args and self.value_depth(n) >= self.depth:
                src = self.m.defs.get(n)
                ps = (Piece(src, None),) if src is not None else ()
            derived |= d
            pieces += [p for p in ps if p not in pieces]
        return derived, tuple(pieces)

    def _trace(self, name: str) -> tuple[bool, tuple[Piece, ...]]:
        if name in self.args:
            return True, ()
        op = self.m.defs.get(name)
        if op is None:
            return False, ()
        if name not in {r.name for r in op.results}:
            # a region argument of a nested region
            return self._region_arg(op, name)
        k = [r.name for r in op.results].index(name)
        if op.name == "put":
            d, ps = self.trace(op.operands[0].name)
            if self.anchor_depth(op) < self.depth and not ps:
                return d, ()  # a collective put: one update of the ancestor value
            ext: tuple[E.Expr, ...] = tuple(getattr(op.operands[1].type, "extents", ()))
            box = Piece(op, tuple(op.attrs["origin"]), ext)
            return d, (ps if d else ()) + (box,)
        if op.name == "if":
            ys = [r.terminator.operands[k].name for r in op.regions if r.terminator is not None]
            return self._union(ys, fresh=True)
        if op.name == "stage":
            y = op.regions[0].terminator
            return self._union([y.operands[k].name], fresh=True) if y is not None \
                else (False, ())
        if op.name in _TEMPORAL:
            names = [op.operands[k].name] if k < len(op.operands) else []
            y = op.regions[-1].terminator
            if y is not None and k < len(y.operands):
                names.append(y.operands[k].name)
            return self._union(names, fresh=True)
        if op.name == "parallel":
            inner = _Tracer(self.m, op)
            y = op.regions[0].terminator
            arg = op.regions[0].args[k].name if k < len(op.regions[0].args) else ""
            inner_ps = inner.top(y.operands[k].name, arg) if y is not None else ()
            if not inner_ps:
                # no child of the nested region updates it: its result is a fresh
                # value (a whole update when it is anchored at or below this level)
                return False, ()
            d, ps = self.trace(op.operands[k].name) if k < len(op.operands) else (False, ())
            return True, ps + tuple(p for p in inner_ps if p not in ps)
        if op.regions:
            # an unfamiliar region op: a whole update wherever it runs
            d, _ = self._union([o.name for o in op.operands])
            return d, ((Piece(op, None),) if d and self.anchor_depth(op) >= self.depth else ())
        d, ps = self._union([o.name for o in op.operands])
        if not d:
            return False, ()
        if self.anchor_depth(op) >= self.depth:
            return True, ps + (Piece(op, None),)
        return True, ps

    def _region_arg(self, op: Operation, name: str) -> tuple[bool, tuple[Piece, ...]]:
        for r in op.regions:
            names = [a.name for a in r.args]
            if name in names:
                k = names.index(name)
                srcs = [op.operands[k].name] if k < len(op.operands) else []
                if op.name in _TEMPORAL and r.terminator is not None \
                        and k < len(r.terminator.operands):
                    srcs.append(r.terminator.operands[k].name)
                return self._union(srcs)
        return False, ()


def joins(m: Model) -> list[Obligation]:
    """E-11 for every ``parallel`` region carrying a Tile value."""
    out: list[Obligation] = []
    for q in m.ops("parallel"):
        body = q.regions[0]
        y = body.terminator
        if y is None or not q.operands:
            continue
        tracer = _Tracer(m, q)
        outer = m.instance(q)
        shared = set(outer.vars)
        qv = list(q.attrs["vars"])
        qa = [E.Var(v) for v in qv]
        qb = [E.Var(v + "'") for v in qv]
        for j, (operand, arg) in enumerate(zip(q.operands, body.args, strict=False)):
            vt = operand.type
            if not isinstance(vt, TileType) or j >= len(y.operands):
                continue
            pieces = tracer.top(y.operands[j].name, arg.name)
            if not pieces:
                continue
            cv = [f"c{d}@{operand.name}" for d in range(vt.rank)]
            cx = [E.Var(c) for c in cv]
            box = Fm.in_box(cx, vt.extents)
            for i, pa in enumerate(pieces):
                for pb in pieces[i:]:
                    out.append(_join_obligation(m, q, operand.name, outer, shared, qv, qa, qb,
                                                cv, cx, box, pa, pb))
    return out


def _piece_formula(m: Model, p: Piece, suffix: str, shared: set[str], cx: list[E.Var]
                   ) -> tuple[Instance, Fm.F]:
    inst = m.instance(p.op, suffix, shared)
    if p.origin is None:
        return inst, inst.constraint
    ren: dict[E.Expr, E.IntLike] = {E.Var(a): E.Var(b) for a, b in
                                     m.renaming(p.op, suffix, shared).items()}
    parts = [inst.constraint]
    for c, o, n in zip(cx, p.origin, p.extents, strict=False):
        o2 = E.subst(E.lift(o), ren)
        n2 = E.subst(E.lift(n), ren)
        parts.append(Fm.atom(c.ge(o2)))
        parts.append(Fm.atom(c.lt(o2 + n2)))
    return inst, Fm.conj(*parts)


def _join_obligation(m: Model, q: Operation, vname: str, outer: Instance, shared: set[str],
                     qv: list[str], qa: list, qb: list, cv: list[str], cx: list[E.Var],
                     box: Fm.F, pa: Piece, pb: Piece) -> Obligation:
    ia, fa = _piece_formula(m, pa, "", shared, cx)
    ib, fb = _piece_formula(m, pb, "'", shared, cx)
    hyp = Fm.conj(outer.constraint, box, fa, fb, Fm.differs(qa, qb))
    info = {**outer.info, **ia.info, **ib.info}
    for v in qv:
        info[v + "'"] = VarInfo(info[v].label + "'", "second instance") \
            if v in info else VarInfo(v + "'")
    for d, c in enumerate(cv):
        info[c] = VarInfo(f"%{vname}[{d}]")
    inexact = "; ".join(ia.why_inexact + ib.why_inexact)

    def what(p: Piece) -> str:
        return op_ref(p.op) + ("" if p.origin is not None
                                                 else ", a whole-value update")

    def explain(pt: dict) -> list[str]:
        inst_a = ", ".join(f"{info[v].label}={pt.get(v)}" for v in qv)
        inst_b = ", ".join(f"{info[v + chr(39)].label}={pt.get(v + chr(39))}" for v in qv)
        elem = ", ".join(str(pt.get(c)) for c in cv)
        return [(f"instance ({inst_a}) updates element [{elem}] of ancestor value %{vname} "
                f"({what(pa)})"),
                f"instance ({inst_b}) updates the same element ({what(pb)})",
                ("overlapping per-child updates have no combiner (E-11): write the "
                "accumulation as a reduce region, or make the patches disjoint")]

    return Obligation(
        JOIN, f"level {q.attrs['level']}: two children never update one element of the "
        f"ancestor value %{vname}", m.sites(pa.op, pb.op, q),
        Fm.Claim(Fm.ordered_vars(hyp), hyp, Fm.FALSE, m.assumptions),
        info=info, explain=explain, refutable=not inexact, inexact_note=inexact,
        unknown_note="holds by the join contract, not proved",
        witness={"level": q.attrs["level"], "value": vname, "pieces": (pa, pb),
                 "program": m.p})


# ---------------------------------------------------------------------------
# pipelines


def _carried_edges(pipe: Operation) -> tuple[list[Operation], set[tuple[int, int]]]:
    from .phases import stage_graph

    stages, edges, _ = stage_graph(pipe)
    if not stages:
        return [], ({(0, 0)} if _whole_body_carries(pipe.regions[0]) else set())
    return stages, {(e.producer, e.consumer) for e in edges if e.distance == 1}


def _whole_body_carries(body) -> bool:  # type: ignore[no-untyped-def]
    """A pipeline body without stages is one stage; a carried value (or Memory
    state) it uses and redefines orders each iteration after the previous one."""
    from .phases import _vals

    y = body.terminator
    if y is None:
        return False
    used: set[str] = set()
    for op in body.walk():
        used |= {o.name for o in op.operands}
        used |= {lf.name for v in op.attrs.values() for lf in _vals(v)}
    return any(a.name in used and v.name != a.name
               for a, v in zip(body.args, y.operands, strict=False))


def reach_profile(a: int, n_stage: int, carried: set[tuple[int, int]]) -> list[float]:
    """``[f_a(0), f_a(1), ..., f_a(T)]``: the least stage of iteration ``i + d``
    that stage ``a`` of iteration ``i`` reaches through carried edges (``inf``:
    none); constant from ``T`` on."""
    inf = float("inf")
    f: list[float] = [a]
    for _ in range(n_stage + 2):
        cur = f[-1]
        nxt = min((s for p, s in carried if p >= cur), default=inf)
        f.append(nxt)
        if nxt == cur:
            break
    return f


def unordered_distances(a: int, b: int, n_stage: int, carried: set[tuple[int, int]],
                        window: int) -> tuple[list[int], int | None]:
    """Distances ``d >= 1`` at which stage ``b`` of iteration ``i + d`` is not
    ordered after stage ``a`` of iteration ``i``: an explicit list, plus ``r``
    when every ``d >= r`` is unordered (``None``: no such ray)."""
    if window == 1:
        return [], None
    f = reach_profile(a, n_stage, carried)
    t = len(f) - 1
    explicit = [d for d in range(1, t) if b < f[d]]
    ray = t if b < f[t] else None
    while ray is not None and ray - 1 in explicit:
        explicit.remove(ray - 1)
        ray -= 1
    if ray is not None and ray < 1:
        ray = 1
    if window >= 2:
        explicit = [d for d in explicit if d < window]
        if ray is not None:
            explicit += [d for d in range(ray, window) if d not in explicit]
            ray = None
    return explicit, ray


def _stage_of(m: Model, op: Operation, pipe: Operation) -> int:
    chain = m.chain[op.oid]
    for k, (r, _) in enumerate(chain):
        if r is pipe:
            nxt = chain[k + 1][0] if k + 1 < len(chain) else None
            if nxt is not None and nxt.name == "stage":
                return int(nxt.attrs["ordinal"])
            return 0
    return 0


def pipeline_conflicts(m: Model) -> list[Obligation]:
    """P-7 for every pipeline (see the module docstring)."""
    out: list[Obligation] = []
    for pipe in m.ops("pipeline"):
        window = pipe.attrs["policy"].window
        if window == 1:
            continue
        stages, carried = _carried_edges(pipe)
        n_stage = max(1, len(stages))
        names = [s.attrs["name"] for s in stages] or ["body"]
        outer = m.instance(pipe)
        shared = set(outer.vars)
        dom = pipe.attrs["domain"]
        kv = list(dom.vars)
        ext = list(dom.space.extents)

        def lin(vs: list[str], ext: list[E.Expr] = ext) -> E.Expr:
            acc: E.Expr = E.Const(0)
            for v, n in zip(vs, ext, strict=True):
                acc = acc * n + E.Var(v)
            return acc

        dist = lin([v + "'" for v in kv]) - lin(kv)
        accs = m.accesses_in(m.subtree(pipe))
        for xa in accs:
            for yb in accs:
                x = m.access(xa, "", shared)
                y = m.access(yb, "'", shared)
                if x.target != y.target or not (x.write or y.write):
                    continue
                sa, sb = _stage_of(m, xa, pipe), _stage_of(m, yb, pipe)
                ds, ray = unordered_distances(sa, sb, n_stage, carried, window)
                if not ds and ray is None:
                    continue
                alts = [Fm.atom(dist.eq(d)) for d in ds]
                if ray is not None:
                    alts.append(Fm.atom(dist.ge(ray)))
                hyp = Fm.conj(outer.constraint, x.domain, y.domain, Fm.disj(*alts))
                concl = Fm.differs(x.elem, y.elem)
                out.append(_pipe_obligation(m, pipe, x, y, hyp, concl, kv, window,
                                            names[min(sa, len(names) - 1)],
                                            names[min(sb, len(names) - 1)], outer))
    return out


def _pipe_name(pipe: Operation) -> str:
    return f"pipeline at {pipe.loc}" if pipe.loc is not None else \
        f"pipeline over ({', '.join('$' + v for v in pipe.attrs['vars'])})"


def _pipe_obligation(m: Model, pipe: Operation, x: Access, y: Access, hyp: Fm.F, concl: Fm.F,
                     kv: list[str], window: int, sa: str, sb: str, outer: Instance
                     ) -> Obligation:
    info = {**outer.info, **x.inst.info, **y.inst.info}
    inexact = "; ".join(x.inst.why_inexact + y.inst.why_inexact)

    def explain(pt: dict) -> list[str]:
        ia = ", ".join(f"{info[v].label if v in info else v}={pt.get(v)}" for v in kv)
        ib = ", ".join(f"{info[v + chr(39)].label if v + chr(39) in info else v}="
                       f"{pt.get(v + chr(39))}" for v in kv)
        return [(f"stage '{sa}' of iteration ({ia}) {'writes' if x.write else 'reads'} "
                f"{m.element_text(x, pt)} ({op_ref(x.op)})"),
                (f"stage '{sb}' of iteration ({ib}) {'writes' if y.write else 'reads'} "
                f"{m.element_text(y, pt)} ({op_ref(y.op)})"),
                (f"no carried value orders them and window {window} lets both be in flight: "
                "carry the value, use a Memory object, or window=1")]

    verb = "writes" if x.write and y.write else "a write and a read"
    return Obligation(
        PIPELINE, f"{_pipe_name(pipe)}: iterations in flight together never touch "
        f"one element of {x.target[0]} %{x.target[1]} ({verb}, stages '{sa}' -> '{sb}')",
        m.sites(x.op, y.op, pipe),
        Fm.Claim(Fm.ordered_vars(hyp, concl), hyp, concl, m.assumptions),
        info=info, explain=explain, refutable=not inexact, inexact_note=inexact,
        unknown_note="holds by the pipeline contract, not proved",
        witness={"a": x, "b": y, "program": m.p})


def race_obligations(m: Model) -> list[Obligation]:
    """Every race obligation of the program: E-10 storage noninterference,
    E-11 ancestor-value joins, P-7 pipeline overlap."""
    from .program import noninterference

    return noninterference(m) + joins(m) + pipeline_conflicts(m)
