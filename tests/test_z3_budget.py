"""Z3 queries are budgeted in resource units, not seconds
(``proofs/z3_engine.limit``): a verdict is the same on an idle machine and
on one so loaded that every query's wall-clock time balloons. The tests
make the clock run a minute per reading, which left the wall-clock budgets
of earlier versions nothing to spend."""

from __future__ import annotations

import itertools
import time

import pytest

from tilenest.proofs import formula as Fm
from tilenest.proofs import z3_engine as Z
from tilenest.semantics import dtypes as D
from tilenest.semantics import expr as E


@pytest.fixture
def crawling_clock(monkeypatch):
    """``time.perf_counter`` and ``time.monotonic`` advance 60 s per call."""
    ticks = itertools.count()
    base = time.perf_counter()
    monkeypatch.setattr(time, "perf_counter", lambda: base + 60.0 * next(ticks))
    monkeypatch.setattr(time, "monotonic", lambda: base + 60.0 * next(ticks))


def test_a_float_law_is_proved_under_a_crawling_clock(crawling_clock):
    # f32 maximum is associative (NaN and signed zeros included): about 0.2 s of Z3
    alg = Z.Scalar(D.f32)

    def op(x, y):  # type: ignore[no-untyped-def]
        return alg.op("maximum", x, y)

    a = Z.prove_law(alg, ("a", "b", "c"), lambda a, b, c: [op(op(a[0], b[0]), c[0])],
                    lambda a, b, c: [op(a[0], op(b[0], c[0]))], 1, timeout=2.0, expect=True)
    assert a.status == "unsat", a.reason


def test_an_index_claim_is_decided_under_a_crawling_clock(crawling_clock):
    # (x n + r) // n == x for 0 <= r < n: nonlinear in the symbol n
    x, r, n = E.Var("x"), E.Var("r"), E.Sym("n")
    claim = Fm.Claim(("x", "r"), Fm.conj(Fm.atom(x.ge(0)), Fm.atom(r.ge(0)), Fm.atom(r.lt(n))),
                     Fm.atom(E.floordiv(x * n + r, n).eq(x)), Fm.atom(n.ge(1)))
    a = Z.decide(claim.counterexample_set(), claim.params, claim.vars, claim.data, timeout=2.0)
    assert a.status == "unsat", a.reason


def test_the_budget_is_in_units_with_a_wall_clock_net():
    class Probe:
        def __init__(self):
            self.opts = {}

        def set(self, k, v):
            self.opts[k] = v

    p = Probe()
    Z.limit(p, 0.5)
    assert p.opts["rlimit"] == int(0.5 * Z.UNITS_PER_SECOND)
    assert p.opts["timeout"] == int(0.5 * 1000 * Z.WALL_FACTOR)
