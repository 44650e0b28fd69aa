"""Sibling-phase fusion and pipeline issue schedules.

**Fusion** (``calculus.md``, "Multiple scopes and fusion"). Two adjacent sibling
``parallel`` regions ``A`` and ``B`` over the same domain ``D`` become one
region whose body is ``A``'s then ``B``'s (``B``'s coordinates renamed to
``A``'s). Each instance's own order is kept; what is new is the interleaving of
``A(i)`` with ``B(j)`` for ``i != j``. Obligation ``fusion.dependence``, for
every pair of accesses ``a`` in ``A`` and ``b`` in ``B`` to one object with a
write among them::

    forall o, i, j, u, v:  a(o, i, u) and b(o, j, v) active and i != j
                           =>  elem_a(o, i, u) != elem_b(o, j, v)

i.e. ``Dep_AB`` is contained in the diagonal ``{(i, i)}`` (RAW, WAR and WAW
alike). A refutation names both instances and the element.

**Pipeline schedules** (``spec/pipeline.md`` P-5, P-6, P-8). An issue schedule
gives stage ``s`` of iteration ``i`` the issue time ``Issue(s, i) = i*II +
theta(s)``, each stage a latency ``lat(s)``, and each materialized value a ring
of ``V`` versions. Over the iteration count ``n`` (symbolic), the obligations::

    pipeline.dependence  for each edge (p -> c, distance d):
        forall i: 0 <= i and i + d < n  =>  Issue(c, i + d) >= Issue(p, i) + lat(p)
    pipeline.window      (window W >= 1):
        forall i: 0 <= i and i + W < n  =>  Issue(first, i + W) >= Issue(last, i) + lat(last)
    pipeline.versions    for a value produced in p and last read in c (distance d):
        forall i: 0 <= i and i + V < n  =>  Issue(p, i + V) >= Issue(c, i + d) + lat(c)

The last one is "no producer overwrites a version before its consumer is done".
Edges come from the IR: consecutive stages (program order), values crossing
stages (distance 0), and carried values and Memory states (distance 1).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..semantics import expr as E
from ..semantics.ir import Block, Operation, TileProgram
from . import formula as Fm
from . import rewrite as RW
from .model import Model, VarInfo, where
from .obligation import PROVED, Obligation
from .remap import Transformed, TransformError, program_of
from .transforms import transform_entry

# ---------------------------------------------------------------------------
# fusion


def _siblings(m: Model, level: int) -> tuple[Operation, Operation]:
    a = m.level_op(level)
    chain = m.chain[a.oid]
    block: Block = chain[-1][0].regions[chain[-1][1]] if chain else m.p.body
    ops = list(block.ops)
    i = next(k for k, o in enumerate(ops) if o is a)
    if i + 1 >= len(ops) or ops[i + 1].name != "parallel":
        raise TransformError(f"level {level} is not directly followed by a sibling parallel",
                             a.loc, "fuse_phases fuses adjacent sibling regions")
    return a, ops[i + 1]


@transform_entry
def fuse_phases(x: Any, level: int) -> Transformed:
    """Fuse the ``parallel`` of ``level`` with the sibling region right after it."""
    p = program_of(x)
    m = Model(p)
    a, b = _siblings(m, level)
    if a.operands or b.operands:
        raise TransformError("fuse_phases needs regions without carried values", a.loc)
    da, db = a.attrs["domain"], b.attrs["domain"]
    ren = dict(zip(db.vars, da.vars, strict=False))
    sub = {E.Var(k): E.Var(v) for k, v in ren.items()}
    if da.rank != db.rank or any(E.subst(x_, sub) != y for x_, y in
                                 zip(db.space.extents, da.space.extents, strict=True)) \
            or E.subst(db.pred, sub) != da.pred:
        raise TransformError("the two regions have different domains", m.sites(a, b),
                             "fusion matches instances by equal domains")
    obs = _dependence(m, a, b)
    # the candidate
    lmap = {b.attrs["level"]: a.attrs["level"]}
    rb = RW.Rebuilder(sub, lmap)
    body_b = rb.block(b.regions[0])
    body_a = a.regions[0]
    merged = Block((), body_a.ops[:-1] + body_b.ops)
    fused = a.replace(regions=(merged,))
    q = RW.replace_op(p, b.oid, lambda _o: [])
    q = RW.replace_ops(q, {a.oid: fused})
    q, _ = RW.finish(q)
    obs.append(RW.verified(q, m.sites(a, b)))
    t = Transformed(p, q, obs, [f"fuse_phases: level {level} with level {b.attrs['level']}"],
                    lmap)
    if isinstance(x, Transformed):
        return Transformed(x.source, q, x.obligations + obs, x.steps + t.steps,
                           {**x.level_map, **lmap})
    return t


def _dependence(m: Model, a: Operation, b: Operation) -> list[Obligation]:
    outer = m.instance(a)
    shared = set(outer.vars)
    av = [E.Var(v) for v in a.attrs["vars"]]
    bv = [E.Var(v + "'") for v in b.attrs["vars"]]
    out = []
    for ea in m.accesses_in(m.subtree(a)):
        for eb in m.accesses_in(m.subtree(b)):
            x, y = m.access(ea, "", shared), m.access(eb, "'", shared)
            if x.target != y.target or not (x.write or y.write):
                continue
            hyp = Fm.conj(outer.constraint, x.domain, y.domain, Fm.differs(av, bv))
            concl = Fm.differs(x.elem, y.elem)
            info = {**outer.info, **x.inst.info, **y.inst.info}
            kind = "RAW" if x.write and not y.write else ("WAR" if y.write and not x.write
                                                          else "WAW")
            inexact = "; ".join(x.inst.why_inexact + y.inst.why_inexact)

            def explain(pt: dict, x: Any = x, y: Any = y, info: dict = info) -> list[str]:
                ia = ", ".join(f"{info[v].label}={pt.get(v)}" for v in a.attrs["vars"])
                ib = ", ".join(f"{info[v + chr(39)].label}={pt.get(v + chr(39))}"
                               for v in b.attrs["vars"])
                return [f"A({ia}) {'writes' if x.write else 'reads'} {m.element_text(x, pt)} "
                        f"at {where(x.op)}",
                        f"B({ib}) {'writes' if y.write else 'reads'} it at {where(y.op)}: "
                        "a cross-instance edge that fusion would lose"]

            out.append(Obligation(
                "fusion.dependence", f"{kind} dependences on %{x.target[1]} between the phases "
                "are pointwise (Dep_AB within the diagonal)", m.sites(ea, eb),
                Fm.Claim(tuple(sorted(Fm.free_vars(hyp) | Fm.free_vars(concl))), hyp, concl,
                         m.assumptions),
                info=info, explain=explain, refutable=not inexact, inexact_note=inexact,
                witness={"a": x, "b": y, "program": m.p}))
    if not out:
        ob = Obligation("fusion.dependence", "the phases share no written object",
                        m.sites(a, b), formula_text="Dep_AB is empty")
        ob.decider = lambda o, t: o.set(PROVED, "structural")
        out.append(ob)
    return out




# ---------------------------------------------------------------------------
# pipeline issue schedules


@dataclass(frozen=True)
class Edge:
    producer: int
    consumer: int
    distance: int
    payload: str


@dataclass(frozen=True)
class Schedule:
    """A uniform issue schedule: ``Issue(s, i) = i*interval + offsets[s]``."""

    interval: int
    offsets: tuple[int, ...]
    latency: tuple[int, ...]
    versions: Mapping[str, int] = field(default_factory=dict)
    default_versions: int = 2
    window: int = 0

    def issue(self, s: int, i: E.Expr) -> E.Expr:
        return i * self.interval + self.offsets[s]


def pipelines(p: TileProgram) -> list[Operation]:
    return [o for o in p.walk() if o.name == "pipeline"]


def stage_graph(pipe: Operation) -> tuple[list[Operation], list[Edge], dict[str, tuple[int, int]]]:
    """Stages, dependence edges, and for each materialized value its producer
    stage and last consumer stage."""
    body = pipe.regions[0]
    stages = [o for o in body.ops if o.name == "stage"]
    produced: dict[str, int] = {}
    for s in stages:
        for r in s.results:
            produced[r.name] = s.attrs["ordinal"]
    args = {a.name: i for i, a in enumerate(body.args)}
    edges = [Edge(k, k + 1, 0, "program order") for k in range(len(stages) - 1)]
    live: dict[str, tuple[int, int]] = {}
    for s in stages:
        k = s.attrs["ordinal"]
        used = {o.name for op in s.regions[0].walk() for o in op.operands}
        used |= {lf.name for op in s.regions[0].walk() for v in op.attrs.values()
                 for lf in _vals(v)}
        for name in used:
            if name in produced and produced[name] < k:
                p0 = produced[name]
                live[name] = (p0, max(k, live.get(name, (p0, p0))[1]))
                edges.append(Edge(p0, k, 0, f"%{name}"))
            if name in args:
                y = body.terminator
                src = y.operands[args[name]].name if y is not None else None
                if src in produced:
                    edges.append(Edge(produced[src], k, 1, f"carried %{name}"))
    return stages, edges, live


def _vals(v: Any) -> list[E.Val]:
    if isinstance(v, (E.Expr, E.Pred)):
        return [x for x in E.leaves(v) if isinstance(x, E.Val)]
    if isinstance(v, tuple):
        return [x for i in v for x in _vals(i)]
    return []


def default_schedule(pipe: Operation) -> Schedule:
    """The tightest uniform schedule the policy permits: stage ``s`` at offset
    ``s``, unit latencies, ``II = max(interval, ceil(S / W))``, ``W`` versions."""
    pol = pipe.attrs["policy"]
    stages, _, _ = stage_graph(pipe)
    n = max(1, len(stages))
    w = pol.window
    ii = max(pol.interval, -(-n // w)) if w >= 1 else pol.interval
    return Schedule(ii, tuple(range(n)), (1,) * n, {}, w if w >= 1 else n, w)


def schedule_obligations(m: Model, pipe: Operation, sch: Schedule) -> list[Obligation]:
    stages, edges, live = stage_graph(pipe)
    if not stages:
        return []
    if len(sch.offsets) != len(stages) or len(sch.latency) != len(stages):
        raise TransformError(f"the schedule needs one offset and latency per stage "
                             f"({len(stages)})", pipe.loc)
    outer = m.instance(pipe)
    dom = pipe.attrs["domain"]
    n: E.Expr = E.Const(1)
    for e in dom.space.extents:
        n = n * e
    i = E.Var("i@")
    names = [s.attrs["name"] for s in stages]
    sites = m.sites(pipe)
    info = {**outer.info, "i@": VarInfo("i", "iteration")}
    out: list[Obligation] = []

    def claim(gap: int, lhs: E.Expr, rhs: E.Expr) -> Fm.Claim:
        hyp = Fm.conj(outer.constraint, Fm.atom(i.ge(0)), Fm.atom((i + gap).lt(n)))
        return Fm.Claim(tuple(outer.vars) + ("i@",), hyp, Fm.atom(lhs.ge(rhs)), m.assumptions)

    def explain(a: int, da: int, b: int, db: int, what: str) -> Any:
        def f(pt: dict) -> list[str]:
            it = pt.get("i@", 0)
            ta = sch.issue(a, E.Const(it + da))
            tb = sch.issue(b, E.Const(it + db))
            return [f"i = {it}: '{names[a]}' of iteration {it + da} issues at t={ta}, but "
                    f"'{names[b]}' of iteration {it + db} completes only at "
                    f"t={E.lift(tb) + sch.latency[b]} ({what})"]
        return f

    for e in edges:
        out.append(Obligation(
            "pipeline.dependence", f"'{names[e.consumer]}' waits for '{names[e.producer]}' "
            f"({e.payload}, distance {e.distance})", sites,
            claim(e.distance, sch.issue(e.consumer, i + e.distance),
                  sch.issue(e.producer, i) + sch.latency[e.producer]), info=info,
            explain=explain(e.consumer, e.distance, e.producer, 0, e.payload),
            witness={"schedule": sch, "later": (e.consumer, e.distance),
                     "earlier": (e.producer, 0)}))
    w = sch.window
    if w >= 1:
        last = len(stages) - 1
        out.append(Obligation(
            "pipeline.window", f"at most {w} iterations in flight", sites,
            claim(w, sch.issue(0, i + w), sch.issue(last, i) + sch.latency[last]), info=info,
            explain=explain(0, w, last, 0, f"window {w}"),
            witness={"schedule": sch, "later": (0, w), "earlier": (last, 0)}))
    for name, (prod, cons) in sorted(live.items()):
        v = sch.versions.get(name, sch.default_versions)
        out.append(Obligation(
            "pipeline.versions", f"%{name}: {v} version(s) are never overwritten before "
            f"'{names[cons]}' is done with them", sites,
            claim(v, sch.issue(prod, i + v), sch.issue(cons, i) + sch.latency[cons]), info=info,
            explain=explain(prod, v, cons, 0, f"it reuses the slot of %{name}"),
            witness={"schedule": sch, "later": (prod, v), "earlier": (cons, 0)}))
    return out


@transform_entry
def schedule_pipeline(x: Any, index: int = 0, *, interval: int | None = None,
                      offsets: Sequence[int] | None = None,
                      latency: int | Sequence[int] = 1, versions: int | Mapping[str, int] | None
                      = None, window: int | None = None) -> Transformed:
    """State the obligations of an issue schedule for the ``index``-th pipeline
    (program order). Unspecified fields come from :func:`default_schedule`."""
    p = program_of(x)
    m = Model(p)
    pipes = pipelines(p)
    if not 0 <= index < len(pipes):
        raise TransformError(f"the program has {len(pipes)} pipeline(s); no pipeline {index}")
    pipe = pipes[index]
    d = default_schedule(pipe)
    n = len(d.offsets)
    lat = tuple(latency) if isinstance(latency, Sequence) else (int(latency),) * n
    vmap = dict(versions) if isinstance(versions, Mapping) else {}
    dv = versions if isinstance(versions, int) else d.default_versions
    sch = Schedule(interval if interval is not None else d.interval,
                   tuple(offsets) if offsets is not None else d.offsets, lat, vmap, dv,
                   window if window is not None else d.window)
    obs = schedule_obligations(m, pipe, sch)
    step = (f"schedule pipeline {index}: II={sch.interval}, offsets={list(sch.offsets)}, "
            f"versions={dv}, window={sch.window}")
    if isinstance(x, Transformed):
        return Transformed(x.source, p, x.obligations + obs, x.steps + [step], x.level_map)
    return Transformed(p, p, obs, [step])


def default_pipeline_obligations(m: Model) -> list[Obligation]:
    out = []
    for pipe in pipelines(m.p):
        out.extend(schedule_obligations(m, pipe, default_schedule(pipe)))
    return out
