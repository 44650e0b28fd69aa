"""Execution remaps ``tau : E' -> E``, their obligations, and the rewrite.

A :class:`Remap` replaces a *chain* of nested ``parallel`` levels
``L_0 |> ... |> L_k`` (each but the last holding only the next one: a perfect
nest) by new levels ``L'_0 |> ... |> L'_m`` and states, for every old chain
coordinate, the expression ``tau`` giving it from the new coordinates; ``rho``
says which new level plays the role of each old one. Coordinates of enclosing
regions are the shared context ``outer`` and are not remapped. With
``A``/``A'`` the old/new active sets (domains with their predicates) the
obligations are (primes mark renamed copies of the new coordinates):

* ``tau.function``  forall outer, x' in A':          tau(x') in A
* ``tau.cover``     forall outer, x in A:  exists x' in A' with tau(x') = x
* ``tau.injective`` forall outer, x', y' in A':      tau(x') = tau(y') => x' = y'
* ``cut.factor[j]`` for each observed old cut j with new cut k = rho(j):
                    forall x', y' in A':  pi'_k(x') = pi'_k(y') => pi_j(tau x') = pi_j(tau y')
* ``cut.identity[j]`` for each identity-defining cut (value home, Memory owner,
                    anchor of a write, convergence point): tau_j is bijective on
                    active prefixes, stated as
                    forall x', y' in A':  pi_j(tau x') = pi_j(tau y') => pi'_k(x') = pi'_k(y')
                    and every active new prefix at k has an active extension;
* ``rewrite``       the rewritten program verifies, and its re-inferred
                    frontiers are ``rho(frontier)`` and anchors are at or above
                    ``rho(anchor)``. (Anchors are inferred as the least legal
                    prefix, so a value that only reads outer coordinates after
                    the rewrite is re-anchored higher; it is recomputed, never
                    merged, and the identity cuts above protect what is observed.)

The leaf cut (the innermost old level mapped to the innermost new one) needs
no separate obligations: there ``tau_j = tau``. Cuts below the chain factor
trivially (``tau`` is the identity on their coordinates). A cut is *observed*
when an op's frontier or anchor, a Memory owner, or a carried-value join refers
to it; unobserved cuts may be crossed freely.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..errors import TilenestError
from ..semantics import expr as E
from ..semantics.ir import Block, Operation, TileProgram, Value
from ..semantics.policies import ExecPolicy
from ..semantics.space import IndexSet
from . import formula as Fm
from . import rewrite as RW
from .model import Model, VarInfo, where
from .obligation import PROVED, REFUTED, Obligation, discharge, outcome

WRITE_OPS = ("tensor.store", "memory.store", "memory.alloc")


class TransformError(TilenestError):
    """A transform cannot even be stated on this program (bad level, axis...)."""

    kind = "transform error"


@dataclass(frozen=True)
class NewLevel:
    """One level of the new chain: its coordinates and domain."""

    vars: tuple[str, ...]
    domain: IndexSet
    exec: ExecPolicy | None = None


@dataclass(frozen=True)
class Remap:
    """``tau`` on a chain of levels (see the module docstring)."""

    kind: str
    chain: tuple[int, ...]
    new: tuple[NewLevel, ...]
    tau: Mapping[str, E.Expr]
    rho: Mapping[int, int]
    note: str = ""
    inverse: Mapping[str, E.Expr] | None = None

    def text(self) -> str:
        new = ", ".join("$" + v for lv in self.new for v in lv.vars)
        old = ", ".join(f"${k} = {E.to_str(v)}" for k, v in self.tau.items())
        return f"{self.kind}: tau({new}) = ({old})"


@dataclass
class Transformed:
    """A rewritten program with the obligations its transforms incurred.

    ``program`` is the candidate (``None`` when it could not be built);
    ``result`` is the program to use: the candidate when every required
    obligation is proved (or assumed), else the source (T-10)."""

    source: TileProgram
    program: TileProgram | None
    obligations: list[Obligation] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)
    level_map: dict[int, int] = field(default_factory=dict)
    reason: str = ""

    def check(self, timeout: float = 5.0, assume: Sequence[str] = (),
              engine: str = "auto") -> Transformed:
        """Discharge the pending obligations (each solver call bounded by
        ``timeout`` seconds; ``assume`` names obligations to take as proved,
        as ``tilenest check --assume`` does); returns this object."""
        discharge(self.obligations, timeout, engine, assume)
        return self

    @property
    def admitted(self) -> bool:
        """Whether the candidate is usable: it was built and every required
        obligation is proved or assumed (pending ones are checked first)."""
        if any(o.status == "pending" for o in self.obligations):
            self.check()
        return self.program is not None and outcome(self.obligations) == 0

    @property
    def result(self) -> TileProgram:
        """The candidate when ``admitted``, else the source program."""
        return self.program if self.admitted and self.program is not None else self.source

    def verdicts(self) -> dict[str, str]:
        """Each obligation kind with its status (``proved``, ``refuted``,
        ``unknown``, ``assumed``, ``pending``)."""
        return {o.kind: o.status for o in self.obligations}


# ---------------------------------------------------------------------------
# observed cuts


@dataclass
class Observed:
    factor: list[Operation] = field(default_factory=list)
    identity: list[Operation] = field(default_factory=list)
    why: set[str] = field(default_factory=set)


def observed_cuts(m: Model, exclude: frozenset[int] = frozenset()) -> dict[int, Observed]:
    """Level -> the ops observing its cut (see the module docstring). The ops in
    ``exclude`` (the chain being rewritten: its own threading of carried values
    is rebuilt by the rewrite) are not observers."""
    an = m.an
    out: dict[int, Observed] = {}

    def add(level: int, op: Operation, identity: bool, why: str) -> None:
        ob = out.setdefault(level, Observed())
        (ob.identity if identity else ob.factor).append(op)
        ob.why.add(why)

    for op in m.p.walk():
        if op.name == "yield" or (op.name == "parallel" and not op.operands) or \
                op.oid in exclude:
            continue
        f, a = an.frontier[op.oid], an.anchor[op.oid]
        # a replicated read observes nothing new; writes and allocations have identity
        effect = op.name in WRITE_OPS
        carried = bool(op.regions and op.results) or (op.name == "parallel" and op.operands)
        if op.name != "parallel":
            add(f, op, False, "frontier")
        add(a, op, effect or carried, "anchor")
        if op.name == "memory.alloc":
            add(f, op, True, "Memory owner")
        if op.name == "parallel":
            add(f, op, True, "join of carried values")
            for v in op.operands:
                add(an.value_anchor.get(v.name, 0), op, True, "home of a carried value")
    return out


# ---------------------------------------------------------------------------
# obligations


def _chain_ops(m: Model, chain: Sequence[int]) -> list[Operation]:
    ops = [m.level_op(lv) for lv in chain]  # a TransformError naming the program's levels
    for a, b in zip(ops, ops[1:], strict=False):
        if m.an.nest.levels[b.attrs["level"]].parent != a.attrs["level"]:
            raise TransformError(f"level {b.attrs['level']} is not a child of level "
                                 f"{a.attrs['level']}", a.loc)
    return ops


def _prime(vs: Sequence[str], k: int) -> dict[str, str]:
    return {v: v + "'" * k for v in vs}


def remap_obligations(m: Model, r: Remap) -> list[Obligation]:
    ops = _chain_ops(m, r.chain)
    outer = m.instance(ops[0])
    old_vars = [v for op in ops for v in op.attrs["vars"]]
    old_A = Fm.conj(*(Fm.atom(op.attrs["domain"].constraint()) for op in ops))
    new_vars = [v for lv in r.new for v in lv.vars]
    sites = m.sites(*ops)
    info: dict[str, VarInfo] = dict(outer.info)
    for op in ops:
        dom = op.attrs["domain"]
        for i, v in enumerate(dom.vars):
            info[v] = VarInfo(dom.space.factors[i].dim.describe(),
                              f"old coordinate (level {op.attrs['level']} at {where(op)})")

    def new_copy(k: int) -> tuple[list[str], Fm.F, list[E.Expr], dict[E.Expr, E.Expr]]:
        ren = _prime(new_vars, k)
        act = Fm.rename(Fm.conj(*(Fm.atom(lv.domain.constraint()) for lv in r.new)), ren)
        sub = {E.Var(a): E.Var(b) for a, b in ren.items()}
        taus = [E.subst(r.tau[v], sub) for v in old_vars]
        for lv in r.new:
            for i, v in enumerate(lv.vars):
                info[ren[v]] = VarInfo(lv.domain.space.factors[i].dim.describe() + "'" * k,
                                       "new coordinate")
        return [ren[v] for v in new_vars], act, taus, sub

    x, Ax, tx, _ = new_copy(1)
    y, Ay, ty, _ = new_copy(2)
    hyp0 = outer.constraint
    obs: list[Obligation] = []
    label = r.kind

    def explain_new(pt: dict, xs: list[str], taus: list[E.Expr]) -> str:
        env = Fm.env_of(pt, m.params)
        new = ", ".join(f"{info[v].label}={pt.get(v)}" for v in xs)
        try:
            old = ", ".join(f"{info[v].label}={E.evaluate(t, env)}"
                            for v, t in zip(old_vars, taus, strict=True))
        except KeyError:
            old = "?"
        return f"new ({new}) -> old ({old})"

    mk = {"assume": m.assumptions}
    at_tau = {E.Var(v): t for v, t in zip(old_vars, tx, strict=True)}
    obs.append(Obligation(
        "tau.function", f"{label}: every active new point maps into the old active set",
        sites, Fm.Claim(tuple(outer.vars + x), Fm.conj(hyp0, Ax), Fm.subst(old_A, at_tau), **mk),
        info=info, explain=lambda pt: [explain_new(pt, x, tx) + " outside the old domain"]))
    cover_body = Fm.conj(Ax, Fm.eqs(tx, [E.Var(v) for v in old_vars]))
    lemma = None
    if r.inverse is not None:
        wit = {E.Var(v): r.inverse[n] for v, n in zip(x, new_vars, strict=True)}
        lemma = Fm.Claim(tuple(outer.vars + old_vars), Fm.conj(hyp0, old_A),
                         Fm.subst(cover_body, wit), **mk)
    obs.append(Obligation(
        "tau.cover", f"{label}: every active old point is performed by some new point",
        sites, Fm.Claim(tuple(outer.vars + old_vars), Fm.conj(hyp0, old_A),
                        Fm.exists(x, cover_body), **mk), lemma=lemma, info=info,
        explain=lambda pt: ["old point (" + ", ".join(
            f"{info[v].label}={pt.get(v)}" for v in old_vars) + ") has no new preimage"]))
    obs.append(Obligation(
        "tau.injective", f"{label}: distinct new points perform distinct old points",
        sites, Fm.Claim(tuple(outer.vars + x + y), Fm.conj(hyp0, Ax, Ay, Fm.eqs(tx, ty)),
                        Fm.eqs([E.Var(v) for v in x], [E.Var(v) for v in y]), **mk),
        info=info, explain=lambda pt: [explain_new(pt, x, tx), explain_new(pt, y, ty)]))

    # observed cuts inside the chain
    cuts = observed_cuts(m, frozenset(o.oid for o in ops[1:]))
    depth_vars: list[int] = []  # number of new vars up to and including level i
    acc = 0
    for lv in r.new:
        acc += len(lv.vars)
        depth_vars.append(acc)
    old_depth: list[int] = []
    acc = 0
    for op in ops:
        acc += len(op.attrs["vars"])
        old_depth.append(acc)
    for j, op in enumerate(ops):
        level = op.attrs["level"]
        ob = cuts.get(level)
        if ob is None:
            continue
        k = r.rho.get(level, len(r.new) - 1)
        if j == len(ops) - 1 and k == len(r.new) - 1:
            continue  # the leaf cut: tau_j = tau
        nk = depth_vars[k] if k >= 0 else 0
        nj = old_depth[j]
        px, py = [E.Var(v) for v in x[:nk]], [E.Var(v) for v in y[:nk]]
        why = ", ".join(sorted(ob.why))
        csites = sites + m.sites(*(ob.factor + ob.identity)[:3])
        obs.append(Obligation(
            "cut.factor", f"{label}: the old level-{level} ancestor ({why}) depends only on "
            f"the new prefix through level {k}", csites,
            Fm.Claim(tuple(outer.vars + x + y), Fm.conj(hyp0, Ax, Ay, Fm.eqs(px, py)),
                     Fm.eqs(tx[:nj], ty[:nj]), **mk), info=info,
            explain=lambda pt, nk=nk: [
                "two new points sharing the new prefix ("
                + ", ".join(f"{info[v].label}={pt.get(v)}" for v in x[:nk])
                + ") map to different old ancestors:",
                "  " + explain_new(pt, x, tx), "  " + explain_new(pt, y, ty)]))
        if ob.identity:
            obs.append(Obligation(
                "cut.identity", f"{label}: level-{level} identities ({why}) stay one-to-one "
                f"with new level-{k} prefixes", csites,
                Fm.Claim(tuple(outer.vars + x + y),
                         Fm.conj(hyp0, Ax, Ay, Fm.eqs(tx[:nj], ty[:nj])), Fm.eqs(px, py), **mk),
                info=info, explain=lambda pt: [
                    "two distinct new prefixes claim one old identity:",
                    "  " + explain_new(pt, x, tx), "  " + explain_new(pt, y, ty)]))
            if k < len(r.new) - 1:
                pre = Fm.rename(Fm.conj(*(Fm.atom(lv.domain.constraint())
                                          for lv in r.new[:k + 1])), _prime(new_vars, 1))
                obs.append(Obligation(
                    "cut.identity", f"{label}: every active new level-{k} prefix has active "
                    "work below it", csites,
                    Fm.Claim(tuple(outer.vars + x[:nk]), Fm.conj(hyp0, pre),
                             Fm.exists(x[nk:], Ax), **mk), info=info))
    return obs


# ---------------------------------------------------------------------------
# the rewrite


def _perfect(ops: list[Operation]) -> str:
    for a, b in zip(ops, ops[1:], strict=False):
        body = a.regions[0]
        if len(body.ops) != 2 or body.ops[0] is not b:
            return (f"level {a.attrs['level']} ({where(a)}) holds ops besides its child level; "
                    "they have no place in the new nest")
        if tuple(body.args) != tuple(b.operands) or \
                tuple(body.ops[1].operands) != tuple(b.results):
            return f"level {a.attrs['level']} does not pass its carried values straight through"
    return ""


def build(p: TileProgram, m: Model, r: Remap) -> tuple[TileProgram | None, dict[int, int], str]:
    """The rewritten candidate, ``old level -> new level id``, and a reason when
    no candidate can be built."""
    ops = _chain_ops(m, r.chain)
    why = _perfect(ops)
    if why and (any(o.operands for o in ops) or not r.new):
        return None, {}, why + " (and carried values cross the chain)"
    names = RW.Names(p)
    fresh_level = RW.max_level(p) + 1
    ids: list[int] = []
    for i in range(len(r.new)):
        if i < len(r.chain):
            ids.append(r.chain[i])
        else:
            ids.append(fresh_level)
            fresh_level += 1
    parent = m.an.nest.levels[r.chain[0]].parent
    lmap = {lv: (ids[r.rho[lv]] if r.rho.get(lv, 0) >= 0 and r.new else parent)
            for lv in r.chain}
    sub = {E.Var(k): v for k, v in r.tau.items() if v != E.Var(k)}
    rb = RW.Rebuilder(sub, lmap)
    leaf = ops[-1].regions[0]
    body = rb.block(leaf)
    first = ops[0]
    dims = [f.dim for lv in r.new for f in lv.domain.space.factors]
    if not r.new:
        return _inline(p, first, body), lmap, ""
    nest = _nest_untied(ops, r, rb, body, ids) if why else _nest_threaded(r, body, first, ids,
                                                                          names)
    return RW.replace_op(p, first.oid, lambda _o: [nest], dims), lmap, ""


def _inline(p: TileProgram, first: Operation, body: Block) -> TileProgram:
    """The chain disappears: its (substituted) body replaces it in the parent
    block, block arguments becoming the incoming values and results the yielded."""
    y = body.terminator
    assert y is not None
    valmap = {a.name: o for a, o in zip(body.args, first.operands, strict=True)}
    res = {v.name: valmap.get(w.name, w) for v, w in zip(first.results, y.operands, strict=True)}
    inl = RW.Rebuilder({}, {}, {**valmap, **res})
    ops = [inl.op(o) for o in body.ops[:-1]]
    return _rename_uses(RW.replace_op(p, first.oid, lambda _o: ops), res)


def _nest_untied(ops: list[Operation], r: Remap, rb: RW.Rebuilder, body: Block,
                 ids: list[int]) -> Operation:
    """A non-perfect chain without carried values: the ops of old level ``j`` go
    to the body of new level ``rho(j)``, around the next new level."""
    before: dict[int, list[Operation]] = {i: [] for i in range(len(r.new))}
    after: dict[int, list[Operation]] = {i: [] for i in range(len(r.new))}
    for j, op in enumerate(ops[:-1]):
        k = r.rho.get(op.attrs["level"], 0)
        content = list(op.regions[0].ops[:-1])
        at = content.index(ops[j + 1])
        before[k] += [rb.op(o) for o in content[:at]]
        after[k] = [rb.op(o) for o in content[at + 1:]] + after[k]
    k_leaf = r.rho.get(ops[-1].attrs["level"], len(r.new) - 1)
    before[k_leaf] += list(body.ops[:-1])
    loc = ops[0].loc
    inner: Operation | None = None
    for i in range(len(r.new) - 1, -1, -1):
        lv = r.new[i]
        here = before[i] + ([inner] if inner is not None else []) + after[i]
        inner = RW.parallel_op(lv.vars, lv.domain, ids[i], RW.with_yield(here, (), loc), (), (),
                               lv.exec, loc)
    assert inner is not None
    return inner


def _nest_threaded(r: Remap, body: Block, first: Operation, ids: list[int],
                   names: RW.Names) -> Operation:
    """A perfect chain: the leaf body becomes the innermost new level's body and
    carried values are threaded through fresh block arguments and results."""
    args = body.args
    inner: Operation | None = None
    for i in range(len(r.new) - 1, -1, -1):
        lv = r.new[i]
        if i == 0:
            operands, results = first.operands, first.results
        else:
            operands = tuple(Value(names.fresh(f"{a.name}_n{i}"), a.type) for a in args)
            results = tuple(Value(names.fresh(f"{a.name}_j{i}"), a.type) for a in args)
        if inner is None:
            blk = Block(tuple(args), body.ops)
        else:
            blk = Block(tuple(args), RW.with_yield([inner], inner.results, first.loc).ops)
        inner = RW.parallel_op(lv.vars, lv.domain, ids[i], blk, operands, results, lv.exec,
                               first.loc)
        args = operands
    assert inner is not None
    return inner


def _rename_uses(p: TileProgram, res: Mapping[str, Value]) -> TileProgram:
    rb = RW.Rebuilder({}, {}, dict(res))
    return TileProgram(p.name, p.args, p.syms, p.assumptions, p.dims, rb.block(p.body),
                       p.reducers, p.loc)


def rewrite_obligation(m: Model, q: TileProgram | None, back: Mapping[int, int],
                       lmap: Mapping[int, int], r: Remap, reason: str) -> Obligation:
    """``rewrite``: the candidate verifies and places every op at rho of its
    old frontier, with anchors at most rho of the old ones."""
    from ..semantics.verify import verify

    sites = m.sites(*(_chain_ops(m, r.chain)))
    ob = Obligation("rewrite", f"{r.kind}: the rewritten program verifies and keeps "
                    "anchor' <= rho(anchor), frontier' = rho(frontier)", sites,
                    formula_text="verify(P') and for every op o: frontier'(o) = rho(frontier(o)) "
                    "and anchor'(o) is rho(anchor(o)) or one of its ancestors")

    def decide(o: Obligation, timeout: float) -> None:
        if q is None:
            o.set(REFUTED, "structural", reason)
            return
        try:
            verify(q)
        except TilenestError as e:
            o.set(REFUTED, "structural", f"the rewritten program does not verify: {e.message}")
            return
        an2 = q.analysis
        old = m.an
        for new_oid, old_oid in back.items():
            op_old = m.p.ops_by_id[old_oid]
            if op_old.name in ("yield",):
                continue
            f_want = lmap.get(old.frontier[old_oid], old.frontier[old_oid])
            a_want = lmap.get(old.anchor[old_oid], old.anchor[old_oid])
            f_got, a_got = an2.frontier[new_oid], an2.anchor[new_oid]
            ok_a = an2.nest.is_ancestor(a_got, a_want)
            if f_got != f_want or not ok_a:
                o.set(REFUTED, "structural",
                      f"'{op_old.name}' at {where(op_old)}: frontier L{f_got} / anchor L{a_got}"
                      f" after the rewrite, rho gives frontier L{f_want} / anchor L{a_want}")
                o.counterexample = {"op": op_old.name, "site": where(op_old),
                                    "frontier": f_got, "anchor": a_got,
                                    "rho_frontier": f_want, "rho_anchor": a_want}
                return
        o.set(PROVED, "structural")

    ob.decider = decide
    return ob


def apply(source: TileProgram | Transformed, r: Remap) -> Transformed:
    """State and apply ``r``: obligations plus the rewritten candidate."""
    prev = source if isinstance(source, Transformed) else None
    p = prev.program if prev is not None else source
    if p is None:
        assert prev is not None
        return Transformed(prev.source, None, list(prev.obligations), list(prev.steps),
                           dict(prev.level_map), prev.reason)
    assert isinstance(p, TileProgram)
    m = Model(p)
    obs = remap_obligations(m, r)
    for ob in obs:
        ob.witness = {"remap": r, "program": p}
    try:
        q, lmap, reason = build(p, m, r)
    except TilenestError as e:  # the remap cannot be realized on this program: refuted
        q, lmap, reason = None, {}, f"rewrite failed: {e.message}"
    except Exception as e:  # a bug of the rewriter, never a verdict on the program
        from .obligation import checker_bug

        raise checker_bug(e, f"rewriting the program for {r.kind}", m.sites(
            *(op for op in m.ops("parallel") if op.attrs["level"] in r.chain))) from e
    back: dict[int, int] = {}
    if q is not None:
        q, back = RW.finish(q)
        from ..semantics.verify import verify

        try:
            verify(q)
        except TilenestError as e:
            q, reason = None, f"the rewritten program does not verify: {e.message}"
    obs.append(rewrite_obligation(m, q, back, lmap, r, reason))
    if prev is None:
        return Transformed(p, q, obs, [r.text()], dict(lmap), reason)
    composed = {k: lmap.get(v, v) for k, v in prev.level_map.items()}
    composed.update({k: v for k, v in lmap.items() if k not in composed})
    return Transformed(prev.source, q, prev.obligations + obs, prev.steps + [r.text()],
                       composed, reason or prev.reason)


def program_of(x: TileProgram | Transformed) -> TileProgram:
    if isinstance(x, Transformed):
        if x.program is None:
            raise TransformError(f"the previous transform produced no program: {x.reason}")
        return x.program
    if not isinstance(x, TileProgram):
        x = getattr(x, "program", x)
    if not isinstance(x, TileProgram):
        raise TransformError("transforms take a TileProgram, a kernel or a Transformed")
    return x

