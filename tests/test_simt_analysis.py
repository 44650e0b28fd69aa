"""The SIMT emitters' text-free analysis (``backends/simt/analysis.py``), on
small hand-built loop-IR kernels and on lowered workloads."""

from __future__ import annotations

from dataclasses import replace

import tilenest as tn
from tilenest.backends.simt import analysis as A
from tilenest.lowering import default_schedule, fragments, lower_verified
from tilenest.lowering import loopir as L
from tilenest.lowering.divisors import float_division, shared_divisors
from tilenest.semantics import dtypes as D
from tilenest.semantics import expr as E
from tilenest.workloads import WORKLOADS

f32 = D.f32
N = E.Sym("N")
v, r, t = E.Var("v"), E.Var("r"), E.Var("t")


def _var(name: str) -> L.LVar:
    return L.LVar(name, D.i64)


def _lanes(body_of, V: int = 4, first: E.Expr = E.mul(4, r), bound: E.Expr = N) -> L.For:  # type: ignore[no-untyped-def]
    """``for.vector v in [0, V): if l < bound: body(l)`` with ``l = first + v``."""
    lv = _var("l")
    body = (L.Assign(lv, L.IExpr(E.add(first, v))), *body_of(E.Var("l")))
    cond = L.IPred(E.cmp("<", E.Var("l"), bound))
    return L.For(_var("v"), E.Const(0), E.Const(V), (L.If(cond, body),), "vector")


X = L.Buffer("x", f32, "global", N, arg=0)
Y = L.Buffer("y", f32, "global", N, arg=1)
S = L.Buffer("%s", f32, "shared", E.Const(64))
R = L.Buffer("%r", f32, "local", E.Const(8))


def test_divisor_and_divisible():
    """A constant divisor of every term; where a term lacks one, the symbol
    whose multiple makes it one."""
    assert A.divisor(E.add(E.mul(8, r), 4)) == 4
    assert A.divisor(E.mod(E.mul(6, r), 4)) == 2
    assert A.divisor(E.Const(0)) == 0
    assert A.divisible(E.add(E.mul(8, r), 16), 4) == []
    assert A.divisible(E.add(E.mul(N, r), 8), 4) == [(N, 4)]
    assert A.divisible(E.add(r, 8), 4) is None  # a variable term: no static answer


def test_nonneg_facts_of_a_kernel():
    """Extents and loop variables from 0 are never negative; a local assigned
    ``i - 1`` may be, and so is a symbol that is no tensor extent."""
    i, j = _var("i"), _var("j")
    body = (L.For(i, E.Const(0), N, (L.Assign(j, L.IExpr(E.add(E.Var("i"), -1))),
                                     L.Store(X, L.IExpr(E.Var("i")), L.Const(1.0, f32)))),)
    ph = L.Phase("p", (), _var("pid"), body)
    k = L.Kernel("k", (L.Param("x", "tensor", f32, (N,)),), ("N", "M"), (), (ph,))
    facts = A.IndexFacts.of(k)
    assert {"i", "j"} <= facts.index_locals
    assert facts.nonneg(E.add(E.Var("i"), N)) and not facts.nonneg(E.Var("j"))
    assert not facts.nonneg(E.Sym("M"))
    assert facts.nonneg(E.mod(E.Var("j"), 8)) and not facts.nonneg(E.mod(E.Var("j"), N))
    assert facts.nonneg(E.MinMax("max", E.Var("j"), E.Var("i")))


def test_needed_drops_implied_and_trivial_conjuncts():
    """``a + 3 < N`` implies ``a < N``; ``i >= 0`` holds for a loop variable;
    equal conjuncts are kept once."""
    facts = A.IndexFacts(frozenset({"i"}), frozenset({"N"}), frozenset({"i"}))
    a = E.Var("i")
    got = A.needed([E.cmp("<", a, N), E.cmp("<", E.add(a, 3), N), E.cmp(">=", a, 0),
                    E.cmp("<", E.add(a, 3), N)], facts)
    assert got == [E.cmp("<", E.add(a, 3), N)]
    assert A.implies(E.cmp("<", E.add(a, 1), N), E.cmp("<=", a, N))
    assert not A.implies(E.cmp("<", a, N), E.cmp("<", a, N))


def test_lane_plan_widens_unit_stride_accesses():
    """``y[l] = x[l] * 2``: one wide load of ``x`` and one wide store of ``y``
    at the group's first lane; in bounds while ``4 r + v < N``."""
    s = _lanes(lambda l: [L.Store(Y, L.IExpr(l), L.Bin("mul", L.Load(X, L.IExpr(l)),
                                                          L.Const(2.0, f32), f32))])
    plan = A.lane_plan(s)
    assert plan is not None and plan.V == 4
    assert plan.first == E.mul(4, r) and plan.n == N
    assert list(plan.loads.values()) == [E.mul(4, r)]
    assert list(plan.stores.values()) == [E.mul(4, r)]
    assert plan.group_bytes(next(iter(plan.loads))) == 16 and plan.conds == ()
    assert A.strip_stride(L.For(_var("r"), E.Const(0), N, (s,)), plan) == 4


def test_lane_plan_refuses_what_it_cannot_widen():
    """A strided index, a buffer both read and written at other elements, and
    a loop of another shape have no plan; a register row gets one with
    nothing widened only when asked for bounds alone."""
    strided = _lanes(lambda l: [L.Store(Y, L.IExpr(E.mul(2, l)), L.Load(X, L.IExpr(l)))])
    plan = A.lane_plan(strided)
    assert plan is not None and not plan.stores  # the load still widens
    both = _lanes(lambda l: [L.Store(X, L.IExpr(l), L.Load(X, L.IExpr(E.add(l, 1))))])
    assert A.lane_plan(both) is None
    assert A.lane_plan(replace(strided, hi=E.Const(3))) is None
    regs = _lanes(lambda l: [L.Store(R, L.IExpr(v), L.Const(0.0, f32))])
    assert A.lane_plan(regs) is None
    got = A.lane_plan(regs, bounds_only=True)
    assert got is not None and not got.loads and not got.stores
    assert A.indexes_local(regs) and not A.indexes_local(strided)


def test_lane_plan_updates_in_place_and_guarded_loads():
    """``x[l] = -x[l]`` is widened both ways (each lane reads its own element
    first); a load guarded by an interval over the lanes is widened under
    its first and last lane's tests."""
    upd = _lanes(lambda l: [L.Store(X, L.IExpr(l), L.Un("neg", L.Load(X, L.IExpr(l)), f32))])
    plan = A.lane_plan(upd)
    assert plan is not None and plan.loads and plan.stores
    assert A.in_place(plan.stmts, "x")
    g = L.IPred(E.cmp("<", E.Var("l"), E.Sym("M")))
    guarded = _lanes(lambda l: [L.Store(Y, L.IExpr(l), L.Load(X, L.IExpr(l), g,
                                                                L.Const(0.0, f32)))])
    plan = A.lane_plan(guarded)
    assert plan is not None
    assert plan.conds == (E.cmp("<", E.mul(4, r), E.Sym("M")),
                          E.cmp("<", E.add(E.mul(4, r), 3), E.Sym("M")))


def test_lane_plan_widens_two_versions_of_a_tile():
    """A tile kept in two versions of one buffer, one read and the other
    written (``(K - c) mod 2`` and its complement): the reads and writes lie
    a version (16 elements) apart whatever ``K`` and ``c`` are, so both
    widen. Versions only 2 elements apart, or a parity that is not one
    remainder, could overlap a group of 4 and stay scalar."""
    two = L.Buffer("%two", f32, "shared", E.Const(32))
    par = E.mod(E.add(E.Sym("K"), E.mul(-1, E.Var("c"))), 2)

    def flip(size: int, dst: E.Expr) -> L.For:
        return _lanes(lambda l: [L.Store(two, L.IExpr(E.add(E.mul(size, dst), l)), L.Bin(
            "add", L.Load(two, L.IExpr(E.add(E.mul(size, par), l))), L.Const(1.0, f32),
            f32))])

    plan = A.lane_plan(flip(16, E.add(1, E.mul(-1, par))))
    assert plan is not None and len(plan.loads) == 1 and len(plan.stores) == 1
    assert A.lane_plan(flip(2, E.add(1, E.mul(-1, par)))) is None
    # the same complement written as a second remainder: the two are taken
    # as independent (both 0 possible), so it is not shown apart
    other = E.mod(E.add(E.add(E.Sym("K"), E.mul(-1, E.Var("c"))), -1), 2)
    assert A.lane_plan(flip(16, other)) is None


def test_least_magnitude_over_remainders():
    x = E.mod(E.Var("c"), 2)
    assert E.least_magnitude(E.add(16, E.mul(-32, x))) == 16
    assert E.least_magnitude(E.add(E.mul(3, E.mod(E.Var("c"), 4)), -4)) == 1
    assert E.least_magnitude(E.Const(-5)) == 5
    assert E.least_magnitude(E.add(16, E.Var("c"))) is None
    assert E.least_magnitude(E.mod(E.Var("c"), E.Sym("N"))) is None
    assert E.least_magnitude(E.add(E.mod(E.Var("a"), 8), E.mod(E.Var("b"), 16)),
                             most=64) is None


def test_contiguous_under_swizzle():
    """Under the 128-byte swizzle only groups within a 16-byte chunk stay
    consecutive."""
    sw = replace(S, dtype=D.bf16, layout=L.Swizzle128(64, 64, 2))
    assert A.contiguous(S, 8) and A.contiguous(sw, 8) and not A.contiguous(sw, 16)


def test_shared_divisors_and_common_cases():
    """A divisor read before the loop keeps its value in it; one the loop
    reassigns does not."""
    d, q, i = L.LVar("d", f32), L.LVar("q", f32), _var("i")
    div = L.Bin("div", L.Load(X, L.IExpr(E.Var("i"))), L.Ref(d), f32)
    keep = L.For(i, E.Const(0), N, (L.Store(Y, L.IExpr(E.Var("i")), div),))
    moves = L.For(i, E.Const(0), N, (L.Assign(d, L.Const(3.0, f32)), L.Assign(q, div)))
    params = (L.Param("x", "tensor", f32, (N,)), L.Param("y", "tensor", f32, (N,)))

    def kernel(loop: L.For) -> L.Kernel:
        ph = L.Phase("p", (), _var("pid"), (L.Assign(d, L.Const(2.0, f32)), loop))
        return L.Kernel("k", params, ("N",), (), (ph,))

    assert shared_divisors(kernel(keep)) == frozenset({L.Ref(d)})
    assert shared_divisors(kernel(moves)) == frozenset()
    assert float_division(div) and A.has_common_case(div, {L.Ref(d)})
    assert not A.has_common_case(div, set())
    assert A.has_common_case(L.Un("exp", L.Ref(d), f32), set())


def test_carried_locals_and_unrolling():
    """An accumulator is read before it is assigned; a body with a global
    store has no such list. Small constant loops unroll."""
    acc, x = L.LVar("acc", f32), L.LVar("x", f32)
    body = (L.Assign(x, L.Const(1.0, f32)),
            L.Assign(acc, L.Bin("add", L.Ref(acc), L.Ref(x), f32)))
    assert A.carried_locals(body) == [acc]
    assert A.carried_locals((L.Store(Y, L.IExpr(E.Const(0)), L.Ref(x)),)) is None
    small = L.For(_var("i"), E.Const(0), E.Const(4), body)
    assert A.unrolled(small, in_thread=True) and not A.unrolled(small, in_thread=False)
    assert not A.unrolled(replace(small, hi=N), in_thread=True)


def test_invariant_shared_reads_and_promotion():
    """In ``for i: y[i] += s[3]`` the read of ``s[3]`` keeps its value and
    ``y[0]``-style fixed elements may live in registers; a barrier in the
    body forbids the first."""
    i = _var("i")
    body = (L.Store(Y, L.IExpr(E.Var("i")), L.Bin("add", L.Load(Y, L.IExpr(E.Var("i"))),
                                                  L.Load(S, L.IExpr(E.Const(3))), f32)),)
    loop = L.For(i, E.Const(0), N, body)
    assert list(A.invariant_shared_reads(loop)) == [("%s", E.Const(3))]
    assert A.invariant_shared_reads(loop, [("%s", E.Const(3))]) == {}
    barred = replace(loop, body=(*body, L.Barrier("block")))
    assert A.invariant_shared_reads(barred) == {}
    assert A.promotable(loop) == {}  # y's index moves with the loop
    fixed = L.For(i, E.Const(0), N, (
        L.Store(Y, L.IExpr(E.Const(0)), L.Bin("add", L.Load(Y, L.IExpr(E.Const(0))),
                                              L.Load(X, L.IExpr(E.Var("i"))), f32)),
        L.Store(Y, L.IExpr(E.Const(1)), L.Load(Y, L.IExpr(E.Const(0))))))
    got = A.promotable(fixed)
    assert list(got) == ["y"] and got["y"][1] == [E.Const(0), E.Const(1)]


def test_cache_hints_follow_program_order():
    """A tensor read at two sites keeps its lines at the first and streams
    at the last; a tensor read once has no policy."""
    i = _var("i")
    a = L.Load(X, L.IExpr(E.Var("i")))
    b = L.Load(X, L.IExpr(E.add(E.Var("i"), 1)))
    c = L.Load(Y, L.IExpr(E.Var("i")))
    body = (L.For(i, E.Const(0), N, (L.Assign(L.LVar("u", f32), a),
                                     L.Assign(L.LVar("w", f32), L.Bin("add", b, c, f32)))),)
    ph = L.Phase("p", (), _var("pid"), body)
    k = L.Kernel("k", (L.Param("x", "tensor", f32, (N,)), L.Param("y", "tensor", f32, (N,))),
                 ("N",), (), (ph,))
    got = {x: p for x, p in A.cache_hints(k).values()}
    assert got == {a: "keep", b: "last"}


def test_resident_mma_on_a_lowered_gemm(monkeypatch):
    """With the accumulator in a shared tile (no register fragments), the
    tensor-core GEMM's k loop may keep the lanes' cells resident; with lane
    fragments, or a SIMT GEMM, no loop qualifies."""
    kern = WORKLOADS["gemm"].kernel(tn.bf16, {"bm": 64, "bn": 16, "bk": 32, "loop": "pipeline"})

    def loops(unit: str) -> list:
        k = lower_verified(kern.program, default_schedule(kern.program, "cuda", mma_unit=unit))
        return [A.resident_mma(s) for ph in k.phases for s in L.walk(ph.body)
                if isinstance(s, L.For) and s.kind == "serial"]

    assert all(p is None for p in loops("tensor") + loops("simt"))
    monkeypatch.setattr(fragments, "MAX_CELLS", 0)
    found = [p for p in loops("tensor") if p is not None]
    assert len(found) == 1 and found[0][1].lane is not None and not found[0][1].c.lane_cols


def test_lane_plans_of_a_lowered_row_kernel():
    """Every lane loop of the lowered softmax, its rows in memory, gets a
    plan (its rows are contiguous) whose widened accesses are unit-stride
    groups."""
    kern = WORKLOADS["softmax"].kernel(tn.f32, {"rp": 1})
    k = lower_verified(kern.program, default_schedule(kern.program, "cuda", row_registers=0))
    lanes = [s for ph in k.phases for s in L.walk(ph.body)
             if isinstance(s, L.For) and s.kind == "vector"]
    plans = [A.lane_plan(s) for s in lanes]
    assert lanes and all(p is not None and p.accesses() for p in plans)
