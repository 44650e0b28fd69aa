"""How long an asynchronous store stays in flight (``proofs/barriers.async_lag``).

A block barrier commits the asynchronous stores issued since the previous
one as a group and completes every group older than its ``keep`` newest.
The barrier proof gives each asynchronous store the most barriers it can
cross before some barrier completes it, on any path from it -- not the
phase's largest ``keep`` for every store. The kernel here is a two-version
ring whose loop holds three barriers that each keep two groups, so a copy
issued at the top of an iteration lands exactly at the next iteration's
first barrier, while the prologue's copy is completed before the loop by a
barrier that keeps nothing. With one lag for all stores (the largest keep)
the prologue's copy would seem in flight during the first iteration's reads:
a race the program does not have.
"""

from __future__ import annotations

import pytest

from tilenest.lowering import loopir as L
from tilenest.proofs import barriers as BP
from tilenest.proofs.obligation import PROVED, REFUTED
from tilenest.semantics import dtypes as D
from tilenest.semantics import expr as E

W = 64
N = E.Sym("N")
f32 = D.f32


def _ring(prologue_keep: int, loop_keep: int = 2) -> L.Kernel:
    s = L.Buffer("s", f32, "shared", E.Const(2 * W))
    x = L.Buffer("x", f32, "global", E.mul(N, W), arg=0)
    out = L.Buffer("out", f32, "global", E.mul(N, 3 * W), arg=1)
    k = E.Var("k")

    def tloop(name, body):  # type: ignore[no-untyped-def]
        t = L.LVar(name, D.i64)
        return L.For(t, E.Const(0), E.Const(W), tuple(body(E.Var(name))), "thread",
                     scope="block")

    def produce(step):  # type: ignore[no-untyped-def]
        return tloop("tp", lambda t: [L.Store(
            s, L.IExpr(E.add(E.mul(E.mod(step, 2), W), t)),
            L.Load(x, L.IExpr(E.add(E.mul(step, W), t))), mode="async")])

    def consume(part):  # type: ignore[no-untyped-def]
        # each thread reads another thread's element of the current version
        return tloop(f"tc{part}", lambda t: [L.Store(
            out, L.IExpr(E.add(E.add(E.mul(k, 3 * W), part * W), t)),
            L.Load(s, L.IExpr(E.add(E.mul(E.mod(k, 2), W), E.mod(t + part + 1, W)))))])

    body = (L.Barrier("block", keep=loop_keep),
            L.If(L.IPred(E.cmp("<", E.add(k, 1), N)), (produce(E.add(k, 1)),), ()),
            consume(0), L.Barrier("block", keep=loop_keep),
            consume(1), L.Barrier("block", keep=loop_keep),
            consume(2))
    ph = L.Phase("ph", (E.Const(1),), L.LVar("pid", D.i64), (
        L.Barrier("block"), produce(E.Const(0)), L.Barrier("block", keep=prologue_keep),
        L.For(L.LVar("k", D.i64), E.Const(0), N, body)))
    return L.Kernel("ring", (L.Param("x", "tensor", f32, (E.mul(N, W),)),
                             L.Param("out", "tensor", f32, (E.mul(N, 3 * W),))), ("N",),
                    (s,), (ph,))


def _lags(k: L.Kernel) -> list[int]:
    accs = BP._Collector(k, k.phases[0], W).run()
    return [a.lag for a in accs if a.asynchronous]


def test_each_copy_gets_its_own_lag():
    # the prologue's copy is completed by the barrier after it; the loop's
    # copy crosses the two barriers that keep it and lands at the next top
    assert _lags(_ring(prologue_keep=0)) == [0, 2]
    # a prologue barrier that keeps two groups lets its copy into the loop
    assert _lags(_ring(prologue_keep=2)) == [2, 2]
    # barriers that keep one group each: the loop's copy lands at the second
    assert _lags(_ring(prologue_keep=0, loop_keep=1)) == [0, 1]


def test_a_ring_whose_copies_land_at_the_next_iteration_is_proved():
    obs = BP.check_barriers(_ring(prologue_keep=0), W)
    assert obs and all(o.status == PROVED for o in obs), [
        (o.status, o.title) for o in obs if o.status != PROVED]


@pytest.mark.parametrize("prologue_keep", [1, 2])
def test_a_prologue_copy_still_in_flight_in_the_first_iteration_is_refuted(prologue_keep):
    """The prologue barrier keeps the copy's group, and the loop's first
    barrier keeps two: version 0 is read while its copy may not have landed."""
    obs = BP.check_barriers(_ring(prologue_keep=prologue_keep), W)
    bad = [o for o in obs if o.status == REFUTED]
    assert bad and all("s" in o.title for o in bad)


def test_the_lag_follows_branches_and_loops():
    """A copy before a loop whose body may run zero times: the path that
    skips the loop reaches a barrier keeping two, the one through the body a
    barrier keeping none first -- the lag is the larger."""
    s = L.Buffer("s", f32, "shared", E.Const(W))
    st = L.Store(s, L.IExpr(E.Var("t")), L.Const(1.0, f32), mode="async")
    t = L.LVar("t", D.i64)
    copy = L.For(t, E.Const(0), E.Const(W), (st,), "thread", scope="block")
    loop = L.For(L.LVar("i", D.i64), E.Const(0), N, (L.Barrier("block"),))
    ph = L.Phase("ph", (E.Const(1),), L.LVar("pid", D.i64), (
        copy, loop, L.Barrier("block", keep=2), L.Barrier("block", keep=2),
        L.Barrier("block", keep=2)))
    k = L.Kernel("paths", (), ("N",), (s,), (ph,))
    assert _lags(k) == [2]
    # a loop of at least one trip would not change the bound: its trip count
    # is symbolic here, so both paths count
    only_body = L.Phase("ph", (E.Const(1),), L.LVar("pid", D.i64), (copy, L.Barrier("block")))
    assert _lags(L.Kernel("one", (), (), (s,), (only_body,))) == [0]
