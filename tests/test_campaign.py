"""Seeded, resumable, sharded campaigns (tilenest.validation.campaign)."""

from __future__ import annotations

import json
import os
import signal

import pytest

from tilenest.errors import TilenestError
from tilenest.validation.campaign import load_state, run_campaign


def square_checker(seed: int, i: int) -> dict:
    """A pure item: its value depends only on (seed, i)."""
    return {"status": "ok", "value": (seed * 31 + i) ** 2}


def faulty_checker(seed: int, i: int) -> dict:
    """Item 3 raises, item 5 hangs, item 7 kills its own process (as a
    segfault in JIT-compiled code would)."""
    if i == 3:
        raise ZeroDivisionError("boom")
    if i == 5:
        try:
            while True:  # a hang that burns CPU, as a runaway compiled loop does
                pass
        except Exception:  # noqa: BLE001 - code under test may catch everything
            return {"status": "ok"}
    if i == 7:
        os.kill(os.getpid(), signal.SIGKILL)
    return {"status": "ok"}


def test_resumed_campaign_equals_uninterrupted(tmp_path):
    whole = run_campaign("sq", square_checker, 20, 4)
    state = tmp_path / "sq.jsonl"
    run_campaign("sq", square_checker, 8, 4, state=state)
    seen = []
    st = run_campaign("sq", square_checker, 20, 4, state=state,
                      progress=lambda st, rec: seen.append(rec["i"]))
    assert sorted(seen) == list(range(8, 20)), "resuming reran finished items"
    assert {i: r["value"] for i, r in st.records.items()} == \
        {i: r["value"] for i, r in whole.records.items()}
    assert st.summary()["done"] == 20 and st.summary()["bugs"] == 0
    # the file alone reproduces the summary
    assert load_state(state, "sq", 4, 20).summary()["statuses"] == {"ok": 20}


def test_state_of_another_campaign_is_refused(tmp_path):
    state = tmp_path / "s.jsonl"
    run_campaign("sq", square_checker, 2, 1, state=state)
    with pytest.raises(TilenestError, match="seed 1"):
        run_campaign("sq", square_checker, 2, 2, state=state)


def test_truncated_last_line_is_rerun(tmp_path):
    state = tmp_path / "s.jsonl"
    run_campaign("sq", square_checker, 4, 1, state=state)
    text = state.read_text()
    state.write_text(text[: len(text) - 5])  # killed in the middle of a write
    st = run_campaign("sq", square_checker, 4, 1, state=state)
    assert sorted(st.records) == [0, 1, 2, 3]


@pytest.mark.parametrize("workers", [1, 2])
def test_crashes_hangs_and_dead_workers_are_findings(workers, tmp_path):
    if workers == 1:
        n = 7  # item 7 would kill the test process itself
    else:
        n = 10
    st = run_campaign("faulty", faulty_checker, n, 0, state=tmp_path / "f.jsonl",
                      workers=workers, time_limit=1.0, chunk=4)
    status = {i: r["status"] for i, r in st.records.items()}
    assert sorted(status) == list(range(n))
    assert status[3] == "crash" and "ZeroDivisionError" in st.records[3]["message"]
    assert status[5] == "timeout"
    if workers > 1:
        assert status[7] == "crash" and "died" in st.records[7]["message"]
    assert all(s == "ok" for i, s in status.items() if i not in (3, 5, 7))
    assert st.summary()["bugs"] == (3 if workers > 1 else 2)
    lines = (tmp_path / "f.jsonl").read_text().splitlines()
    assert json.loads(lines[0]) == {"campaign": "faulty", "seed": 0}


def test_fuzz_campaign_command_resumes(tmp_path, capsys):
    from tilenest.validation import fuzz

    state = tmp_path / "fz.jsonl"
    assert fuzz.main(["2", "11", "--state", str(state)]) == 0
    first = load_state(state, "fuzz-llvm", 11, 3).records
    assert fuzz.main(["3", "11", "--state", str(state)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["done"] == 3 and summary["bugs"] == 0
    assert summary["cases_compared"] > 0, "the campaign compared nothing"
    again = load_state(state, "fuzz-llvm", 11, 3).records
    assert {i: again[i]["status"] for i in first} == {i: r["status"] for i, r in first.items()}
