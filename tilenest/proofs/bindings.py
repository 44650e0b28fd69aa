"""Execution bindings ``beta`` and their obligations (``tile/execution.md``,
binding sections; ``spec/transforms.md`` T-6).

A :class:`Target` is a catalogue (:class:`tilenest.targets.Catalogue`, one per
row of the target registry): its execution scopes, their **containment
partial order** (given by covering pairs, closed transitively; never by the
order of names), aliases (``subgroup = warp``, Metal's ``threadgroup = block``
and ``simdgroup = warp``) and resource limits (most instances of a scope per
instance of an enclosing one, e.g. 1024 CUDA threads per block).

A binding assigns scopes to some ``parallel`` levels; each bound level ``k``
gets a map ``beta_k : P_k -> TargetPrefix_k`` (its target coordinates,
outermost scope first). By default ``beta_k = beta_j o pi_j ++ (level k's own
coordinates)`` for the nearest bound ancestor ``j``; a custom map may be given
per level. Unbound levels are serial axes inside their nearest bound ancestor.
Obligations, for bound levels ``j`` (nearest bound ancestor) and ``k``:

* ``binding.scope``        the target has ``bind(E_k)``                       (catalogue)
* ``binding.containment``  ``contains(bind(E_j), bind(E_k))``, or one shared
                           scope (then cardinality and uniqueness below)      (catalogue)
* ``binding.projection``   forall x in A_k: target_parent_j^k(beta_k(x)) = beta_j(pi_j(x))
* ``binding.unique``       per leaf path: x -> (beta_b(x), unbound coordinates) is
                           injective on the active set (no two logical instances
                           share a participant and serial step)
* ``binding.limit``        the product of the extents of the levels bound to one
                           scope under one instance of the enclosing bound scope
                           is at most the target's limit, for all parameters
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import targets as T
from ..errors import NotAvailableError
from ..semantics import expr as E
from ..targets import Catalogue
from ..semantics.ir import FrozenDict, TileProgram
from ..semantics.maps import Map
from ..semantics.policies import EXEC_SCOPES, ExecPolicy
from . import formula as Fm
from . import rewrite as RW
from .model import Model, VarInfo, where
from .obligation import PROVED, REFUTED, Obligation
from .remap import Transformed, TransformError, program_of
from .transforms import transform_entry


#: a binding catalogue (the class lives in the target registry, beside the
#: rows whose catalogues these are)
Target = Catalogue
CUDA = T.CUDA_CATALOGUE
METAL = T.METAL_CATALOGUE
CPU = T.CPU_CATALOGUE


def catalogues() -> tuple[str, ...]:
    """The names :func:`target` accepts: every registered target's, and its
    catalogue's own where that differs (``cpu``, the ``llvm`` row's)."""
    return T.catalogue_names()


def target(t: str | Catalogue) -> Catalogue:
    """The catalogue ``t`` names (a registry row's, :mod:`tilenest.targets`),
    or ``t`` itself; an unknown name is a :class:`TransformError`."""
    if isinstance(t, Catalogue):
        return t
    try:
        return T.catalogue(t)
    except NotAvailableError:
        raise TransformError(f"unknown target '{t}'", hint=f"use {', '.join(catalogues())} or "
                             "a tilenest.proofs.bindings.Target") from None


def assignment(m: Model, tgt: Target, scopes: Mapping[int, str] | None, auto: bool
               ) -> dict[int, str]:
    """Level -> scope: explicit ``scopes``, then the program's exec scopes, then
    (when nothing is bound and ``auto``) the target's default scopes by depth."""
    nest = m.an.nest
    out: dict[int, str] = {}
    for lid, lv in nest.levels.items():
        ex = lv.exec
        if lid and ex is not None and ex.scope not in (None, "infer"):
            out[lid] = ex.scope
    for lid, s in (scopes or {}).items():
        if lid not in nest.levels or lid == 0:
            raise TransformError(f"the program has no parallel level {lid} to bind")
        out[lid] = s
    if not out and auto:
        for lid, lv in nest.levels.items():
            if lid and lv.depth - 1 < len(tgt.auto):
                out[lid] = tgt.auto[lv.depth - 1]
    return out


def _bound_ancestor(m: Model, lid: int, assign: Mapping[int, str]) -> int | None:
    nest = m.an.nest
    for a in reversed(nest.path(lid)[:-1]):
        if a in assign:
            return a
    return None


def binding_obligations(m: Model, tgt: Target, assign: Mapping[int, str],
                        maps: Mapping[int, Map] | None = None) -> list[Obligation]:
    nest = m.an.nest
    maps = dict(maps or {})
    out: list[Obligation] = []
    ops = {lid: m.level_op(lid) for lid in nest.levels if lid}
    canon = {lid: tgt.canon(s) for lid, s in assign.items()}

    def site(lid: int) -> str:
        return f"level {lid} ({assign[lid]}) at {where(ops[lid])}"

    for lid in sorted(assign):
        ob = Obligation("binding.scope", f"{tgt.name} provides scope '{assign[lid]}'",
                        m.sites(ops[lid]), formula_text=f"{assign[lid]} in scopes({tgt.name})")
        ok = canon[lid] is not None
        ob.decider = (lambda o, t, ok=ok, lid=lid: o.set(PROVED, "catalogue") if ok else o.set(
            REFUTED, "catalogue", f"{tgt.name} has no scope '{assign[lid]}' (it has "
            f"{', '.join(tgt.scopes)})", {"scope": assign[lid], "target": tgt.name}))
        out.append(ob)
    for lid in sorted(assign):
        j = _bound_ancestor(m, lid, assign)
        if j is None or canon[lid] is None or canon[j] is None:
            continue
        sj, sk = canon[j], canon[lid]
        ob = Obligation("binding.containment", f"contains({sj}, {sk}) for levels {j} > {lid}",
                        m.sites(ops[j], ops[lid]), formula_text=f"contains({sj}, {sk}) or "
                        f"{sj} = {sk} in {tgt.name}")

        def decide(o: Obligation, t: float, j: int = j, k: int = lid, sj: str = sj,
                   sk: str = sk) -> None:
            if sj == sk or tgt.contains(sj, sk):
                o.set(PROVED, "catalogue", "one shared scope" if sj == sk else "")
                return
            rel = (f"{tgt.name} orders them the other way ({sk} contains {sj})"
                   if tgt.contains(sk, sj) else f"{sj} and {sk} are incomparable in {tgt.name}")
            o.set(REFUTED, "catalogue", f"{site(j)} encloses {site(k)}, but the target has no "
                  f"relation contains({sj}, {sk}); {rel}",
                  {"outer": site(j), "inner": site(k), "missing": f"contains({sj}, {sk})"})
            o.details = [f"outer: {site(j)}", f"inner: {site(k)}",
                         f"missing relation: contains({sj}, {sk}) in {tgt.name}"]

        ob.decider = decide
        out.append(ob)
    # beta maps
    beta: dict[int, tuple[list[str], tuple[E.Expr, ...]]] = {}
    for lid in sorted(assign, key=lambda x: nest.depth(x)):
        pre = nest.prefix(lid)
        j = _bound_ancestor(m, lid, assign)
        own = tuple(E.Var(v) for v in nest.levels[lid].domain.vars)
        default = (beta[j][1] if j is not None else ()) + own
        if lid in maps:
            mp = maps[lid]
            if tuple(mp.inputs) != tuple(pre.vars):
                raise TransformError(f"the binding map of level {lid} must take the prefix "
                                     f"coordinates ({', '.join(pre.vars)})")
            beta[lid] = (list(pre.vars), tuple(mp.outputs))
        else:
            beta[lid] = (list(pre.vars), default)
        if j is not None and canon.get(j) is not None and canon.get(lid) is not None:
            bj = beta[j][1]
            bk = beta[lid][1]
            hyp = Fm.conj(m.instance(ops[lid]).constraint, Fm.atom(pre.constraint()))
            concl = Fm.eqs(bk[:len(bj)], bj) if len(bk) >= len(bj) else Fm.FALSE
            info = {v: VarInfo(v) for v in pre.vars}
            out.append(Obligation(
                "binding.projection", f"target_parent o beta_{lid} = beta_{j} o pi "
                f"({canon.get(j)} of level {lid}'s participants)", m.sites(ops[j], ops[lid]),
                Fm.Claim(tuple(sorted(Fm.free_vars(hyp) | Fm.free_vars(concl))), hyp, concl,
                         m.assumptions), info=info,
                witness={"beta_k": bk, "beta_j": bj, "vars": list(pre.vars), "program": m.p},
                explain=lambda pt, bj=bj, bk=bk, j=j, lid=lid, info=info: [
                    f"logical instance ({', '.join(f'{v}={pt.get(v)}' for v in pt if v in info)})"
                    f": level {lid} puts it in {_ev(bk[:len(bj)], pt, m)}, level {j} in "
                    f"{_ev(bj, pt, m)}"]))
    # uniqueness per leaf path
    children = {lv.parent for lid, lv in nest.levels.items() if lid}
    for leaf in sorted(lid for lid in nest.levels if lid and lid not in children):
        path = [x for x in nest.path(leaf) if x]
        bound = [x for x in path if x in assign]
        if not bound:
            continue
        pre = nest.prefix(leaf)
        b = bound[-1]
        serial = [E.Var(v) for x in path if x not in assign
                  for v in nest.levels[x].domain.vars]
        img = beta[b][1] + tuple(serial)
        xs, ys = list(pre.vars), [v + "'" for v in pre.vars]
        ren = dict(zip(xs, ys, strict=True))
        img2 = tuple(E.rename(e, ren) for e in img)
        act = Fm.atom(pre.constraint())
        outer = m.instance(ops[path[0]]).constraint
        hyp = Fm.conj(outer, act, Fm.rename(act, ren), Fm.eqs(img, img2))
        concl = Fm.eqs([E.Var(v) for v in xs], [E.Var(v) for v in ys])
        info = {v: VarInfo(v) for v in xs + ys}
        out.append(Obligation(
            "binding.unique", f"levels {'>'.join(map(str, path))}: distinct logical instances "
            "get distinct (participant, serial step)", m.sites(*(ops[x] for x in path)),
            Fm.Claim(tuple(sorted(Fm.free_vars(hyp) | Fm.free_vars(concl))), hyp, concl,
                     m.assumptions), info=info,
            witness={"image": img, "image2": img2, "xs": xs, "ys": ys, "program": m.p},
            explain=lambda pt, xs=xs, ys=ys, img=img: [
                f"({', '.join(f'{v}={pt.get(v)}' for v in xs)}) and "
                f"({', '.join(f'{v}={pt.get(v)}' for v in ys)}) both run as "
                f"{_ev(img, pt, m)}"]))
    # limits: group consecutive bound levels of one scope under one enclosing scope
    for lid in sorted(assign):
        sk = canon[lid]
        if sk is None:
            continue
        j = _bound_ancestor(m, lid, assign)
        if j is not None and canon.get(j) == sk:
            continue  # counted with the outermost level of its group
        group = [lid]
        for d in _descendants_chain(m, lid):
            if canon.get(d) == sk:
                group.append(d)
            elif d in assign:
                break
        t = canon.get(j) if j is not None else None
        limit = tgt.limits.get((t, sk)) if t is not None else None
        if limit is None:
            continue
        count: E.Expr = E.Const(1)
        for g in group:
            for e in nest.levels[g].domain.space.extents:
                count = count * e
        ctx = m.instance(ops[lid])
        custom = [g for g in group if g in maps]
        if custom:
            # a custom map names the participants: each own id lies in [0, limit)
            g = custom[-1]
            jj = _bound_ancestor(m, g, assign)
            own = beta[g][1][len(beta[jj][1]) if jj is not None else 0:]
            pre = nest.prefix(g)
            hyp = Fm.conj(m.instance(ops[g]).constraint, Fm.atom(pre.constraint()))
            concl = Fm.conj(*(Fm.conj(Fm.atom(c.ge(0)), Fm.atom(c.lt(limit))) for c in own))
            out.append(Obligation(
                "binding.limit", f"{sk} ids of level {g} stay below {limit} per {t}",
                m.sites(ops[g]), Fm.Claim(tuple(sorted(Fm.free_vars(hyp) | Fm.free_vars(concl))),
                                          hyp, concl, m.assumptions)))
            continue
        out.append(Obligation(
            "binding.limit", f"at most {limit} {sk} per {t} on {tgt.name}",
            m.sites(*(ops[g] for g in group)),
            Fm.Claim(tuple(ctx.vars), ctx.constraint, Fm.atom(count.le(limit)),
                     m.assumptions), info=dict(ctx.info),
            witness={"count": count, "limit": limit, "program": m.p},
            explain=lambda pt, count=count, limit=limit, sk=sk, t=t: [
                f"{_ev((count,), pt, m)[1:-1]} {sk}s per {t} exceed the limit {limit}"]))
    return out


def _descendants_chain(m: Model, lid: int) -> list[int]:
    """Levels directly below ``lid`` while the nest does not branch."""
    nest = m.an.nest
    out = []
    cur = lid
    while True:
        kids = [x for x, lv in nest.levels.items() if x and lv.parent == cur]
        if len(kids) != 1:
            return out
        cur = kids[0]
        out.append(cur)


def _ev(xs: tuple, pt: dict, m: Model) -> str:
    env = Fm.env_of(pt, m.params)
    try:
        return "(" + ", ".join(str(E.evaluate(x, env)) for x in xs) + ")"
    except KeyError:
        return "(" + ", ".join(E.to_str(x) for x in xs) + ")"


@transform_entry
def bind(x: Any, tgt: str | Target = "cuda", scopes: Mapping[int, str] | None = None,
         maps: Mapping[int, Map] | None = None, auto: bool = True) -> Transformed:
    """Bind levels to ``tgt``'s scopes; the candidate records the scopes in the
    levels' exec policies (execution constraints never change meaning, E-18)."""
    p = program_of(x)
    m = Model(p)
    tg = target(tgt)
    assign = assignment(m, tg, scopes, auto)
    obs = binding_obligations(m, tg, assign, maps)
    q = _record(p, assign)
    step = f"bind to {tg.name}: " + ", ".join(f"level {k} -> {v}" for k, v in sorted(
        assign.items()))
    if isinstance(x, Transformed):
        return Transformed(x.source, q, x.obligations + obs, x.steps + [step], x.level_map)
    return Transformed(p, q, obs, [step])


def _record(p: TileProgram, assign: Mapping[int, str]) -> TileProgram:
    """``p`` with each bound level's scope written into its exec policy (inner
    levels first, so outer replacements carry the updated inner ones)."""
    out = p
    for op in sorted((o for o in p.walk() if o.name == "parallel"), key=lambda o: -o.oid):
        s = assign.get(op.attrs["level"])
        if s is None or s not in EXEC_SCOPES:
            continue
        cur = out.ops_by_id[op.oid]
        ex = cur.attr("exec")
        new = ExecPolicy(s, ex.layout if ex is not None else None)
        out = RW.replace_ops(out, {op.oid: cur.replace(
            attrs=FrozenDict({**dict(cur.attrs.items()), "exec": new}))})
    return out
