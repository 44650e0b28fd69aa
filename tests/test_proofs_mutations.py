"""The mutation check of the checker: every deliberately wrong transform,
binding, schedule or kernel in ``tests/mutations/cases.py`` is refuted with a
counterexample that an independent re-check confirms, and every matching
correct version is proved."""

from __future__ import annotations

import pytest
from mutations import recheck as RC
from mutations.cases import CASES

from tilenest.proofs.obligation import PROVED, REFUTED, discharge

TIMEOUT = 10.0


def test_corpus_has_at_least_thirty_pairs():
    assert len(CASES) >= 30
    assert len({c.name for c in CASES}) == len(CASES)


def _confirm(ob) -> str:
    """Re-check a refutation against the original maps."""
    w = ob.witness
    if ob.kind.startswith(("tau.", "cut.")):
        return RC.remap(ob)
    if ob.kind == "fusion.order":
        return RC.serial_edge(ob, w["program"])
    if ob.kind.startswith("layout."):
        return RC.layout(ob)
    if ob.kind in ("noninterference", "coverage.once", "fusion.dependence"):
        return RC.two_accesses(ob, w["program"])
    if ob.kind == "noninterference.pipeline":
        RC.two_accesses(ob, w["program"])
        return RC.race_at(ob, w["program"])
    if ob.kind == "noninterference.join":
        return RC.race_at(ob, w["program"])
    if ob.kind == "bounds":
        return RC.bounds(ob, w["program"])
    if ob.kind == "coverage.cover":
        return RC.cover(ob, w["program"])
    if ob.kind.startswith("binding.") and ob.engine != "catalogue":
        return RC.binding(ob, w["program"])
    if ob.kind.startswith("pipeline."):
        return RC.schedule(ob)
    if ob.kind == "reduction.law.associative":
        return RC.float_assoc(ob)
    if ob.kind == "reduction.order":
        return RC.placement(ob)
    # catalogue / policy refutations carry the missing relation instead of coordinates
    assert ob.counterexample or ob.details
    return "; ".join(ob.counterexample_lines())


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_wrong_is_refuted_right_is_proved(case):
    wrong = discharge(case.wrong(), TIMEOUT)
    right = discharge(case.right(), TIMEOUT)
    w = [o for o in wrong if o.kind == case.kind]
    r = [o for o in right if o.kind == case.kind]
    refuted = [o for o in w if o.status == REFUTED]
    assert refuted, [(o.kind, o.status, o.reason) for o in w]
    assert r and all(o.status == PROVED for o in r), [(o.status, o.reason) for o in r]
    for ob in refuted:
        assert ob.counterexample is not None or ob.details
        assert ob.counterexample_lines()
        if ob.claim is not None:
            assert ob.checked, "solver counterexamples are re-evaluated before reporting"
        assert _confirm(ob)
