"""Fusion of sibling ``serial`` regions (spec T-8).

Two adjacent sibling regions ``serial_i(A(i)) ; serial_j(B(j))`` over one
domain ``D`` (equal extents and predicate once ``B``'s coordinates are renamed
to ``A``'s, and one iteration order) become ``serial_i(A(i) ; B(i))``. The
source runs every ``A(i)`` before every ``B(j)``; the fused loop runs
``A(i)`` before ``B(j)`` exactly when ``i`` is not after ``j`` in the
iteration order (``i <= j``; for ``order = "reverse"``, ``i >= j``).
Orders inside ``A`` and inside ``B`` are unchanged. So the fused program
performs the same accesses in an order that keeps every dependence exactly
when no dependence edge ``A(i) -> B(j)`` has ``j`` before ``i``.

Obligations:

* ``fusion.order`` -- for every pair of accesses ``a`` in ``A`` and ``b`` in
  ``B`` to one storage object (tensor, or Memory allocation), one writing
  (RAW, WAR and WAW edges alike)::

      forall o, i, j, u, v:  a(o, i, u) active and b(o, j, v) active and j < i
                             =>  elem_a(o, i, u) != elem_b(o, j, v)

  with ``<`` the iteration order and ``o`` the coordinates of the enclosing
  regions (shared). A refutation names both iterations, the element and both
  sites: the edge ``A(i) -> B(j)`` the fused loop would reverse.
* ``fusion.state`` -- no value ``A`` produces (a carried value's final
  state) is used by ``B``: such a use depends on ``A``'s *last* iteration
  from every ``B(j)``. The one exception is a Memory state token that ``B``
  receives as its initial state: in the fused loop that Memory's state is
  threaded through ``A(i)`` and then ``B(i)`` in each iteration, and the
  element accesses themselves are judged by ``fusion.order``. Decided
  structurally.
* ``rewrite`` -- the fused program verifies.

The rewrite concatenates the bodies (``B``'s coordinates renamed), carries
``A``'s values then ``B``'s, and names each result as before.
"""

from __future__ import annotations

from typing import Any

from ..semantics import expr as E
from ..semantics.ir import Block, FrozenDict, Operation, TileProgram, Value
from ..semantics.types import StateType
from . import formula as Fm
from . import rewrite as RW
from .model import Model, where
from .obligation import PROVED, REFUTED, Obligation
from .remap import Transformed, TransformError, program_of
from .transforms import transform_entry


def serial_regions(p: TileProgram) -> list[Operation]:
    """The program's ``serial`` regions in program order (pre-order): the
    numbering ``fuse_serial`` and ``--transform fuse_serial(K)`` use."""
    return [o for o in p.walk() if o.name == "serial"]


def _pair(m: Model, index: int) -> tuple[Operation, Operation]:
    serials = serial_regions(m.p)
    if not 0 <= index < len(serials):
        raise TransformError(
            f"the program has {len(serials)} serial region(s); there is no serial {index}",
            hint="serial regions are numbered from 0 in program order")
    a = serials[index]
    chain = m.chain[a.oid]
    block: Block = chain[-1][0].regions[chain[-1][1]] if chain else m.p.body
    ops = list(block.ops)
    k = next(n for n, o in enumerate(ops) if o is a)
    if k + 1 >= len(ops) or ops[k + 1].name != "serial":
        raise TransformError(f"serial {index} is not directly followed by a sibling serial "
                             "region", a.loc, "fuse_serial fuses adjacent sibling regions")
    return a, ops[k + 1]


def _used_names(ops: list[Operation]) -> dict[str, Operation]:
    """Every value name the ops (and their nested regions) read, with a user:
    operands and data values inside index attributes."""
    out: dict[str, Operation] = {}
    for top in ops:
        for op in [top] + [o for r in top.regions for o in r.walk()]:
            for v in op.operands:
                out.setdefault(v.name, op)
            for x in op.attrs.values():
                for lf in _vals(x):
                    out.setdefault(lf.name, op)
    return out


def _vals(x: Any) -> list[E.Val]:
    if isinstance(x, (E.Expr, E.Pred)):
        return [lf for lf in E.leaves(x) if isinstance(lf, E.Val)]
    if isinstance(x, tuple):
        return [lf for i in x for lf in _vals(i)]
    return []


@transform_entry
def fuse_serial(x: Any, index: int = 0) -> Transformed:
    """Fuse the ``index``-th ``serial`` region (program order) with the sibling
    ``serial`` right after it (see the module docstring)."""
    p = program_of(x)
    m = Model(p)
    a, b = _pair(m, index)
    da, db = a.attrs["domain"], b.attrs["domain"]
    sub = {E.Var(k): E.Var(v) for k, v in zip(db.vars, da.vars, strict=False)}
    if da.rank != db.rank or any(E.subst(u, sub) != w for u, w in
                                 zip(db.space.extents, da.space.extents, strict=True)) \
            or E.subst(db.pred, sub) != da.pred:
        raise TransformError("the two serial regions have different domains", m.sites(a, b),
                             "fusion matches iterations by equal domains")
    if a.attrs["order"] != b.attrs["order"]:
        raise TransformError("the two serial regions run in different orders "
                             f"({a.attrs['order']} and {b.attrs['order']})", m.sites(a, b))
    step = f"fuse_serial: serial {index} with the serial after it"
    state, chained, why = _state(m, a, b)
    obs = [state] + _order(m, a, b)
    q: TileProgram | None = None
    reason = ""
    if why is None:
        q = _rewrite(p, a, b, sub, chained)
        obs.append(RW.verified(q, m.sites(a, b)))
    else:
        reason = why
    prev = x if isinstance(x, Transformed) else None
    if prev is not None:
        return Transformed(prev.source, q, prev.obligations + obs, prev.steps + [step],
                           prev.level_map, reason)
    return Transformed(p, q, obs, [step], {}, reason)


def _state(m: Model, a: Operation, b: Operation
           ) -> tuple[Obligation, dict[int, int], str | None]:
    """The ``fusion.state`` obligation, the chained Memory states (B's init
    slot -> A's result slot) and, when refuted, why."""
    results = {r.name: i for i, r in enumerate(a.results)}
    chained: dict[int, int] = {}
    why: str | None = None
    for k, v in enumerate(b.operands):
        if v.name in results and isinstance(v.type, StateType):
            chained[k] = results[v.name]
    body_uses = _used_names(list(b.regions[0].ops))
    init_uses = {v.name for k, v in enumerate(b.operands) if k not in chained}
    bad = [n for n in results if n in body_uses or n in init_uses]
    ob = Obligation("fusion.state", "the second serial region uses no final value of the "
                    "first (its carried values are independent)", m.sites(a, b),
                    formula_text="results(A) ∩ uses(B) ⊆ initial Memory states of B")
    if bad:
        n = bad[0]
        user = body_uses.get(n)
        at = f" by {user.name} at {where(user)}" if user is not None else \
            f" as an initial value of the region at {where(b)}"
        why = (f"%{n}, the final value A carries out of its last iteration, is used{at}: "
               "every B(j) would depend on A's last iteration")
        ob.decider = _refuted_by(why)
    else:
        ob.decider = lambda o, t: o.set(PROVED, "structural")
    return ob, chained, why


def _refuted_by(why: str) -> Any:
    def decide(o: Obligation, timeout: float) -> None:
        o.set(REFUTED, "structural", why)
        o.details.append(why)
    return decide


def _order(m: Model, a: Operation, b: Operation) -> list[Obligation]:
    outer = m.instance(a)
    shared = set(outer.vars)
    av = [E.Var(v) for v in a.attrs["vars"]]
    bv = [E.Var(v + "'") for v in b.attrs["vars"]]
    reverse = a.attrs["order"] == "reverse"
    b_first = Fm.lex_lt(av, bv) if reverse else Fm.lex_lt(bv, av)
    out: list[Obligation] = []
    for ea in m.accesses_in(m.subtree(a)):
        for eb in m.accesses_in(m.subtree(b)):
            x, y = m.access(ea, "", shared), m.access(eb, "'", shared)
            if x.target != y.target or not (x.write or y.write):
                continue
            hyp = Fm.conj(outer.constraint, x.domain, y.domain, b_first)
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
                        f"fused, B({ib}) would run before A({ia})"]

            out.append(Obligation(
                "fusion.order", f"{kind} dependences on %{x.target[1]} from the first serial "
                "region to the second never go back in iteration order (i <= j)",
                m.sites(ea, eb),
                Fm.Claim(Fm.ordered_vars(hyp, concl), hyp, concl, m.assumptions),
                info=info, explain=explain, refutable=not inexact, inexact_note=inexact,
                witness={"a": x, "b": y, "program": m.p}))
    if not out:
        ob = Obligation("fusion.order", "the serial regions share no written object",
                        m.sites(a, b), formula_text="Dep_AB is empty")
        ob.decider = lambda o, t: o.set(PROVED, "structural")
        out.append(ob)
    return out


def _rewrite(p: TileProgram, a: Operation, b: Operation, sub: dict,
             chained: dict[int, int]) -> TileProgram:
    """``serial_i(A(i); B(i))`` carrying A's values, then B's unchained ones."""
    body_a, body_b = a.regions[0], b.regions[0]
    ya, yb = body_a.terminator, body_b.terminator
    assert ya is not None and yb is not None
    values: dict[str, Value] = {}
    for k, i in chained.items():  # B(i) starts from the state A(i) leaves
        values[body_b.args[k].name] = ya.operands[i]
    rb = RW.Rebuilder(sub, values=values)
    ops_b = [rb.op(o) for o in body_b.ops[:-1]]
    yb_vals = [rb.value(v) for v in yb.operands]
    keep = [k for k in range(len(b.operands)) if k not in chained]
    ya_vals = list(ya.operands)
    res_a = list(a.results)
    for k, i in chained.items():  # the next A(i+1) starts from the state B(i) leaves
        ya_vals[i] = yb_vals[k]
        res_a[i] = b.results[k]
    args = body_a.args + tuple(body_b.args[k] for k in keep)
    yld = Operation("yield", tuple(ya_vals) + tuple(yb_vals[k] for k in keep), (),
                    FrozenDict(), (), ya.loc, -1)
    merged = Block(args, body_a.ops[:-1] + tuple(ops_b) + (yld,))
    fused = a.replace(operands=a.operands + tuple(b.operands[k] for k in keep),
                      results=tuple(res_a) + tuple(b.results[k] for k in keep),
                      regions=(merged,))
    q = RW.replace_op(p, b.oid, lambda _o: [])
    q = RW.replace_ops(q, {a.oid: fused})
    return RW.finish(q)[0]


