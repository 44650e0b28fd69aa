"""Differential fuzzing of the whole lowering with random well-typed kernels.

The default run checks 200 hypothesis-generated kernels (derandomized, so CI
is reproducible; a failure shrinks to a minimal spec and is reported with its
TileIR and DSL source). ``-m slow`` runs a longer seeded campaign."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, note, settings

from tilenest.validation.fuzz import Spec, build, campaign, check_spec, render, specs


def _explain(r) -> str:
    return f"{r.status}: {r.message}\n--- TileIR ---\n{r.tileir}\n--- DSL ---\n{r.source}"


@settings(max_examples=int(os.environ.get("TILENEST_FUZZ_EXAMPLES", "200")), deadline=None,
          derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(specs())
def test_random_kernels_validate(spec):
    r = check_spec(spec, cases=2, seed=len(spec.steps))
    note(_explain(r))
    assert r.status in ("ok", "unsupported"), _explain(r)


def test_spec_renders_and_captures_every_step_kind():
    s = Spec("f32", 2, (4, 8), True, False, [
        ("un", "exp"), ("binc", "mul", 0.5), ("binu", "maximum"), ("ite", "lt"),
        ("cast", "i32"), ("red", 1, "add", "ordered_tree", "sub"),
        ("fold", 0, "fold_right", "b"), ("serial", 2, "rev"), ("shift",), ("mma", False),
        ("mem", 3)])
    src = render(s)
    assert "tn.reduce(t, t.dim(1), tn.add, policy=tn.ordered_tree)" in src
    prog = build(s).program
    names = {op.name for op in prog.walk()}
    assert {"reduce", "serial", "ite", "cast", "exp", "maximum", "mma", "memory.store"} <= names
    assert check_spec(s).status == "ok"


def test_nested_parallel_and_integer_specs():
    s = Spec("i32", 2, (3, 16), False, True, [("binu", "xor"), ("red", 0, "xor",
                                                                  "unordered_tree", "add")])
    assert "exec=tn.exec.warp" in render(s)
    assert check_spec(s).status == "ok"


def test_seeded_campaign_is_reproducible():
    a = [r.status for r in campaign(6, seed=3)]
    b = [r.status for r in campaign(6, seed=3)]
    assert a == b and all(x == "ok" for x in a)


@pytest.mark.slow
def test_long_campaign():
    n = int(os.environ.get("TILENEST_FUZZ_CAMPAIGN", "2000"))
    bad = [r for r in campaign(n, seed=20260) if r.status not in ("ok", "unsupported")]
    assert not bad, "\n\n".join(_explain(r) for r in bad[:3])
