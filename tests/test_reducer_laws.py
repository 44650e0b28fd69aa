"""Custom reducer laws over the reals (``proofs/real_laws.py``), decided once
per reducer, and required wherever a tree policy regroups: at compile time
(``lowering/legality.py``) and, as a warning, in the interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import reducer_law_kernels as K
from tilenest.errors import ContractError, TilenestWarning
from tilenest.lowering import legality as LG
from tilenest.proofs import real_laws as RL
from tilenest.proofs.model import Model
from tilenest.proofs.obligation import PROVED, REFUTED, UNKNOWN, discharge
from tilenest.proofs.reductions import program_reduction_obligations

ROOT = Path(__file__).resolve().parents[1]
LAWS = ("reduction.law.associative", "reduction.law.commutative", "reduction.law.identity")


def _reducer(kernel, name):
    return next(r for r in kernel.program.reducers if r.name == name)


def _uses(kernel):
    p = kernel.program
    return [(p, o) for o in p.walk() if o.name == "reduce"]


def test_welford_laws_proved_by_check_each_once():
    got = subprocess.run([sys.executable, "-m", "tilenest.cli", "check", "--json", "--kernel",
                          "row_stats", "tests/reducer_law_kernels.py"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stdout + got.stderr
    report = json.loads(got.stdout)
    laws = [o for o in report["obligations"]
            if o["kind"].startswith("reduction.law.") and o["role"] == "required"]
    assert sorted(o["kind"] for o in laws) == sorted(LAWS)  # once per reducer, not per state
    assert all(o["verdict"] == "proved" and o["engine"] == "z3 (reals)" for o in laws)
    assert all("s[0] >= 1 and s[2] >= 0" in o["title"] for o in laws)


def test_welford_invariant_is_inferred_from_the_contributions():
    r = _reducer(K.row_stats, "welford")
    cands = RL.candidates(r, _uses(K.row_stats))
    assert {b.text() for b in cands} == {"s[0] >= 1", "s[0] <= 1", "s[2] >= 0", "s[2] <= 0"}
    inv = RL.invariant(r, cands, 5.0)
    assert [b.text() for b in inv] == ["s[0] >= 1", "s[2] >= 0"]


def _welford(a, b):
    """The merge on exact rationals (the guard as written)."""
    na, ma, qa = a
    nb, mb, qb = b
    n = na + nb
    d = mb - ma
    w = nb / max(n, Fraction(1)) if n > 0 else Fraction(0)
    return n, ma + d * w, qa + qb + d * d * na * w


def test_welford_over_every_real_state_fails_with_a_genuine_counterexample():
    # without the invariant (negative or fractional counts) the law is false:
    # the counterexample must break it when evaluated exactly
    r = _reducer(K.row_stats, "welford")
    a = RL.decide_law("assoc", r, [], 5.0)
    assert a.status == "sat"
    x, y, z = (tuple(Fraction(v) for v in a.point[n]) for n in "abc")
    assert _welford(_welford(x, y), z) != _welford(x, _welford(y, z))


def test_a_merge_that_divides_by_zero_at_the_identity_is_refuted():
    m = Model(K.unguarded_mean.program)
    obs = discharge(program_reduction_obligations(m))
    ident = next(o for o in obs if o.kind == "reduction.law.identity" and o.role == "required")
    assert ident.status == REFUTED
    assert "divides by zero" in "\n".join(ident.counterexample_lines())


@pytest.mark.parametrize("target", ["llvm", "cuda"])
@pytest.mark.parametrize("kernel", ["difference", "halves"])
def test_a_non_associative_tree_reducer_is_refused_at_compile(kernel, target):
    k = getattr(K, kernel)
    LG.clear_cache()
    with pytest.raises(ContractError) as e:
        k.compile(target=target)
    err = e.value
    text = str(err)
    assert "reduction.law.associative" in text and "refuted" in text
    assert any("a = " in n and "lhs = " in n for n in err.notes)  # the counterexample
    lines = {s.line for s in err.sites}
    src = (ROOT / "tests/reducer_law_kernels.py").read_text().splitlines()
    assert any("tn.reduce(" in src[n - 1] for n in lines)        # the reduce region
    assert any("tn.reducer(" in src[n - 1] for n in lines)       # the reducer's declaration
    assert "fold_left" in err.hint


def test_an_undecided_law_is_refused_unless_assumed():
    LG.clear_cache()
    with pytest.raises(ContractError) as e:
        K.logsumexp.compile(target="llvm")
    assert "not proved" in str(e.value) and "assume=" in e.value.hint
    ck = K.logsumexp.compile(target="llvm", assume=("reduction.law.",))
    laws = [o for o in ck.obligations if o.kind.startswith("reduction.law.")]
    assert laws and all(o.status == "assumed" for o in laws)
    x = np.array([0.5, 1.0, 2.0], np.float32)
    out = np.zeros(1, np.float32)
    ck(x, out)
    assert np.isclose(out[0], np.log(np.exp(x.astype(np.float64)).sum()), rtol=1e-5)


def test_welford_compiles_with_its_laws_proved():
    LG.clear_cache()
    ck = K.row_stats.compile(target="llvm")
    laws = [o for o in ck.obligations if o.kind.startswith("reduction.law.")]
    assert sorted(o.kind for o in laws) == sorted(LAWS)
    assert all(o.status == PROVED for o in laws)


def test_law_answers_are_kept_per_reducer_algebra(monkeypatch):
    # a second compile (cold gate cache) asks the solver nothing: the answers
    # are kept by the reducer's algebra, not by the kernel
    K.row_stats.compile(target="llvm")
    calls = []
    real = RL.decide_law
    monkeypatch.setattr(RL, "decide_law", lambda *a: calls.append(a) or real(*a))
    LG.clear_cache()
    K.row_stats.compile(target="llvm", cache=False)
    assert calls == []


def test_interpreter_warns_once_per_unproved_reducer():
    x = np.arange(4, dtype=np.float32)
    out = np.zeros(1, np.float32)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        K.difference(x, out)
        K.difference(x, out)
    mine = [w for w in seen if issubclass(w.category, TilenestWarning)]
    assert len(mine) == 1
    msg = str(mine[0].message)
    assert "@difference" in msg and "reduction.law.associative refuted" in msg
    assert out[0] == -6.0  # the canonical (source-order) evaluation still runs


def test_interpreter_is_silent_on_a_proved_reducer():
    x = np.random.default_rng(0).random((2, 9)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TilenestWarning)
        K.row_stats(x, np.zeros(2, np.float32), np.zeros(2, np.float32))


def test_unknown_is_never_proved():
    r = _reducer(K.logsumexp, "logsumexp")
    obs = discharge(RL.real_law_obligations(K.logsumexp.program, r, [], True, ()))
    assert obs and all(o.status == UNKNOWN for o in obs)


def test_bounds_every_contribution_meets_are_invariant_candidates():
    """max with identity 0 is not two-sided on negative states, but a
    reduction of magnitudes forms none: the contribution max(0, |x|) >= 0
    is inferred, the laws hold there, and the tree compiles and runs."""
    r = _reducer(K.max_abs, "maxabs")
    cands = RL.candidates(r, _uses(K.max_abs))
    assert "s[0] >= 0" in {b.text() for b in cands}
    assert [b.text() for b in RL.invariant(r, cands, 5.0)] == ["s[0] >= 0"]
    x = np.array([3.0, -7.5, 2.0, -0.25], np.float32)
    out = np.zeros(1, np.float32)
    K.max_abs.compile(target="llvm")(x, out)
    assert out[0] == 7.5


# -- the merge of online-softmax states: exp through its laws, -inf identity --

SOFTMAX = "online_softmax"


def _law_answers(kernel):
    r = kernel.program.reducers[0]
    return {law: RL.decide_law(law, r, [], 5.0) for law in ("assoc", "comm", "ident")}


def test_online_softmax_merge_laws_are_proved_by_check():
    got = subprocess.run([sys.executable, "-m", "tilenest.cli", "check", "--json", "--kernel",
                          "softmax_average", "tests/reducer_law_kernels.py"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stdout + got.stderr
    laws = [o for o in json.loads(got.stdout)["obligations"]
            if o["kind"].startswith("reduction.law.") and o["role"] == "required"]
    assert sorted(o["kind"] for o in laws) == sorted(LAWS)
    assert all(o["verdict"] == "proved" and o["engine"] == "z3 (reals)" for o in laws)
    assert all("identity (-inf, 0.0, 0.0)" in o["title"] for o in laws)


def _mp_merge(merge, a, b):
    """``merge`` of the kernels' file evaluated at 60 digits with the real exp."""
    import mpmath

    ma, la, aa = a
    mb, lb, ab = b
    m = max(ma, mb)
    guarded = merge is not K.unguarded_softmax_merge

    def w(x):
        return mpmath.mpf(0) if guarded and x == -mpmath.inf else mpmath.exp(x - m)

    if merge is K.unscaled_softmax_merge:
        return m, la * w(ma) + lb, aa * w(ma) + ab
    return m, la * w(ma) + lb * w(mb), aa * w(ma) + ab * w(mb)


def test_a_merge_that_does_not_rescale_is_refuted_with_a_genuine_counterexample():
    import mpmath

    mpmath.mp.dps = 60
    a = _law_answers(K.unscaled_softmax_average)
    assert a["ident"].status == "unsat"
    for law in ("assoc", "comm"):
        assert a[law].status == "sat"
    pt = a["assoc"].point
    x, y, z = (tuple(mpmath.mpf(v) for v in pt[n]) for n in "abc")
    f = K.unscaled_softmax_merge
    lhs, rhs = _mp_merge(f, _mp_merge(f, x, y), z), _mp_merge(f, x, _mp_merge(f, y, z))
    assert max(abs(p - q) for p, q in zip(lhs, rhs)) > 1e-6
    assert lhs == pytest.approx(tuple(mpmath.mpf(v) for v in pt["lhs"]), rel=1e-12)


def test_merging_two_empty_states_without_a_guard_is_refuted_as_nan():
    m = Model(K.unguarded_softmax_average.program)
    obs = discharge(program_reduction_obligations(m))
    ident = next(o for o in obs if o.kind == "reduction.law.identity" and o.role == "required")
    assert ident.status == REFUTED
    text = "\n".join(ident.counterexample_lines())
    assert "a = (-inf, 0, 0)" in text and "NaN" in text and "tn.ite" in text


def test_the_guarded_merge_compiles_as_a_tree_and_matches_softmax():
    LG.clear_cache()
    x = np.random.default_rng(0).standard_normal((3, 1000)).astype(np.float32) * 5
    x[1, 17] = -np.inf  # a masked score: its weight is 0
    v = np.random.default_rng(1).standard_normal((3, 1000)).astype(np.float32)
    ck = K.softmax_average.compile(target="llvm")
    assert all(o.status == PROVED for o in ck.obligations if o.kind.startswith("reduction.law."))
    out = np.zeros(3, np.float32)
    ck(x, v, out)
    w = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(out, (w * v).sum(axis=1) / w.sum(axis=1), rtol=1e-5)


def test_exp_of_an_argument_outside_the_linear_forms_is_abstract_but_sound():
    # exp(a * b) is a fresh positive real: exp(x)^2 = exp(2 x) needs the
    # linear forms, exp(x * x) >= 0 holds of any positive real, and nothing
    # false is proved about the opaque term
    import z3

    alg = RL.Reals()
    x, y = z3.Reals("x y")
    sq = alg._exp(x * y)
    e2, e1 = alg._exp(2 * x), alg._exp(x)
    s = z3.Solver()
    s.add(*alg.side, z3.Not(z3.And(sq > 0, e2 == e1 * e1)))
    assert s.check() == z3.unsat
    s = z3.Solver()
    s.add(*alg.side, sq == e1)  # exp(x y) = exp(x) is satisfiable (y = 1)
    assert s.check() == z3.sat
