"""Reduction placement and reducer laws (``calculus.md``, "Strength is a product
order"; ``spec/transforms.md`` T-9).

**Laws.** For a contract with merge ``m`` and identity ``e`` in the state's
dtype, decided by Z3 (bit-vectors for integers and bools, IEEE floats with
round-to-nearest-even, reals for the algebra a float contract claims)::

    reduction.law.associative   forall a, b, c: m(m(a, b), c) = m(a, m(b, c))
    reduction.law.commutative   forall a, b:    m(a, b) = m(b, a)
    reduction.law.identity      forall a:       m(e, a) = a = m(a, e)

Equality is bitwise up to NaN payloads. Laws and permission are separate
evidence: float ``add``/``mul`` fail associativity (a Z3 floating-point
counterexample), and their regrouping is admitted by the ``unordered_tree`` /
``ordered_tree`` *permission*, not by a law; those law obligations have
``role = "evidence"`` and never decide the outcome. Exact laws (integers,
bools, float ``max``/``min``, custom merges over the reals) are required.
A custom float merge is decided by :mod:`~tilenest.proofs.real_laws`
(division with cleared denominators, on the states the reduction can form),
and each law is stated once per contract, with the sites of every region
that uses it. :func:`tree_law_verdict` answers the interpreter's question
"are this reducer's tree laws proved?" (``semantics.reducers.tree_laws``).

**Placement.** Factoring a reduce domain ``D`` (linearized row-major, ``n``
points) into ``P`` participants times ``S = ceil(n / P)`` serial steps,
``blocked`` ``r = p*S + s`` or ``strided`` ``r = s*P + p``, active where
``r < n``::

    reduction.cover       the placement is a bijection onto D (every contribution once)
    reduction.permission  the policy is a tree (fold_left/fold_right fix one order)
    reduction.order       (ordered_tree, or a merge that is not commutative)
                          (p, s) <lex (p', s')  =>  r(p, s) < r(p', s')
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..semantics import expr as E
from ..semantics.dtypes import DType
from ..semantics.ir import Block, Operation, TileProgram
from ..semantics.policies import ReductionPolicy
from ..semantics.reducers import BUILTINS, Builtin, CustomReducer, install_law_oracle
from ..semantics.types import TileType
from . import formula as Fm
from .model import Model, VarInfo
from .obligation import PROVED, REFUTED, UNKNOWN, Obligation
from .real_laws import algebra_key, real_law_obligations
from .remap import Transformed, TransformError, program_of
from .transforms import transform_entry

_SCALAR_BINARY = ("add", "sub", "mul", "div", "maximum", "minimum", "and", "or", "xor")


#: law answers of this process, keyed by (law, merge, dtype, domain): a law of
#: a builtin merge in one dtype does not change between reduce regions
_CACHE: dict[tuple, Any] = {}

#: seconds an IEEE law of a custom float merge may take: those laws are evidence
#: (the tree permission admits the rounding), so they never hold up a compile
EVIDENCE_BUDGET = 0.25


def _law_obligation(kind: str, title: str, sites: tuple, role: str, note: str,
                    run: Callable[[float], Any], alg_desc: str,
                    key: tuple | None = None, budget: float | None = None) -> Obligation:
    ob = Obligation(kind, title, sites, role=role, formula_text=title)

    def decide(o: Obligation, timeout: float) -> None:
        try:
            a = _CACHE.get(key) if key is not None else None
            if a is None:
                a = run(timeout if budget is None else min(timeout, budget))
                if key is not None and (a.status != "unknown" or role == "evidence"):
                    _CACHE[key] = a
        except (KeyError, ValueError, TypeError) as e:
            o.set(UNKNOWN, "z3", f"no exact semantics: {e}")
            return
        if a.status == "unsat":
            o.set(PROVED, f"z3 ({alg_desc})")
        elif a.status == "sat":
            o.set(REFUTED, f"z3 ({alg_desc})", note, a.point)
            o.details = [", ".join(f"{k} = {_show(v)}" for k, v in a.point.items())]
            if note:
                o.details.append(note)
        else:
            o.set(UNKNOWN, f"z3 ({alg_desc})", a.reason)

    ob.decider = decide
    return ob


def _show(v: Any) -> str:
    if isinstance(v, tuple):
        return "(" + ", ".join(_show(x) for x in v) + ")" if len(v) != 1 else _show(v[0])
    if isinstance(v, float):
        return repr(v)
    return str(v)


def law_obligations(merge: Callable[[Any, list, list], list], identity: Sequence[Any],
                    dt: DType, width: int, name: str, sites: tuple, *, need_comm: bool,
                    role: str = "required", note: str = "", real: bool = False,
                    expect: bool | None = None, cache: bool = False, algebra: str = "",
                    budget: float | None = None) -> list[Obligation]:
    """The three laws of ``merge`` (a function ``(alg, a, b) -> state``);
    ``cache``: answers are shared by identical builtin laws in one process;
    ``algebra``: the same for a custom merge of that text (an evidence row's
    undecided answer included); ``budget``: at most this many seconds a law."""
    from . import z3_engine as Z

    desc = "reals" if real else (f"IEEE {dt}" if dt.is_float else
                                 ("bool" if dt.is_bool else f"{dt.bits}-bit vectors"))

    def alg() -> Any:
        return Z.Scalar(dt, real=real)

    def assoc(t: float) -> Any:
        s = alg()
        return Z.prove_law(s, ("a", "b", "c"),
                           lambda a, b, c: merge(s, merge(s, a, b), c),
                           lambda a, b, c: merge(s, a, merge(s, b, c)), width, t, expect)

    def comm(t: float) -> Any:
        s = alg()
        return Z.prove_law(s, ("a", "b"), lambda a, b: merge(s, a, b),
                           lambda a, b: merge(s, b, a), width, t, True)

    def ident(t: float) -> Any:
        s = alg()
        e = [s.const(v) for v in identity]
        return Z.prove_law(s, ("a",), lambda a: merge(s, e, a) + merge(s, a, e),
                           lambda a: list(a) + list(a), width, t, True)

    pre = f"{name} on {desc}"

    def key(law: str) -> tuple | None:
        if algebra:
            return (law, algebra, dt.name, real, role)
        return (law, name, dt.name, real, tuple(map(repr, identity))) if cache else None

    obs = [_law_obligation("reduction.law.associative", f"{pre}: merge is associative", sites,
                           role, note, assoc, desc, key("assoc"), budget)]
    if need_comm:
        obs.append(_law_obligation("reduction.law.commutative", f"{pre}: merge is commutative",
                                   sites, role, note, comm, desc, key("comm"), budget))
    obs.append(_law_obligation("reduction.law.identity", f"{pre}: the identity "
                               f"{list(identity)} is two-sided", sites, role, note, ident, desc,
                               key("ident"), budget))
    return obs


def builtin_merge(b: Builtin) -> Callable[[Any, list, list], list]:
    return lambda s, a, c: [s.op(b.op, a[0], c[0])]


def block_merge(block: Block, width: int) -> Callable[[Any, list, list], list]:
    """A custom reducer's merge region as a function on Z3 terms."""

    def run(s: Any, a: list, b: list) -> list:
        env: dict[str, Any] = {}
        for arg, v in zip(block.args, list(a) + list(b), strict=True):
            env[arg.name] = v
        for op in block.ops:
            if op.name == "yield":
                return [env[o.name] for o in op.operands]
            ins = [env[o.name] for o in op.operands]
            if op.name in _SCALAR_BINARY:
                out = s.op(op.name, *ins)
            elif op.name in ("neg", "abs", "not", "bitnot"):
                out = s.op(op.name, ins[0])
            elif op.name == "const":
                out = s.const(op.attrs["value"])
            elif op.name == "ite":
                out = s.ite(*ins)
            elif op.name in ("lt", "le", "gt", "ge", "eq", "ne"):
                out = s.compare(op.name, *ins)
            else:
                raise KeyError(f"op '{op.name}' in a reducer merge")
            env[op.results[0].name] = out
        raise KeyError("merge region without yield")

    return run


def contract_obligations(p: TileProgram, op: Operation, need_comm: bool) -> list[Obligation]:
    """Law obligations of the contracts of reduce ``op``: each law once per
    contract (a builtin per dtype, a custom reducer for all the states it
    covers), on the states ``op`` can form."""
    sites = (op.loc,) if op.loc is not None else ()
    out: list[Obligation] = []
    customs = {f"@{r.name}": r for r in p.reducers}
    seen: set[tuple] = set()
    for c, v in zip(op.attrs["contracts"], op.operands, strict=True):
        t = v.type
        if not isinstance(t, TileType) or c is None:
            continue
        if c in BUILTINS and (c, t.dtype) not in seen:
            seen.add((c, t.dtype))
            out += builtin_law_obligations(BUILTINS[c], t.dtype, op.attrs["policy"], sites,
                                           need_comm)
        elif c in customs and c not in seen:
            seen.add(c)
            out += custom_law_obligations(p, customs[c], [op], need_comm, sites)
    return out


def builtin_law_obligations(b: Builtin, dt: DType, policy: ReductionPolicy, sites: tuple,
                            need_comm: bool) -> list[Obligation]:
    """The laws of builtin ``b`` in ``dt``: required where they hold exactly,
    evidence where the policy's permission admits the regrouping."""
    exact = b.exact_for(dt)
    note = "" if exact else (f"{b.name} on {dt} is not a lawful monoid; the "
                             f"{policy.value} permission admits the regrouping")
    return law_obligations(builtin_merge(b), (b.identity(dt),), dt, 1, b.name, sites,
                           need_comm=need_comm, role="required" if exact else "evidence",
                           note=note, expect=exact, cache=True)


def custom_law_obligations(p: TileProgram, r: CustomReducer, uses: Sequence[Operation],
                           need_comm: bool, sites: tuple, *, ieee: bool = True
                           ) -> list[Obligation]:
    """The laws of custom reducer ``r`` that the tree-policy regions ``uses``
    rely on: over the reals on the states they can form (float states,
    :mod:`~tilenest.proofs.real_laws`; ``ieee``: the IEEE laws as evidence
    too), or on bit-vectors (integers, bools)."""
    c = f"@{r.name}"
    dts = set(r.state)
    if len(dts) != 1:
        ob = Obligation("reduction.law.associative", f"{c}: mixed state dtypes", sites)
        ob.decider = lambda o, tt: o.set(UNKNOWN, "z3", "mixed-dtype reducer states")
        return [ob]
    (sdt,) = dts
    comm = need_comm or r.commutative
    alg = algebra_key(r)
    if not sdt.is_float:
        return law_obligations(block_merge(r.merge, len(r.state)), r.identity, sdt,
                               len(r.state), c, sites, need_comm=comm, algebra=alg)
    out = real_law_obligations(p, r, uses, comm, sites)
    if ieee:
        # evidence only: a short search (fixed probe points first), never a verdict
        out += law_obligations(block_merge(r.merge, len(r.state)), r.identity, sdt,
                               len(r.state), c, sites, need_comm=comm, role="evidence",
                               note="IEEE rounding: admitted by the tree permission",
                               algebra=alg, budget=EVIDENCE_BUDGET)
    return out


def program_reduction_obligations(m: Model) -> list[Obligation]:
    """Laws every tree-policy reduce region of the program relies on
    (commutativity under ``unordered_tree``, which permits permutations),
    each law once per contract: the sites are every region that uses it."""
    customs = {f"@{r.name}": r for r in m.p.reducers}
    builtin: dict[tuple, tuple[Builtin, DType, ReductionPolicy, list]] = {}
    custom: dict[str, tuple[list[Operation], list, list[bool]]] = {}
    for op in m.ops("reduce"):
        pol = op.attrs["policy"]
        if not pol.is_tree:
            continue
        comm = pol is ReductionPolicy.unordered_tree
        site = [op.loc] if op.loc is not None else []
        for c, v in zip(op.attrs["contracts"], op.operands, strict=True):
            if c is None or not isinstance(v.type, TileType):
                continue
            if c in BUILTINS:
                entry = builtin.setdefault((c, v.type.dtype, comm),
                                           (BUILTINS[c], v.type.dtype, pol, []))
                entry[3].extend(x for x in site if x not in entry[3])
            elif c in customs:
                ops, sites, comms = custom.setdefault(c, ([], [], []))
                if op not in ops:
                    ops.append(op)
                    comms.append(comm)
                    sites.extend(x for x in site if x not in sites)
    out: list[Obligation] = []
    for (_, _, comm), (b, dt, pol, sites) in builtin.items():
        out += builtin_law_obligations(b, dt, pol, tuple(sites), comm)
    for c, (ops, sites, comms) in custom.items():
        out += custom_law_obligations(m.p, customs[c], ops, any(comms), tuple(sites))
    return out


def reduces(p: TileProgram) -> list[Operation]:
    return [o for o in p.walk() if o.name == "reduce"]


def _linear(vs: Sequence[E.Expr], extents: Sequence[E.Expr]) -> E.Expr:
    out: E.Expr = E.Const(0)
    for v, e in zip(vs, extents, strict=True):
        out = out * e + v
    return out


@transform_entry
def place_reduction(x: Any, index: int, participants: E.IntLike, order: str = "blocked",
                    steps: E.IntLike | None = None) -> Transformed:
    """State a ReductionPlacement of the ``index``-th reduce region (program
    order) onto ``participants`` x serial steps (see the module docstring)."""
    p = program_of(x)
    m = Model(p)
    rs = reduces(p)
    if not 0 <= index < len(rs):
        raise TransformError(f"the program has {len(rs)} reduce region(s); no reduce {index}")
    if order not in ("blocked", "strided"):
        raise TransformError(f"unknown placement order '{order}'", hint="blocked or strided")
    op = rs[index]
    dom = op.attrs["domain"]
    policy: ReductionPolicy = op.attrs["policy"]
    outer = m.instance(op)
    n: E.Expr = E.Const(1)
    for e in dom.space.extents:
        n = n * e
    P = E.lift(participants)
    S = E.cdiv(n, P) if steps is None else E.lift(steps)
    pv, sv = E.Var("p@"), E.Var("s@")

    def r_of(a: E.Expr, b: E.Expr) -> E.Expr:
        return a * S + b if order == "blocked" else b * P + a

    def placed(a: E.Expr, b: E.Expr) -> Fm.F:
        return Fm.conj(Fm.in_box([a, b], [P, S]), Fm.atom(r_of(a, b).lt(n)))

    xs = [E.Var(v) for v in dom.vars]
    lin = _linear(xs, dom.space.extents)
    D = Fm.atom(dom.constraint())
    sites = m.sites(op)
    info = {**outer.info, "p@": VarInfo("participant"), "s@": VarInfo("step"),
            "p@'": VarInfo("participant'"), "s@'": VarInfo("step'")}
    for i, v in enumerate(dom.vars):
        info[v] = VarInfo(dom.space.factors[i].dim.describe(), "reduce coordinate")
    hyp0 = outer.constraint
    pv2, sv2 = E.Var("p@'"), E.Var("s@'")
    digits = _digits(r_of(pv, sv), dom.space.extents)
    obs: list[Obligation] = []
    wit = {"r": r_of, "P": P, "S": S, "n": n}
    obs.append(Obligation(
        "reduction.cover", f"{order} placement on {E.to_str(P)} participants: every "
        "contribution is placed exactly once (into D)", sites,
        Fm.Claim(tuple(outer.vars) + ("p@", "s@"), Fm.conj(hyp0, placed(pv, sv)),
                 Fm.subst(D, dict(zip(xs, digits, strict=True))), m.assumptions), info=info))
    body = Fm.conj(placed(pv, sv), Fm.atom(r_of(pv, sv).eq(lin)))
    inv = {pv: lin // S, sv: lin % S} if order == "blocked" else {pv: lin % P, sv: lin // P}
    obs.append(Obligation(
        "reduction.cover", f"{order} placement: every contribution of D is placed", sites,
        Fm.Claim(tuple(outer.vars) + tuple(dom.vars), Fm.conj(hyp0, D),
                 Fm.exists(["p@", "s@"], body), m.assumptions),
        lemma=Fm.Claim(tuple(outer.vars) + tuple(dom.vars), Fm.conj(hyp0, D),
                       Fm.subst(body, inv), m.assumptions), info=info))
    obs.append(Obligation(
        "reduction.cover", f"{order} placement: no contribution is placed twice", sites,
        Fm.Claim(tuple(outer.vars) + ("p@", "s@", "p@'", "s@'"),
                 Fm.conj(hyp0, placed(pv, sv), placed(pv2, sv2),
                         Fm.atom(r_of(pv, sv).eq(r_of(pv2, sv2)))),
                 Fm.eqs([pv, sv], [pv2, sv2]), m.assumptions), info=info))
    perm = Obligation("reduction.permission", f"policy {policy.value} permits factoring "
                      "into participants and merging partial states", sites,
                      formula_text=f"{policy.value} is a tree policy")
    perm.decider = (lambda o, t: o.set(PROVED, "policy")) if policy.is_tree else (
        lambda o, t: o.set(REFUTED, "policy", f"{policy.value} fixes the source order of "
                           "the fold; only independent groups may run in parallel",
                           {"policy": policy.value}))
    obs.append(perm)
    customs = {f"@{r.name}": r for r in p.reducers}
    commutative = all(c is not None and (c in BUILTINS or customs[c].commutative)
                      for c in op.attrs["contracts"])
    if policy is ReductionPolicy.ordered_tree or not commutative:
        obs.append(Obligation(
            "reduction.order", f"{order} placement keeps contribution order (pieces are "
            "contiguous and merged in participant order)", sites,
            Fm.Claim(tuple(outer.vars) + ("p@", "s@", "p@'", "s@'"),
                     Fm.conj(hyp0, placed(pv, sv), placed(pv2, sv2),
                             Fm.lex_lt([pv, sv], [pv2, sv2])),
                     Fm.atom(r_of(pv, sv).lt(r_of(pv2, sv2))), m.assumptions), info=info,
            explain=lambda pt: [
                f"(participant {pt.get('p@')}, step {pt.get('s@')}) precedes (participant "
                f"{pt.get('p@' + chr(39))}, step {pt.get('s@' + chr(39))}) but takes a later "
                "contribution"]))
    for o in obs:
        o.witness = wit
    if policy.is_tree:
        obs += contract_obligations(p, op, need_comm=policy is ReductionPolicy.unordered_tree)
    step = f"place reduce {index}: {order}, {E.to_str(P)} participants x {E.to_str(S)} steps"
    if isinstance(x, Transformed):
        return Transformed(x.source, p, x.obligations + obs, x.steps + [step], x.level_map)
    return Transformed(p, p, obs, [step])


def _digits(lin: E.Expr, extents: Sequence[E.Expr]) -> list[E.Expr]:
    out: list[E.Expr] = []
    for i in range(len(extents)):
        stride: E.Expr = E.Const(1)
        for e in extents[i + 1:]:
            stride = stride * e
        d = lin // stride
        out.append(d if i == 0 else d % extents[i])
    return out


#: budget of one law when the interpreter asks (seconds)
ORACLE_TIMEOUT = 2.0


def tree_law_verdict(p: TileProgram, r: CustomReducer, need_comm: bool) -> tuple[bool, str]:
    """Whether the laws of ``r`` that ``p``'s tree-policy regions rely on are
    proved (answers are kept per reducer algebra, see ``real_laws``), and if
    not, the first law that is not with its verdict and counterexample."""
    from .obligation import discharge

    uses = [o for o in p.walk() if o.name == "reduce" and o.attrs["policy"].is_tree
            and f"@{r.name}" in o.attrs["contracts"]]
    obs = [o for o in custom_law_obligations(p, r, uses, need_comm, (), ieee=False)
           if o.role == "required"]
    discharge(obs, timeout=ORACLE_TIMEOUT)
    for o in obs:
        if o.status != PROVED:
            lines = o.counterexample_lines() or ([o.reason] if o.reason else [])
            return False, f"{o.kind} {o.status}" + (f": {lines[0]}" if lines else "")
    return True, ""


install_law_oracle(tree_law_verdict)
