"""Obligations a program incurs by itself (no transform, no target).

* ``noninterference`` (E-10), per ``parallel`` region ``Q`` and per pair of
  accesses ``a``, ``b`` to one storage object, at least one a write. Actors are
  the children of ``Q`` (ops anchored at or below ``Q``'s level) and one
  collective actor (ops in ``Q`` anchored above it; accesses to a Memory owned at
  ``Q``'s level or below are per child whatever their anchor). With ``o`` the coordinates
  of the regions enclosing ``Q`` (shared: one entry of ``Q``)::

      child/child:   forall o, q, q', u, u':  a(o, q, u) active and b(o, q', u')
                     active and q != q'  =>  elem_a(o, q, u) != elem_b(o, q', u')
      child/collective: the same without q != q' (the collective actor is
                     distinct from every child)

  The temporal and deeper coordinates ``u`` of each side are independent.
  A data-dependent access or control flow makes the verdict ``unknown`` ("holds
  by the parallel contract, not proved") unless the claim is proved anyway.
* ``coverage.cover`` / ``coverage.once`` (claimed outputs: tensors the program
  stores to and never loads): every element of the tensor's box is written by
  some active store instance; no element is written by two distinct store
  instances (distinct ops, or one op at lexicographically different
  coordinates).
* ``bounds`` (accesses with bounds ``checked`` or ``assume``, which have no
  masking guard): ``forall instances, u in box with valid(u): 0 <= map(u) < shape``.
* ``layout.range`` / ``layout.injective`` for every Memory: ``0 <= L(u) < size``
  and ``L(u) = L(v) => u = v`` over the memory's space (:mod:`.layouts`).
* ``parallel-map.preserve`` / ``parallel-map.into`` / ``parallel-map.injective``
  for every ``parallel`` with an exec layout: the ParallelMap
  ``(p, i) -> (p, layout(i))`` satisfies ``parent_projection o ParallelMap =
  project_P``, and ``layout`` is a bijection of the child domain onto itself.
"""

from __future__ import annotations

from ..semantics import expr as E
from ..semantics.ir import Operation
from ..semantics.maps import Map
from ..semantics.policies import Bounds
from . import formula as Fm
from .model import Access, Model, VarInfo, op_ref, where
from .obligation import Obligation

CONTRACT_NOTE = "holds by the parallel contract, not proved"


def _inexact(*accs: Access) -> str:
    return "; ".join(w for a in accs for w in a.inst.why_inexact)


def noninterference(m: Model) -> list[Obligation]:
    """E-10 for every parallel region (see the module docstring)."""
    out: list[Obligation] = []
    an = m.an
    for q in m.ops("parallel"):
        level = q.attrs["level"]
        qdepth = an.nest.depth(level)
        outer = m.instance(q)
        shared = set(outer.vars)
        effects = m.accesses_in(m.subtree(q))
        # a Memory owned at or below Q is per child whatever the op's anchor
        per_child = {o.oid for o in effects if an.nest.depth(an.anchor[o.oid]) >= qdepth or (
            o.name.startswith("memory.") and
            an.nest.depth(an.owner.get(o.operands[0].name, 0)) >= qdepth)}
        child = [o for o in effects if o.oid in per_child]
        coll = [o for o in effects if o.oid not in per_child]
        qv = list(q.attrs["vars"])
        qa = [E.Var(v) for v in qv]
        qb = [E.Var(v + "'") for v in qv]
        pairs: list[tuple[Operation, Operation, bool]] = []
        for i, first in enumerate(child):
            for other in child[i:]:
                pairs.append((first, other, True))
            for other in coll:
                pairs.append((first, other, False))
        for a_op, b_op, both_children in pairs:
            a = m.access(a_op, "", ())
            b = m.access(b_op, "'", shared)
            if a.target != b.target or not (a.write or b.write):
                continue
            distinct = Fm.differs(qa, qb) if both_children else Fm.TRUE
            hyp = Fm.conj(outer.constraint, a.domain, b.domain, distinct)
            concl = Fm.differs(a.elem, b.elem)
            info = {**outer.info, **a.inst.info, **b.inst.info}
            for v in qv:
                info[v + "'"] = VarInfo(info[v].label + "'", "second instance") \
                    if v in info else VarInfo(v + "'")
            inexact = _inexact(a, b)
            who = "two children" if both_children else "a child and the collective ops"

            def explain(pt: dict, a: Access = a, b: Access = b, both: bool = both_children,
                        info: dict = info, qv: list = qv) -> list[str]:
                inst_a = ", ".join(f"{info[v].label}={pt.get(v)}" for v in qv)
                inst_b = ", ".join(f"{info[v + chr(39)].label}={pt.get(v + chr(39))}"
                                   for v in qv)
                verb_a = "writes" if a.write else "reads"
                verb_b = "writes" if b.write else "reads"
                lines = [f"instance ({inst_a}) {verb_a} {m.element_text(a, pt)} "
                         f"({op_ref(a.op)})"]
                other = f"instance ({inst_b})" if both else "the collective actor"
                lines.append(f"{other} {verb_b} {m.element_text(b, pt)} "
                             f"({op_ref(b.op)})")
                return lines

            out.append(Obligation(
                "noninterference",
                f"level {q.attrs['level']}: {who} never touch one element of "
                f"{a.target[0]} %{a.target[1]} with a write",
                m.sites(a_op, b_op, q),
                Fm.Claim(Fm.ordered_vars(hyp, concl), hyp, concl, m.assumptions),
                info=info, explain=explain, refutable=not inexact,
                inexact_note=inexact or "", unknown_note=CONTRACT_NOTE,
                witness={"a": a, "b": b, "level": level, "program": m.p}))
    return out


def _outputs(m: Model) -> list[str]:
    stored = {o.operands[0].name for o in m.ops("tensor.store")}
    loaded = {o.operands[0].name for o in m.ops("tensor.load")}
    return [t.name for t in m.p.tensors if t.name in stored and t.name not in loaded]


def coverage(m: Model) -> list[Obligation]:
    """Claimed outputs are written exactly once (see the module docstring)."""
    out: list[Obligation] = []
    for tname in _outputs(m):
        tval = next(t for t in m.p.tensors if t.name == tname)
        stores = [o for o in m.ops("tensor.store") if o.operands[0].name == tname]
        ev = [f"e@{d}" for d in range(tval.type.rank)]
        evx = [E.Var(v) for v in ev]
        box = Fm.in_box(evx, tval.type.shape)
        alts = []
        inexact = []
        for k, s in enumerate(stores):
            a = m.access(s, f"#{k}")
            alts.append(Fm.exists(a.vars, Fm.conj(a.domain, Fm.eqs(a.elem, evx))))
            inexact += a.inst.why_inexact
        info = {v: VarInfo(f"{tname}[{d}]") for d, v in enumerate(ev)}
        out.append(Obligation(
            "coverage.cover", f"every element of output %{tname} is written",
            m.sites(*stores), Fm.Claim(tuple(ev), box, Fm.disj(*alts), m.assumptions),
            info=info, provable=not inexact, inexact_note="; ".join(inexact),
            witness={"tensor": tname, "stores": stores, "program": m.p},
            explain=lambda pt, ev=ev, tname=tname: [
                f"element %{tname}[{', '.join(str(pt.get(v)) for v in ev)}] is never written"]))
        for i, s1 in enumerate(stores):
            for s2 in stores[i:]:
                a, b = m.access(s1, ""), m.access(s2, "'")
                if s1 is s2:
                    distinct = Fm.lex_lt([E.Var(v) for v in a.vars], [E.Var(v) for v in b.vars])
                else:
                    distinct = Fm.TRUE
                hyp = Fm.conj(a.domain, b.domain, distinct)
                concl = Fm.differs(a.elem, b.elem)
                inx = _inexact(a, b)
                inf = {**a.inst.info, **b.inst.info}

                def explain(pt: dict, a: Access = a, b: Access = b, inf: dict = inf
                            ) -> list[str]:
                    def inst(x: Access) -> str:
                        return ", ".join(f"{inf[v].label}={pt.get(v)}" for v in x.inst.vars)
                    return [f"{m.element_text(a, pt)} is written by ({inst(a)}) at {where(a.op)}",
                            f"and again by ({inst(b)}) at {where(b.op)}"]

                out.append(Obligation(
                    "coverage.once", f"no element of output %{tname} is written twice",
                    m.sites(s1, s2), Fm.Claim(Fm.ordered_vars(hyp, concl), hyp, concl, m.assumptions),
                    info=inf, explain=explain, refutable=not inx, inexact_note=inx,
                    witness={"a": a, "b": b, "program": m.p}))
    return out


def bounds(m: Model) -> list[Obligation]:
    """Unguarded accesses stay inside their tensors (see the module docstring)."""
    out: list[Obligation] = []
    for op in m.ops("tensor.load") + m.ops("tensor.store"):
        pol = op.attrs["bounds"]
        if pol.kind not in (Bounds.checked, Bounds.assume):
            continue
        a = m.access(op)
        shape = op.operands[0].type.shape
        hyp = Fm.conj(a.inst.constraint, a.local_box, a.valid)
        concl = Fm.in_box(a.elem, shape)
        inx = _inexact(a)

        def explain(pt: dict, a: Access = a) -> list[str]:
            inst = ", ".join(f"{a.inst.info[v].label}={pt.get(v)}" for v in a.inst.vars)
            return [f"instance ({inst}) accesses {m.element_text(a, pt)}, outside the tensor "
                    f"of shape ({', '.join(_eval_shape(m, a, pt))})"]

        out.append(Obligation(
            "bounds", f"{op.name} of %{op.operands[0].name} ({pol.kind.value}) stays in bounds",
            m.sites(op), Fm.Claim(Fm.ordered_vars(hyp, concl), hyp, concl, m.assumptions),
            info=dict(a.inst.info), explain=explain, refutable=not inx, inexact_note=inx,
            witness={"a": a, "program": m.p}))
    return out


def _eval_shape(m: Model, a: Access, pt: dict) -> list[str]:
    env = Fm.env_of(pt, m.params)
    shape = a.op.operands[0].type.shape
    out = []
    for x in shape:
        try:
            out.append(str(E.evaluate(x, env)))
        except KeyError:
            out.append(E.to_str(x))
    return out


def layouts(m: Model) -> list[Obligation]:
    """Memory layouts are in range and injective on their spaces (stated and
    decided in :mod:`tilenest.proofs.layouts`: GF(2) for bit-linear swizzles,
    enumeration, the engines, a bounded counterexample search)."""
    from .layouts import layout_obligations

    return layout_obligations(m)


def parallel_maps(m: Model) -> list[Obligation]:
    """ParallelMap obligations for every exec layout (see the module docstring)."""
    out: list[Obligation] = []
    for op in m.ops("parallel"):
        ex = op.attr("exec")
        if ex is None or ex.layout is None:
            continue
        outer = m.instance(op)
        dom = op.attrs["domain"]
        lay: Map = ex.layout
        pm = Map(tuple(outer.vars) + lay.inputs,
                 tuple(E.Var(v) for v in outer.vars) + lay.outputs)
        out.append(preserve_obligation(m, pm, len(outer.vars), m.sites(op)))
        i = list(lay.inputs)
        j = [x + "'" for x in i]
        act_i = Fm.rename(Fm.atom(dom.constraint()), dict(zip(dom.vars, i, strict=True)))
        act_j = Fm.rename(act_i, dict(zip(i, j, strict=True)))
        img_i = Fm.subst(Fm.atom(dom.constraint()),
                         {E.Var(a): o for a, o in zip(dom.vars, lay.outputs, strict=True)})
        lj = [E.rename(o, dict(zip(i, j, strict=True))) for o in lay.outputs]
        info = {x: VarInfo(f"raw{k}") for k, x in enumerate(i)}
        info.update({x: VarInfo(f"raw{k}'") for k, x in enumerate(j)})
        out.append(Obligation(
            "parallel-map.into", f"level {op.attrs['level']}: the exec layout maps the raw "
            "domain into the child domain", m.sites(op),
            Fm.Claim(tuple(outer.vars + i), Fm.conj(outer.constraint, act_i), img_i,
                     m.assumptions), info=info))
        out.append(Obligation(
            "parallel-map.injective", f"level {op.attrs['level']}: distinct raw children "
            "get distinct logical coordinates", m.sites(op),
            Fm.Claim(tuple(outer.vars + i + j),
                     Fm.conj(outer.constraint, act_i, act_j, Fm.eqs(lay.outputs, lj)),
                     Fm.eqs([E.Var(x) for x in i], [E.Var(x) for x in j]), m.assumptions),
            info=info))
    return out


def preserve_obligation(m: Model | None, pm: Map, n_parent: int, sites: tuple = (),
                        assume: Fm.F = Fm.TRUE) -> Obligation:
    """``parent_projection o ParallelMap = project_P`` for a ParallelMap ``pm``
    whose first ``n_parent`` inputs are the parent prefix ``P``."""
    parent = [E.Var(v) for v in pm.inputs[:n_parent]]
    proj = list(pm.outputs[:n_parent])
    info = {v: VarInfo(v) for v in pm.inputs}
    return Obligation(
        "parallel-map.preserve", "parent_projection o ParallelMap = project_P", sites,
        Fm.Claim(tuple(pm.inputs), Fm.TRUE, Fm.eqs(proj, parent),
                 m.assumptions if m is not None else assume),
        info=info, explain=lambda pt: [
            "child (" + ", ".join(f"{v}={pt.get(v)}" for v in pm.inputs) + ") lands under parent ("
            + ", ".join(str(E.evaluate(x, Fm.env_of(pt, ()))) for x in proj) + ")"])


def program_obligations(m: Model) -> list[Obligation]:
    """Every obligation of the program alone, in a stable order: the race
    obligations (E-10 storage, E-11 ancestor-value joins, P-7 pipeline overlap;
    see :mod:`tilenest.proofs.races`), then coverage, bounds, layouts and
    ParallelMaps."""
    from .races import joins, pipeline_conflicts

    return (noninterference(m) + joins(m) + pipeline_conflicts(m) + coverage(m) + bounds(m)
            + layouts(m) + parallel_maps(m))
