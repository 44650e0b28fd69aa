"""The text/JSON mutation fuzzer: a short seeded slice of the campaign finds no
crash and no slow input; the fuzzer itself is deterministic, resumable, and
reports what it is there to find."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tilenest.validation import fuzz_text as F

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def seeds():
    return F.corpus()


def test_corpus_holds_every_case_and_example_in_both_forms(seeds):
    names = {s.name for s in seeds}
    cases = ROOT / "spec" / "conformance" / "cases"
    for tile in cases.rglob("*.tile"):
        assert str(tile.relative_to(cases)) in names
    for js in cases.rglob("*.tileir.json"):
        assert str(js.relative_to(cases)) in names
    examples = {n.split("/")[1].split(".")[0] for n in names if n.startswith("examples/")}
    assert examples == {p.stem for p in (ROOT / "examples").glob("*.py")}
    assert {s.kind for s in seeds} == {"text", "json"}
    assert sum(s.kind == "json" for s in seeds) > 200


def test_seeded_slice_has_no_crash_and_no_slow_input(seeds):
    """2,000 inputs of campaign seed 2026: every one is accepted (and round-trips)
    or rejected with a located TilenestError, each within a second."""
    t0 = time.perf_counter()
    state = F.run_campaign(2000, 2026, seeds=seeds)
    c = state.counts
    assert c["inputs"] == 2000 and c["text"] > 500 and c["json"] > 500
    assert state.failures == 0, F.summary(state)
    assert c["crash"] == c["unlocated"] == c["roundtrip"] == c["slow"] == c["hang"] == 0
    assert c["accepted"] > 20 and c["rejected"] > 1000  # both outcomes are exercised
    assert c["accepted"] + c["rejected"] == 2000
    assert state.max_seconds < F.SLOW_S
    assert time.perf_counter() - t0 < 120


def test_inputs_are_a_function_of_seed_and_index(seeds):
    a = [F.make_input(seeds, 7, i)[1] for i in range(40)]
    b = [F.make_input(seeds, 7, i)[1] for i in range(40)]
    c = [F.make_input(seeds, 8, i)[1] for i in range(40)]
    assert a == b and a != c
    assert sum(x not in {s.text for s in seeds} for x in a) >= 35  # mutated, not copies


def test_a_resumed_campaign_equals_one_straight_run(seeds, tmp_path):
    state_file = tmp_path / "state.json"
    first = F.run_campaign(300, 5, state_file, seeds=seeds)
    assert first.next == 300 and json.loads(state_file.read_text())["next"] == 300
    resumed = F.run_campaign(600, 5, state_file, seeds=seeds)
    straight = F.run_campaign(600, 5, seeds=seeds)
    keys = ("inputs", "text", "json", "accepted", "rejected", "crash")
    assert resumed.next == straight.next == 600
    assert {k: resumed.counts[k] for k in keys} == {k: straight.counts[k] for k in keys}
    with pytest.raises(F.TilenestError, match="seed 5, not 6"):
        F.run_campaign(600, 6, state_file, seeds=seeds)


def test_crashes_unlocated_errors_and_slow_inputs_are_findings(seeds, monkeypatch):
    """The classification can fail: a reader that raises a raw exception, or a
    TilenestError without a site, or takes too long, is recorded with its input."""
    real = F.read
    calls = {"n": 0}

    def flaky(kind, text):
        calls["n"] += 1
        if calls["n"] % 3 == 0:
            raise KeyError("planted")
        if calls["n"] % 3 == 1:
            raise F.TilenestError("no site at all")
        return real(kind, text)

    monkeypatch.setattr(F, "read", flaky)
    state = F.run_campaign(30, 1, seeds=seeds)
    assert state.counts["crash"] == 10 and state.counts["unlocated"] == 10
    crash = next(f for f in state.findings if f.kind == "crash")
    assert "KeyError: 'planted'" in crash.error and "planted" in crash.traceback
    assert crash.input == F.make_input(seeds, 1, crash.index)[1]
    monkeypatch.setattr(F, "read", real)
    monkeypatch.setattr(F, "SLOW_S", -1.0)
    state = F.run_campaign(5, 1, seeds=seeds)
    assert state.counts["slow"] == 5 and "slow (> -1 s) 5" in F.summary(state)


def test_round_trip_failures_are_findings(seeds, monkeypatch):
    monkeypatch.setattr(F, "round_trip_problem", lambda p: "planted difference")
    state = F.run_campaign(200, 3, seeds=seeds)
    assert state.counts["roundtrip"] > 0 and state.counts["accepted"] == 0
    assert all(f.error == "planted difference" for f in state.findings)


def test_command_line_prints_the_summary_and_resumes(tmp_path):
    state_file = tmp_path / "s.json"
    cmd = [sys.executable, "-m", "tilenest.validation.fuzz_text", "--count", "60", "--seed",
           "4", "--resume", str(state_file), "--quiet"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "fuzz_text seed 4: 60 inputs" in r.stdout and "crashes 0" in r.stdout
    cmd[4] = "120"
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0 and "120 inputs" in r.stdout
    assert json.loads(state_file.read_text())["next"] == 120


def test_mutations_handle_tokens_of_any_length():
    import random

    rng = random.Random(0)
    assert F._small_variant("9" * 5000, rng) == "9" * 5000
    assert F._small_variant("12", rng).isdigit()
    for i in range(50):
        F.mutate_text("kernel @k() {\n  %x = const {value = " + "9" * 5000 + "} : f32\n}", rng)
