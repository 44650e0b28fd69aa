"""The assertion IR and its two engines: claims, counterexample sets, ISL/Z3
agreement, budgets (unknown is never proved), re-checked counterexamples,
data-dependent terms, over-approximations, and the audited ``assume``."""

from __future__ import annotations

import gc
import os

import pytest
from mutations.cases import CASES

from tilenest.proofs import formula as Fm
from tilenest.proofs import isl_engine
from tilenest.proofs.obligation import (
    ASSUMED,
    EXIT_REFUTED,
    EXIT_UNKNOWN,
    PROVED,
    REFUTED,
    UNKNOWN,
    Obligation,
    discharge,
    outcome,
)
from tilenest.semantics import expr as E

N, M = E.Sym("N"), E.Sym("M")
i, j, q, r = (E.Var(v) for v in "ijqr")
POS = Fm.atom(N.ge(0))


def split_cover(outer):
    Ap = Fm.conj(Fm.in_box([q, r], [outer, 4]), Fm.atom((q * 4 + r).lt(N)))
    return Fm.Claim(("i",), Fm.in_box([i], [N]),
                    Fm.exists(["q", "r"], Fm.conj(Ap, Fm.eqs([q * 4 + r], [i]))), POS)


def decide(claim, **kw):
    (ob,) = discharge([Obligation("t", "t", claim=claim)], **kw)
    return ob


def test_claim_text_and_counterexample_set():
    c = split_cover(E.cdiv(N, 4))
    assert c.text().startswith("forall N, $i:") and "exists $q, $r" in c.text()
    assert c.params == ("N",)
    with pytest.raises(ValueError):
        Fm.Claim((), Fm.atom(i.ge(0)), Fm.TRUE)  # unlisted free variable


def test_isl_proves_and_refutes_parametrically():
    assert decide(split_cover(E.cdiv(N, 4))).status == PROVED
    ob = decide(split_cover(N // 4))
    assert ob.status == REFUTED and ob.engine == "isl" and ob.checked
    n, x = ob.counterexample["N"], ob.counterexample["i"]
    assert 0 <= x < n and x >= (n // 4) * 4  # an element of the lost tail


def test_isl_counterexamples_are_small():
    # a refutation is sampled in the smallest of the boxes [-b, b] (b = 4, 64,
    # ..) that holds a point, so a claim refuted by every large N is shown
    # with a small one; a set with points only beyond the first box still
    # gets one
    c = Fm.Claim(("i",), Fm.conj(Fm.in_box([i], [N]), Fm.atom(N.ge(3))), Fm.atom(i.lt(2)), POS)
    ob = decide(c)
    assert ob.status == REFUTED and ob.engine == "isl"
    cx = ob.counterexample
    assert 3 <= cx["N"] <= 4 and 2 <= cx["i"] < cx["N"]
    far = Fm.Claim(("i",), Fm.in_box([i], [N]), Fm.atom(i.lt(100)), POS)
    ob = decide(far)
    assert ob.status == REFUTED and 100 <= ob.counterexample["i"] < ob.counterexample["N"] <= 4096


def test_bound_variables_may_shadow_free_ones():
    c = Fm.Claim(("q",), Fm.in_box([q], [N]),
                 Fm.exists(["q"], Fm.conj(Fm.in_box([q], [N]), Fm.atom(q.eq(0)))), POS)
    assert decide(c).status == PROVED


def test_evaluate_exists_by_enumeration():
    env = {N: 10, i: 9}
    assert Fm.evaluate(split_cover(E.cdiv(N, 4)).concl, env)
    assert not Fm.evaluate(split_cover(N // 4).concl, env)


def test_non_affine_claims_go_to_z3():
    c = Fm.Claim(("i",), Fm.in_box([i], [N * M]), Fm.atom(i.lt(N * M + 1)), POS)
    ob = decide(c)
    assert ob.status == PROVED and ob.engine == "z3"
    bad = Fm.Claim(("i",), Fm.in_box([i], [N * M]), Fm.atom(i.lt(N + M)), POS)
    ob = decide(bad)
    assert ob.status == REFUTED and ob.checked
    cx = ob.counterexample
    assert cx["i"] < cx["N"] * cx["M"] and cx["i"] >= cx["N"] + cx["M"]


def test_forced_isl_on_non_affine_is_unknown_not_proved():
    c = Fm.Claim(("i",), Fm.in_box([i], [N * M]), Fm.atom(i.lt(N * M + 1)), POS)
    ob = decide(c, engine="isl")
    assert ob.status == UNKNOWN and "non-affine" in ob.reason


def test_budget_exhaustion_is_unknown():
    # a nonlinear claim that is true but hard: x^3 + y^3 != z^3 over a box
    x, y, z = E.Var("x"), E.Var("y"), E.Var("z")
    box = Fm.conj(Fm.in_box([x, y, z], [N, N, N]), Fm.atom(x.ge(1)), Fm.atom(y.ge(1)))
    c = Fm.Claim(("x", "y", "z"), box, Fm.atom((x * x * x + y * y * y).ne(z * z * z)), POS)
    ob = decide(c, timeout=0.05)
    assert ob.status in (UNKNOWN, PROVED)
    assert ob.status != REFUTED
    if ob.status == UNKNOWN:
        assert ob.reason


def test_isl_operation_budget(monkeypatch):
    monkeypatch.setattr(isl_engine, "OPS_PER_SECOND", 1)
    monkeypatch.setattr(isl_engine, "MIN_OPS", 1)
    big = Fm.Claim(("i", "j"), Fm.conj(Fm.in_box([i, j], [N, M]),
                                        Fm.atom((i * 7 + j * 13).ne(5))),
                   Fm.exists(["q", "r"], Fm.conj(Fm.in_box([q, r], [N, M]),
                                                 Fm.atom((q * 3 + r * 11).eq(i + j)))), POS)
    ob = decide(big, timeout=0.001, engine="isl")
    assert ob.status == UNKNOWN and "budget" in ob.reason


def test_fake_counterexample_is_never_reported(monkeypatch):
    monkeypatch.setattr(isl_engine, "decide",
                        lambda *a, **k: isl_engine.Answer("point", {"N": 5, "i": 0}))
    ob = decide(split_cover(E.cdiv(N, 4)))
    assert ob.status == UNKNOWN and "re-check" in ob.reason


def test_data_dependent_counterexample_is_unknown():
    v = E.Val("idx")
    c = Fm.Claim(("i",), Fm.in_box([i], [N]), Fm.atom((i + v).lt(N)), POS)
    ob = decide(c)
    assert ob.status == UNKNOWN and "%idx" in ob.reason
    ok = Fm.Claim(("i",), Fm.in_box([i], [N]), Fm.atom((i + v - v).lt(N)), POS)
    assert decide(ok).status == PROVED


def test_over_approximation_bookkeeping():
    c = split_cover(E.cdiv(N, 4))
    (ob,) = discharge([Obligation("t", "t", claim=c, provable=False, inexact_note="a while")])
    assert ob.status == UNKNOWN
    bad = split_cover(N // 4)
    (ob,) = discharge([Obligation("t", "t", claim=bad, refutable=False, inexact_note="x")])
    assert ob.status == UNKNOWN and ob.counterexample is not None


def test_assume_is_audited_and_never_proved():
    obs = [Obligation("bounds", "b", claim=split_cover(N // 4)),
           Obligation("coverage.cover", "c", claim=split_cover(E.cdiv(N, 4)))]
    discharge(obs, assume=["bounds"])
    assert obs[0].status == ASSUMED and obs[0].assumed_by == "bounds"
    assert "not proved" in obs[0].reason
    assert obs[1].status == PROVED
    assert outcome(obs) == 0
    assert Obligation("x.y", "t").matches("x.*") and not Obligation("x", "t").matches("y")


def test_exit_status_semantics():
    p = Obligation("a", "a", claim=split_cover(E.cdiv(N, 4)))
    f = Obligation("b", "b", claim=split_cover(N // 4))
    u = Obligation("c", "c", claim=Fm.Claim(("i",), Fm.in_box([i], [N]), Fm.atom(i.ge(0)), POS),
                   provable=False)
    ev = Obligation("d", "d", claim=split_cover(N // 4), role="evidence")
    assert outcome(discharge([p, ev])) == 0
    assert outcome(discharge([p, u])) == EXIT_UNKNOWN
    assert outcome(discharge([p, u, f])) == EXIT_REFUTED


def _claims():
    out = []
    for c in CASES:
        for build in (c.wrong, c.right):
            for o in build():
                if o.claim is not None and o.kind == c.kind and not o.kind.startswith(
                        "reduction.law"):
                    out.append((c.name, o))
    return out


def test_isl_and_z3_agree_on_the_corpus():
    """Every corpus claim that Z3 decides gets the same verdict from both engines."""
    agree = decided = 0
    for name, o in _claims():
        a = Obligation(o.kind, o.title, claim=o.claim, lemma=o.lemma)
        b = Obligation(o.kind, o.title, claim=o.claim, lemma=o.lemma)
        discharge([a], timeout=10, engine="isl")
        discharge([b], timeout=2, engine="z3")
        if b.status == UNKNOWN or a.status == UNKNOWN:
            continue
        decided += 1
        assert a.status == b.status, (name, o.kind, a.status, b.status, a.reason, b.reason)
        agree += 1
    assert decided >= 30


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
def test_isl_questions_keep_memory_flat():
    """Each isl question that finds a point used to run in a fresh context,
    which islpy never frees once it has sampled (about 2 KiB per question:
    6 MiB over 3,000); the engine asks in one context per thread. The
    allowance, 2 MiB, leaves room for the allocator's own growth in a worker
    that has run other tests (1.1 MiB seen once) and a third of that leak."""
    f = Fm.conj(Fm.atom(i.ge(0)), Fm.atom(i.lt(N)), POS)

    def rss_mib() -> float:
        gc.collect()
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    for _ in range(200):  # warm up: allocator pools, the context itself
        assert isl_engine.decide(f, ("N",), ("i",), (), 1.0).status == "point"
    before = rss_mib()
    for _ in range(3000):
        isl_engine.decide(f, ("N",), ("i",), (), 1.0)
    assert rss_mib() - before < 2.0


def test_a_repeated_formula_is_decided_once_per_process(monkeypatch):
    """With the disk store off, obligations stating the same formula (the
    unrolled stores of a micro-tile) ask the engine once; each still gets
    its verdict and its own copy of the counterexample."""
    from tilenest.proofs import obligation as O

    monkeypatch.setattr(O.PROOFS, "folder", lambda: None)
    calls = []
    real = isl_engine.decide
    monkeypatch.setattr(isl_engine, "decide", lambda *a, **k: calls.append(1) or real(*a, **k))
    obs = discharge([Obligation("t", "t", claim=split_cover(N // 4)) for _ in range(3)]
                    + [Obligation("t", "t", claim=split_cover(E.cdiv(N, 4))) for _ in range(3)])
    assert [o.status for o in obs] == [REFUTED] * 3 + [PROVED] * 3
    assert len(calls) == 2
    assert obs[0].counterexample == obs[1].counterexample
    assert obs[0].counterexample is not obs[1].counterexample
