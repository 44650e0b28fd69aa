"""Text-free facts about a SIMT-form loop-IR kernel, shared by every SIMT dialect.

The emitter core (:mod:`.emitter`) asks these functions what it may do --
which lanes of a thread form one wide access, which index expressions are
never negative or a multiple of a group's size, which divisors and shared
reads keep their value through a loop, which buffer elements may live in
registers across a loop, which global reads a cache policy applies to --
and spells the answers in its dialect. Nothing here produces source text:
every function is pure over :mod:`tilenest.lowering.loopir` nodes and
:mod:`tilenest.semantics.expr` expressions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ...lowering import loopir as L
from ...lowering.divisors import float_division
from ...semantics import expr as E

#: unary ops computed by a libm-style function (or the exp formula): a lane
#: group computing one is bound by its arithmetic, not by its accesses
TRANSCENDENTAL = ("exp", "exp2", "log", "log2", "log1p", "expm1", "sin", "cos", "tanh", "erf")


# -- divisibility and sign ------------------------------------------------------------

def divisor(e: E.Expr) -> int:
    """A number that divides the value of ``e`` for every value of its
    leaves (0: ``e`` is 0)."""
    if isinstance(e, E.Const):
        return abs(int(e.value))
    if isinstance(e, E.Add):
        return math.gcd(*(divisor(t) for t in e.terms))
    if isinstance(e, E.Mul):
        return math.prod(divisor(f) for f in e.factors)
    if isinstance(e, E.Mod) and isinstance(e.b, E.Const):
        return math.gcd(divisor(e.a), abs(int(e.b.value)))
    return 1


def divisible(e: E.Expr, m: int) -> list[tuple[E.Sym, int]] | None:
    """Conditions ``(S, d)``, "``S`` is a multiple of ``d``", under which ``e``
    is a multiple of ``m``: each term of the sum ``e`` is, statically
    (:func:`divisor`) or because a symbol factor of it is a multiple of what
    its other factors leave; None when a term has neither."""
    conds: list[tuple[E.Sym, int]] = []
    for t in (e.terms if isinstance(e, E.Add) else (e,)):
        d = divisor(t)
        if d % m == 0:
            continue
        fs = t.factors if isinstance(t, E.Mul) else (t,)
        syms = [f for f in fs if isinstance(f, E.Sym)]
        if not syms:
            return None
        rest = math.prod(divisor(f) for f in fs if f is not syms[0])
        conds.append((syms[0], m // math.gcd(m, rest)))
    return list(dict.fromkeys(conds))


def nonneg(e: E.Expr, extents: set[str] | frozenset[str], vars_: set[str] | frozenset[str]
           ) -> bool:
    """Whether ``e`` is never negative: constants, tensor extents and the
    variables of ``vars_`` are not, and neither are sums, products, floor
    quotients, minima of such, maxima with one, and remainders by a positive
    constant."""
    if isinstance(e, E.Const):
        return e.value >= 0
    if isinstance(e, E.Sym):
        return e.name in extents
    if isinstance(e, E.Var):
        return e.name in vars_
    if isinstance(e, E.Add):
        return all(nonneg(t, extents, vars_) for t in e.terms)
    if isinstance(e, E.Mul):
        return all(nonneg(f, extents, vars_) for f in e.factors)
    if isinstance(e, E.Mod):
        return (isinstance(e.b, E.Const) and e.b.value > 0) or (
            nonneg(e.a, extents, vars_) and nonneg(e.b, extents, vars_))
    if isinstance(e, E.FloorDiv):
        return nonneg(e.a, extents, vars_) and nonneg(e.b, extents, vars_)
    if isinstance(e, E.MinMax):
        f = all if e.op == "min" else any
        return f(nonneg(x, extents, vars_) for x in (e.a, e.b))
    return False


def nonneg_vars(defs: dict[str, list[tuple]], data: set[str], extents: set[str]) -> set[str]:
    """Index locals (``defs`` of :func:`loopir.index_definitions`, less the
    ``data`` ones) that are never negative: program ids, loop variables from
    a non-negative start, and variables every assignment of which is
    non-negative given the others (the least fixed point: a variable defined
    from itself is not included)."""
    out: set[str] = set()
    grew = True
    while grew:
        grew = False
        for v, ds in defs.items():
            if v not in out and v not in data and all(nonneg(d[1], extents, out) for d in ds):
                out.add(v)
                grew = True
    return out


@dataclass(frozen=True)
class IndexFacts:
    """What is known of a kernel's index values: ``index_locals`` hold only
    index values (loop variables, index assignments), ``extents`` are the
    symbols that are tensor extents, ``nonneg_vars`` the index locals never
    negative (:func:`nonneg_vars`)."""

    index_locals: frozenset[str]
    extents: frozenset[str]
    nonneg_vars: frozenset[str]

    @staticmethod
    def of(k: L.Kernel) -> "IndexFacts":
        """The facts of kernel ``k``."""
        defs, data = L.index_definitions(k)
        extents = {x.name for p in k.params for x in p.shape if isinstance(x, E.Sym)}
        return IndexFacts(frozenset(set(defs) - data), frozenset(extents),
                          frozenset(nonneg_vars(defs, data, extents)))

    def nonneg(self, e: E.Expr) -> bool:
        """Whether ``e`` is never negative (:func:`nonneg`)."""
        return nonneg(e, self.extents, self.nonneg_vars)


# -- conjunctions of tests --------------------------------------------------------------

def implies(q: E.Pred, p: E.Pred) -> bool:
    """Whether ``q`` implies ``p`` because both bound one expression from
    above by the same ``b``: ``p`` is ``a < b`` (``a <= b``) and ``q`` is
    ``a + c < b`` (``a + c <= b``, or ``<`` against ``<=``) for a constant
    ``c``; ``c > 0``, or ``c = 0`` with ``q`` the strict one (so two equal
    conjuncts never remove each other)."""
    if not (isinstance(q, E.Cmp) and isinstance(p, E.Cmp) and q.b == p.b
            and q.op in ("<", "<=") and p.op in ("<", "<=")):
        return False
    d = E.add(q.a, E.mul(-1, p.a))
    if not isinstance(d, E.Const):
        return False
    c = int(d.value)
    # q: a + c < b gives a < b - c; p needs a < b (or a <= b)
    return c > 0 or (c == 0 and q.op == "<" and p.op == "<=")


def needed(conds: Iterable[E.Pred], facts: IndexFacts) -> list[E.Pred]:
    """The conjuncts of ``conds`` a run-time test must check: each once,
    not ``e >= 0`` (or ``0 <= e``) for an ``e`` never negative
    (:meth:`IndexFacts.nonneg`), and not ``a < b`` where another conjunct is
    ``a + c < b`` (or ``<=``) with a constant ``c >= 0``, which implies it (a
    group's first and last element against one bound)."""
    out: list[E.Pred] = []
    for c in conds:
        for p in (c.items if isinstance(c, E.PAnd) else (c,)):
            trivial = isinstance(p, E.Cmp) and (
                (p.op == ">=" and p.b == E.Const(0) and facts.nonneg(p.a))
                or (p.op == "<=" and p.a == E.Const(0) and facts.nonneg(p.b)))
            if not trivial and p not in out:
                out.append(p)
    return [p for p in out if not any(q is not p and implies(q, p) for q in out)]


# -- lane groups ---------------------------------------------------------------------------

@dataclass(frozen=True)
class LanePlan:
    """The widenable accesses of one lane loop (:func:`lane_plan`): ``loop``
    the ``for.vector v in [0, V)``, its lanes in bounds while ``first + v <
    n`` (``bounded``; otherwise every lane runs); ``stmts`` the guarded body;
    ``loads``/``stores`` map each widened access to its index at ``v = 0``;
    ``conds`` the tests that make the widened guarded loads' and stores'
    guards true for every lane."""

    loop: Any
    V: int
    first: E.Expr
    n: E.Expr
    stmts: tuple
    loads: dict
    stores: dict
    conds: tuple = ()
    bounded: bool = True

    def accesses(self) -> list[tuple[Any, E.Expr]]:
        """Every widened access with its index at ``v = 0``, loads first."""
        return [*self.loads.items(), *self.stores.items()]

    def group_bytes(self, node: Any) -> int:
        """The alignment one ``V``-wide access of ``node`` needs (at most 16)."""
        return min(16, max(1, node.buf.dtype.itemsize) * self.V)


def contiguous(b: L.Buffer, V: int) -> bool:
    """Whether ``V`` logically consecutive elements of ``b`` starting at a
    multiple of ``V`` are physically consecutive: always without a layout;
    under ``Swizzle128`` when they fit one 16-byte chunk."""
    return b.layout is None or V * max(1, b.dtype.itemsize) <= 16


#: lane loops every lane runs (a register tile's column pairs) are widened too
WIDEN_UNBOUNDED = True


def lane_plan(s: L.For, bounds_only: bool = False) -> LanePlan | None:
    """The vector accesses of a thread's ``V`` consecutive elements, or None.

    ``s`` must be ``for.vector v in [0, V): if l < n: body`` with ``l = l0 +
    v`` (as ``lowering/simt.py`` distributes), or ``for.vector v in [0, V):
    body`` with every lane running (a thread's cells of a register tile,
    ``simt._Phase.distribute_cells``: the lane is a column). Every unguarded
    load or store of the top-level body whose index is ``e0 + v`` in a
    global or shared buffer can become one ``V``-wide access when the whole
    group is in bounds (``l0 + V <= n``) and each address is aligned to the
    group's size; a guarded load or store too when its guard is an interval
    over the lanes (true at the first and the last lane:
    :attr:`LanePlan.conds`). Buffers the body both loads and stores keep
    scalar accesses (the lanes' order matters for them), except one updated
    in place (:func:`in_place`). None when the loop has another shape or
    nothing to widen, unless ``bounds_only`` (and bounded): then a plan with
    nothing widened, whose full group runs its lanes without the bounds
    test."""
    if not (isinstance(s.lo, E.Const) and s.lo.value == 0 and isinstance(s.hi, E.Const)
            and s.hi.value in (2, 4, 8) and s.body):
        return None
    V = int(s.hi.value)
    v = E.Var(s.var.name)
    bounded = (len(s.body) == 1 and isinstance(s.body[0], L.If) and not s.body[0].orelse
               and isinstance(s.body[0].cond, L.IPred))
    if bounded:
        cond = s.body[0].cond.p
        stmts = s.body[0].then
    else:  # every lane runs: a bound no lane reaches
        if not WIDEN_UNBOUNDED:
            return None
        cond = E.cmp("<", v, V)
        stmts = s.body
        if any(isinstance(st, (L.If, L.For, L.While)) for st in stmts):
            return None
    if not (isinstance(cond, E.Cmp) and cond.op == "<"):
        return None
    sub: dict = {}
    for st in stmts:
        if isinstance(st, L.Assign) and isinstance(st.value, L.IExpr):
            sub[E.Var(st.var.name)] = E.subst(st.value.e, sub)

    def at(e: E.Expr, k: int) -> E.Expr:
        return E.subst(E.subst(e, sub), {v: k})

    def unit(e: E.Expr) -> bool:
        e0 = at(e, 0)
        return all(E.add(at(e, k), E.mul(-1, e0)) == E.Const(k) for k in range(1, V))

    if not unit(cond.a):
        return None

    def affine(e: E.Expr) -> bool:
        d = E.add(at(e, 1), E.mul(-1, at(e, 0)))
        return isinstance(d, E.Const) and all(
            E.add(at(e, k), E.mul(-1, at(e, 0))) == E.Const(k * d.value) for k in range(2, V))

    def convex(g: Any) -> list[E.Pred] | None:
        """A load guard whose truth over the lanes is an interval (a
        conjunction of comparisons of affine sides): true for the whole
        group when true at its first and last lane -- those two tests."""
        if not isinstance(g, L.IPred):
            return None
        items = g.p.items if isinstance(g.p, E.PAnd) else (g.p,)
        if not all(isinstance(c, E.Cmp) and affine(c.a) and affine(c.b) for c in items):
            return None
        return [E.subst(E.subst(g.p, sub), {v: 0}), E.subst(E.subst(g.p, sub), {v: V - 1})]

    def apart(name: str) -> bool:
        """Whether every element of buffer ``name`` a lane reads lies at
        least ``V`` elements from every element a lane writes, whatever the
        symbols are (each access ``e0 + v``; ``E.least_magnitude`` of the
        differences of the ``e0``), so no lane reads what another writes,
        in either order: the two versions of a running tile, one read and
        the other written (``lowering/phases._fold_runs``)."""
        got = [y.index for y in L.evaluated(stmts) if isinstance(y, L.Load) and y.buf.name == name]
        put = [st.index for st in L.walk(stmts) if isinstance(st, L.Store) and st.buf.name == name]
        if not all(isinstance(x, L.IExpr) and unit(x.e) for x in got + put):
            return False
        for r in got:
            for w in put:
                m = E.least_magnitude(E.add(at(r.e, 0), E.mul(-1, at(w.e, 0))))
                if m is None or m < V:
                    return False
        return True

    touched_w = {st.buf.name for st in L.walk(stmts) if isinstance(st, L.Store)}
    # a buffer read only at the element its one top-level store writes
    # (updated in place): each lane reads and then writes its own
    # element, so all of a group's loads may precede all its stores; and
    # one whose reads and writes lie apart (two versions of a tile)
    inplace = {n for n in touched_w if in_place(stmts, n) or apart(n)}
    loads: dict = {}
    conds: list[E.Pred] = []
    for st in stmts:  # top level only: these run for every lane of a full group
        for x in L.stmt_exprs(st):
            for y in L.subexprs(x):
                if not (isinstance(y, L.Load) and isinstance(y.index, L.IExpr)
                        and y.buf.space in ("global", "shared")
                        and (y.buf.name not in touched_w or y.buf.name in inplace)
                        and unit(y.index.e)
                        and contiguous(y.buf, V)):
                    continue
                ends = [] if y.guard is None else convex(y.guard)
                if ends is not None and y not in loads:
                    loads[y] = at(y.index.e, 0)
                    conds += [c for c in ends if c not in conds]
    read = {y.buf.name for y in L.evaluated(stmts) if isinstance(y, L.Load)}
    stores: dict = {}
    for st in stmts:
        if (isinstance(st, L.Store) and isinstance(st.index, L.IExpr)
                and st.buf.space in ("global", "shared")
                and (st.buf.name not in read or st.buf.name in inplace)
                and unit(st.index.e) and contiguous(st.buf, V)
                and sum(isinstance(o, L.Store) and o.buf.name == st.buf.name
                        for o in L.walk(stmts)) == 1):
            ends = [] if st.guard is None else convex(st.guard)
            if ends is not None:
                stores[st] = at(st.index.e, 0)
                conds += [c for c in ends if c not in conds]
    if not loads and not stores and not (bounds_only and bounded):
        return None
    return LanePlan(s, V, at(cond.a, 0), cond.b, stmts, loads, stores, tuple(conds), bounded)


def in_place(stmts: tuple, name: str) -> bool:
    """Whether buffer ``name`` is stored by exactly one statement, at the top
    level of ``stmts``, and read only by that store's value, at its element
    (no guard): each lane reads its element before it writes it, and nothing
    reads it after."""
    sts = [s for s in L.walk(stmts) if isinstance(s, L.Store) and s.buf.name == name]
    if len(sts) != 1 or sts[0] not in stmts or sts[0].guard is not None:
        return False
    st = sts[0]
    mine = [y for y in L.subexprs(st.value) if isinstance(y, L.Load) and y.buf.name == name]
    every = [y for y in L.evaluated(stmts) if isinstance(y, L.Load) and y.buf.name == name]
    return len(mine) == len(every) and all(y.index == st.index and y.guard is None
                                           for y in mine)


def indexes_local(s: L.For) -> bool:
    """Whether ``s``'s body indexes a thread's register array (a ``local``
    buffer) by ``s``'s variable: the loop must then be unrolled whole, so that
    every index is a constant and the array stays in registers."""
    x = E.Var(s.var.name)
    nodes = [y for y in L.evaluated(s.body) if isinstance(y, L.Load)]
    nodes += [st for st in L.walk(s.body) if isinstance(st, L.Store)]
    return any(y.buf.space == "local" and isinstance(y.index, L.IExpr)
               and x in E.leaves(y.index.e) for y in nodes)


def transcendental(plan: LanePlan) -> bool:
    """Whether a lane group computes a transcendental (:data:`TRANSCENDENTAL`):
    bound by its arithmetic, not its accesses."""
    return any(isinstance(y, L.Un) and y.op in TRANSCENDENTAL
               for y in L.evaluated(plan.stmts, nested=False))


def unrolled(s: L.For, in_thread: bool) -> bool:
    """Whether loop ``s`` is emitted fully unrolled: a constant trip count of
    at most 8 -- a ``vector`` loop, or a thread's own step loop (``in_thread``:
    its iterations then see constant offsets, and what does not depend on
    them moves out of enclosing loops) -- or of at most 64 for a ``vector``
    loop indexing a thread's register array (``local``) by its variable,
    which must stay constant for the array to stay in registers."""
    if not (isinstance(s.lo, E.Const) and isinstance(s.hi, E.Const)):
        return False
    n = s.hi.value - s.lo.value
    if n <= 8 and (s.kind == "vector" or (in_thread and s.kind == "serial")):
        return True
    if s.kind != "vector" or n > 64:
        return False
    return indexes_local(s)


def strip_stride(s: L.For, plan: LanePlan) -> int | None:
    """The constant stride ``c > 0`` of the first lane ``l0 = c r + a0`` of a
    thread's serial loop ``r`` over groups (body: the lane loop of ``plan``),
    when every widened index moves by a multiple of its group's size per
    step (so an access aligned at the first step is aligned at every step);
    else None."""
    r = E.Var(s.var.name)

    def stride(e: E.Expr) -> E.Expr:
        return E.add(E.subst(e, {r: 1}), E.mul(-1, E.subst(e, {r: 0})))

    c = stride(plan.first)
    if not (isinstance(c, E.Const) and c.value > 0
            and E.add(E.subst(plan.first, {r: 2}), E.mul(-2, c)) == E.subst(plan.first, {r: 0})):
        return None
    for node, e0 in plan.accesses():
        k = stride(e0)
        if not (isinstance(k, E.Const) and (k.value * node.buf.dtype.itemsize)
                % plan.group_bytes(node) == 0):
            return None
    return int(c.value)


# -- values that keep through a loop ----------------------------------------------------------

def has_common_case(x: Any, shared: "set | frozenset") -> bool:
    """Whether expression node ``x`` is computed by a function with a cheap
    common case and a whole fallback: ``exp`` in float arithmetic, a float
    division by a divisor of ``shared``
    (:func:`tilenest.lowering.divisors.shared_divisors`)."""
    if isinstance(x, L.Un):
        return x.op == "exp" and x.a.dtype.is_float and x.a.dtype.name != "f64"
    return float_division(x) and x.b in shared


def carried_locals(body: tuple) -> list[L.LVar] | None:
    """The locals a straight-line body of assignments, run repeatedly, reads
    before it assigns them (in an earlier run: an accumulator), in order of
    first assignment; None when the body has another statement. Stores to a
    thread's register array (``local``) count as assignments when the body
    reads no register array it stores to (a second run then writes the same
    elements again, from the same inputs)."""
    stored = {st.buf.name for st in body if isinstance(st, L.Store)}
    if not all(isinstance(st, L.Assign) or (isinstance(st, L.Store) and st.buf.space == "local"
                                            and st.guard is None and not st.mode)
               for st in body):
        return None
    if any(isinstance(y, L.Load) and y.buf.name in stored for y in L.evaluated(body)):
        return None
    out: dict[str, L.LVar] = {}
    seen: set[str] = set()
    for st in body:
        seen |= {y.var.name for x in L.stmt_exprs(st) for y in L.subexprs(x)
                 if isinstance(y, L.Ref)}
        if isinstance(st, L.Assign) and st.var.name in seen:
            out.setdefault(st.var.name, st.var)
    return list(out.values())


def invariant_shared_reads(s: L.For, held: Iterable[tuple[str, E.Expr]] = ()
                           ) -> dict[tuple[str, E.Expr], L.Load]:
    """The shared reads a thread's serial loop ``s`` may read once before it
    runs: ``(buffer name, index) -> a load`` for every unguarded read of a
    plain (unswizzled, non-bool) ``shared`` buffer the loop never stores to,
    at an index independent of the loop and of everything the body assigns,
    not already ``held`` in a register. Empty when the body does anything but
    compute, assign, store synchronously and branch (a barrier, collective or
    asynchronous copy would let another thread change the element). The body
    holds no barrier, so no other thread writes that element while the loop
    runs (the barrier-sufficiency obligation); the buffer is live through the
    loop, so nothing the loop stores shares its storage."""
    plain = (L.For, L.If, L.Assign, L.Store, L.Check, L.Comment)
    if any(not isinstance(t, plain) or (isinstance(t, L.Store) and t.mode)
           for t in L.walk(s.body)):
        return {}
    varying = {s.var.name} | set(L.assigned(s.body))
    stored = {t.buf.name for t in L.walk(s.body) if isinstance(t, L.Store)}
    have = set(held)
    found: dict = {}
    for y in L.evaluated(s.body):
        if (isinstance(y, L.Load) and y.buf.space == "shared" and y.guard is None
                and y.buf.layout is None
                and isinstance(y.index, L.IExpr) and not y.buf.dtype.is_bool
                and y.buf.name not in stored and not (L.names(y.index) & varying)
                and (y.buf.name, y.index.e) not in have):
            found.setdefault((y.buf.name, y.index.e), y)
    return found


def promotable(s: L.For) -> dict[str, tuple[L.Buffer, list[E.Expr]]]:
    """Scalar replacement candidates of a loop whose body is straight-line
    assignments and stores: buffer name -> (the buffer, the distinct indices
    it is accessed at) for every buffer the body stores whose every access is
    unguarded, non-bool, at an index independent of the loop and of
    everything the body assigns, the indices pairwise a nonzero constant
    apart (so distinct elements). Those elements may live in registers
    through the loop (loaded before it, stored after it) when no other thread
    touches them until the next barrier. Empty for any other body."""
    if not all(isinstance(t, (L.Store, L.Assign)) for t in s.body):
        return {}
    varying = {s.var.name} | set(L.assigned(s.body))
    acc: dict[str, list] = {}
    blocked: set[str] = set()
    for t in s.body:
        nodes = [y for y in L.evaluated((t,), nested=False) if isinstance(y, L.Load)]
        if isinstance(t, L.Store):
            nodes.append(t)
        for y in nodes:
            ok = (y.guard is None and isinstance(y.index, L.IExpr)
                  and not y.buf.dtype.is_bool
                  and not (L.names(y.index) & varying))
            if ok:
                acc.setdefault(y.buf.name, []).append(y)
            else:
                blocked.add(y.buf.name)
    chosen: dict = {}
    for name, ys in acc.items():
        if name in blocked or not any(isinstance(y, L.Store) for y in ys):
            continue
        idx = list(dict.fromkeys(y.index.e for y in ys))
        if all(isinstance(d := E.add(a, E.mul(-1, b)), E.Const) and d.value != 0
               for i, a in enumerate(idx) for b in idx[i + 1:]):
            chosen[name] = (ys[0].buf, idx)
    return chosen


def resident_mma(s: L.For) -> tuple[L.For, L.WarpMma] | None:
    """A program-level serial loop whose only access to a ``WarpMma``'s
    accumulator is that ``WarpMma``, standing in a thread loop of the loop's
    body in the shape the SIMT form gives one warp tile per warp
    (``for.thread t: for r in [0, 1): if c: index assigns; WarpMma``) with
    nothing in that path depending on the loop: ``(thread loop, WarpMma)``,
    else None. Each lane then owns the same accumulator elements in every
    iteration and no other statement of the loop touches them, so they may
    stay in the lane's registers for the whole loop."""
    if s.kind not in ("serial", "vector"):
        return None
    found = [(t, w) for t in s.body if isinstance(t, L.For) and t.kind == "thread"
             for w in L.walk(t.body) if isinstance(w, L.WarpMma)]
    mmas = [w for w in L.walk(s.body) if isinstance(w, L.WarpMma)]
    if len(found) != 1 or len(mmas) != 1 or found[0][1].lane is None or \
            found[0][1].c.lane_cols or found[0][1].group > 1:
        return None
    t, w = found[0]
    if not (len(t.body) == 1 and isinstance(t.body[0], L.For) and t.body[0].hi == E.Const(1)
            and t.body[0].lo == E.Const(0) and len(t.body[0].body) == 1
            and isinstance(t.body[0].body[0], L.If) and not t.body[0].body[0].orelse):
        return None
    r, br = t.body[0], t.body[0].body[0]
    if br.then[-1] is not w or not all(isinstance(x, L.Assign) for x in br.then[:-1]):
        return None
    local = {t.var.name, r.var.name} | {x.var.name for x in br.then[:-1]}
    # the accumulator's cells must not move (the operands' offsets may)
    reads = L.names(br.cond) | {n for x in br.then[:-1] for n in L.names(x.value)}
    reads |= L.names(L.IExpr(w.c.offset)) | L.names(L.IExpr(w.lane))
    if (reads - local) & (set(L.assigned(s.body)) | {s.var.name}):
        return None
    c = w.c.buf.name
    if c in (w.a.buf.name, w.b.buf.name):
        return None
    for st in L.walk(s.body):
        touched = [y.buf.name for y in L.evaluated((st,), nested=False)
                   if isinstance(y, L.Load)]
        if isinstance(st, L.Store):
            touched.append(st.buf.name)
        if c in touched:
            return None
    return t, w


def cache_hints(k: L.Kernel) -> dict[int, tuple[Any, str]]:
    """The cache policy of the global loads of ``k`` (``Schedule.cache_hints``):
    ``id`` of a :class:`~tilenest.lowering.loopir.Load` node -> (the node,
    ``"keep"`` or ``"last"``).

    A tensor read at more than one site of the program, in program order
    (phases in order, statements in pre-order): every site but the last
    keeps its lines in the cache for a site that reads them again
    (``"keep"``), the last site streams (``"last"``: no later use); a tensor
    read at one site keeps the default (absent). A hint changes which lines
    the cache evicts first, never a value, so a site order that is not the
    execution order (loops around several sites) costs at most speed."""
    sites: dict[str, list] = {}
    for ph in k.phases:
        for x in L.evaluated(ph.body):
            if isinstance(x, L.Load) and x.buf.space == "global":
                group = sites.setdefault(x.buf.name, [])
                if all(y is not x for y in group):
                    group.append(x)
    out: dict[int, tuple[Any, str]] = {}
    for group in sites.values():
        if len(group) > 1:
            for x in group[:-1]:
                out[id(x)] = (x, "keep")
            out[id(group[-1])] = (group[-1], "last")
    return out
