"""The text/JSON mutation fuzzer: a short seeded slice of the campaign finds no
crash and no slow input; the fuzzer itself is deterministic, resumable, and
reports what it is there to find."""

from __future__ import annotations

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
    st = F.run_campaign(2000, 2026, seeds=seeds)
    t = F.tally(st, seeds)
    c = t.counts
    assert c["inputs"] == 2000 and c["text"] > 500 and c["json"] > 500
    assert t.failures == 0 and st.summary()["bugs"] == 0, F.summary(st, seeds=seeds)
    assert c["crash"] == c["unlocated"] == c["roundtrip"] == c["slow"] == c["hang"] == 0
    assert c["accepted"] > 20 and c["rejected"] > 1000  # both outcomes are exercised
    assert c["accepted"] + c["rejected"] == 2000
    assert t.max_seconds < F.SLOW_S
    assert time.perf_counter() - t0 < 120


def test_inputs_are_a_function_of_seed_and_index(seeds):
    a = [F.make_input(seeds, 7, i)[1] for i in range(40)]
    b = [F.make_input(seeds, 7, i)[1] for i in range(40)]
    c = [F.make_input(seeds, 8, i)[1] for i in range(40)]
    assert a == b and a != c
    assert sum(x not in {s.text for s in seeds} for x in a) >= 35  # mutated, not copies


def test_a_resumed_campaign_equals_one_straight_run(seeds, tmp_path):
    state_file = tmp_path / "state.jsonl"
    first = F.run_campaign(300, 5, state_file, seeds=seeds)
    assert sorted(first.records) == list(range(300))
    assert len(state_file.read_text().splitlines()) == 1 + 300  # header + one line an input
    seen = []
    resumed = F.run_campaign(600, 5, state_file, seeds=seeds,
                             progress=lambda st, rec: seen.append(rec["i"]))
    assert sorted(seen) == list(range(300, 600)), "resuming checked old inputs again"
    straight = F.run_campaign(600, 5, seeds=seeds)
    keys = ("status", "outcome", "reader", "from")
    assert {i: [r[k] for k in keys] for i, r in resumed.records.items()} == \
        {i: [r[k] for k in keys] for i, r in straight.records.items()}
    assert F.tally(resumed).counts == F.tally(straight).counts
    with pytest.raises(F.TilenestError, match="seed 5"):
        F.run_campaign(600, 6, state_file, seeds=seeds)


def test_workers_give_the_records_of_one_process(seeds, tmp_path):
    """Two worker processes (each given the corpus by the initializer) check
    the same inputs the same way as one process does."""
    pooled = F.run_campaign(150, 9, tmp_path / "p.jsonl", seeds=seeds, workers=2)
    alone = F.run_campaign(150, 9, seeds=seeds)
    keys = ("status", "outcome", "reader", "from")
    assert {i: [r[k] for k in keys] for i, r in pooled.records.items()} == \
        {i: [r[k] for k in keys] for i, r in alone.records.items()}


def _count_from_the_first_input(monkeypatch, counter):
    """The initializer warms the readers up by reading two seeds: reset
    ``counter["n"]`` to 0 after it, so a planted reader counts inputs only."""
    real_init = F.init_worker

    def init(seeds=None):
        real_init(seeds)
        counter["n"] = 0

    monkeypatch.setattr(F, "init_worker", init)


def test_crashes_unlocated_errors_and_slow_inputs_are_findings(seeds, monkeypatch):
    """The classification can fail: a reader that raises a raw exception, or a
    TilenestError without a site, or takes too long, is recorded with its input."""
    real = F.read
    calls = {"n": 0}
    _count_from_the_first_input(monkeypatch, calls)

    def flaky(kind, text):
        calls["n"] += 1
        if calls["n"] % 3 == 0:
            raise KeyError("planted")
        if calls["n"] % 3 == 1:
            raise F.TilenestError("no site at all")
        return real(kind, text)

    monkeypatch.setattr(F, "read", flaky)
    st = F.run_campaign(30, 1, seeds=seeds)
    t = F.tally(st)
    assert t.counts["crash"] == 10 and t.counts["unlocated"] == 10
    assert st.summary()["bugs"] == t.failures == 20  # the campaign counts them as bugs
    crash = next(f for f in t.findings if f.kind == "crash")
    assert "KeyError: 'planted'" in crash.error and "planted" in crash.traceback
    assert crash.input == F.make_input(seeds, 1, crash.index)[1]
    monkeypatch.setattr(F, "read", real)
    monkeypatch.setattr(F, "SLOW_S", -1.0)
    st = F.run_campaign(5, 1, seeds=seeds)
    assert F.tally(st).counts["slow"] == 5 and "slow (> -1 s) 5" in F.summary(st)
    assert {r["status"] for r in st.records.values()} == {"slow"}


def test_a_reader_that_never_ends_is_a_hang_with_its_input(seeds, monkeypatch):
    """The campaign's processor-time limit stops an input that loops forever;
    the finding is reported as a hang and its input is made again from
    (seed, index), since the stopped item recorded none."""
    real = F.read
    armed = {"n": -1}
    _count_from_the_first_input(monkeypatch, armed)

    def forever(kind, text):
        while armed["n"] >= 0:
            pass
        return real(kind, text)

    monkeypatch.setattr(F, "read", forever)
    st = F.run_campaign(2, 3, seeds=seeds, time_limit=0.3)
    t = F.tally(st, seeds)
    assert t.counts["hang"] == 2 and st.summary()["bugs"] == 2
    assert [f.kind for f in t.findings] == ["hang", "hang"]
    assert t.findings[1].input == F.make_input(seeds, 3, 1)[1]
    assert "hangs 2" in F.summary(st, seeds=seeds)


def test_round_trip_failures_are_findings(seeds, monkeypatch):
    monkeypatch.setattr(F, "round_trip_problem", lambda p: "planted difference")
    t = F.tally(F.run_campaign(200, 3, seeds=seeds))
    assert t.counts["roundtrip"] > 0 and t.counts["accepted"] == 0
    assert t.findings and all(f.error == "planted difference" for f in t.findings)


def test_command_line_prints_the_summary_and_resumes(tmp_path):
    from tilenest.validation.campaign import load_state

    state_file = tmp_path / "s.jsonl"
    cmd = [sys.executable, "-m", "tilenest.validation.fuzz_text", "--count", "60", "--seed",
           "4", "--state", str(state_file), "--workers", "1", "--quiet"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "fuzz_text seed 4: 60 inputs" in r.stdout and "crashes 0" in r.stdout
    assert "60 new inputs" in r.stdout
    cmd[4] = "120"
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0 and "120 inputs" in r.stdout and "60 new inputs" in r.stdout
    assert sorted(load_state(state_file, F.CAMPAIGN, 4, 120).records) == list(range(120))
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0 and "120 inputs" in r.stdout and "0 new inputs" in r.stdout


def test_mutations_handle_tokens_of_any_length():
    import random

    rng = random.Random(0)
    assert F._small_variant("9" * 5000, rng) == "9" * 5000
    assert F._small_variant("12", rng).isdigit()
    for i in range(50):
        F.mutate_text("kernel @k() {\n  %x = const {value = " + "9" * 5000 + "} : f32\n}", rng)


def test_a_one_off_pause_does_not_make_an_input_slow(monkeypatch):
    """An input is slow only when it is slow twice: a pause charged to its
    first reading (a garbage collection of a big heap) is not a finding, a
    reading slow every time is."""
    import tilenest.validation.fuzz_text as FT

    real = FT.check_one
    clock = {"t": 0.0, "calls": 0}

    def fake_clock() -> float:
        return clock["t"]

    def first_slow(kind, text):  # type: ignore[no-untyped-def]
        clock["calls"] += 1
        if clock["calls"] == 1:
            clock["t"] += 5.0  # the pause lands on the first reading only
        return real(kind, text)

    monkeypatch.setattr(FT.time, "process_time", fake_clock)
    monkeypatch.setattr(FT, "check_one", first_slow)
    rec = FT.check_item(2026, 3)
    assert rec["status"] != "slow" and not rec.get("slow") and clock["calls"] == 2

    def always_slow(kind, text):  # type: ignore[no-untyped-def]
        clock["t"] += 5.0
        return real(kind, text)

    monkeypatch.setattr(FT, "check_one", always_slow)
    rec = FT.check_item(2026, 3)
    assert rec.get("slow") and rec["read_secs"] >= 5.0
