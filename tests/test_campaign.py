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


_SETUP: dict = {}


def setup_process(tag: str) -> None:
    """A per-process initializer: counts how often it ran in this process."""
    _SETUP["tag"] = tag
    _SETUP["runs"] = _SETUP.get("runs", 0) + 1


def setup_checker(seed: int, i: int) -> dict:
    return {"status": "ok", "tag": _SETUP.get("tag"), "runs": _SETUP.get("runs", 0),
            "pid": os.getpid()}


def failing_setup() -> None:
    raise OSError("corpus unreadable")


@pytest.mark.parametrize("workers", [1, 2])
def test_initializer_runs_once_in_each_process_before_its_items(workers):
    _SETUP.clear()  # this process may have run the initializer in an earlier test
    st = run_campaign("setup", setup_checker, 12, 0, workers=workers, chunk=3,
                      init=setup_process, init_args=(f"w{workers}",))
    recs = st.records.values()
    assert all(r["tag"] == f"w{workers}" for r in recs), "an item ran before the initializer"
    assert all(r["runs"] == 1 for r in recs), "the initializer ran more than once a process"
    assert (workers == 1) == all(r["pid"] == os.getpid() for r in recs)


def test_failing_initializer_is_a_crash_naming_it_in_a_pool():
    st = run_campaign("setup", setup_checker, 4, 0, workers=2, chunk=2, init=failing_setup)
    assert {r["status"] for r in st.records.values()} == {"crash"}
    assert all("initializer failed: OSError: corpus unreadable" in r["message"]
               for r in st.records.values())
    with pytest.raises(OSError, match="corpus unreadable"):  # one process: the caller's error
        run_campaign("setup", setup_checker, 4, 0, init=failing_setup)


def marking_checker(seed: int, i: int) -> dict:
    """Statuses of its own; odd items are marked as bugs in the record."""
    return {"status": "unlocated" if i % 2 else "fine", **({"bug": True} if i % 2 else {})}


def test_records_marked_as_bugs_count_as_bugs(tmp_path):
    state = tmp_path / "m.jsonl"
    st = run_campaign("mark", marking_checker, 6, 0, state=state)
    assert st.summary()["bugs"] == 3 and [r["i"] for r in st.bugs()] == [1, 3, 5]
    assert load_state(state, "mark", 0, 6).summary()["bugs"] == 3  # the file alone says so


def test_records_keep_wall_and_processor_time(tmp_path):
    st = run_campaign("faulty", faulty_checker, 6, 0, time_limit=0.5)
    hang = st.records[5]
    assert hang["status"] == "timeout" and hang["cpu_secs"] >= 0.4
    assert all(r["secs"] >= 0 and r["cpu_secs"] >= 0 for r in st.records.values())


def test_fuzz_count_and_seed_by_flag_or_position(tmp_path, capsys):
    from tilenest.validation import fuzz

    assert fuzz.main(["--count", "2", "--seed", "11", "--state", str(tmp_path / "a")]) == 0
    assert fuzz.main(["2", "11", "--state", str(tmp_path / "b")]) == 0
    a = load_state(tmp_path / "a", "fuzz-llvm", 11, 2).records
    b = load_state(tmp_path / "b", "fuzz-llvm", 11, 2).records
    assert sorted(a) == sorted(b) == [0, 1]
    assert {i: r["status"] for i, r in a.items()} == {i: r["status"] for i, r in b.items()}
    with pytest.raises(SystemExit):
        fuzz.main(["3", "--count", "2"])
    assert "given twice" in capsys.readouterr().err


def budget_checker(seed: int, i: int) -> dict:
    """Reports the processor time its item has left."""
    from tilenest.validation.campaign import remaining_cpu

    return {"status": "ok", "left": remaining_cpu()}


def test_an_item_knows_its_remaining_processor_time():
    from tilenest.validation.campaign import remaining_cpu

    st = run_campaign("budget", budget_checker, 2, 0, time_limit=30.0)
    assert all(25.0 < r["left"] <= 30.0 + 1e-6 for r in st.records.values()), st.records
    assert remaining_cpu() == float("inf"), "the deadline outlived its item"
    st = run_campaign("budget", budget_checker, 1, 0, time_limit=0)
    assert st.records[0]["left"] == float("inf")


_SIGNAL_ELSEWHERE = """
import signal, sys, threading
from tilenest.validation.campaign import run_item
# the item's thread blocks the timer's signal, so the kernel hands it to the
# other thread, parked without the interpreter lock (as a native worker is)
threading.Thread(target=threading.Event().wait, daemon=True).start()
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGPROF])
if sys.argv[1] == "lost":  # the timer's signal never arrives at all
    signal.setitimer = lambda which, secs: None
def forever(seed, i):
    while True:
        pass
print(run_item(forever, 0, 0, 0.3)["status"])
"""


@pytest.mark.parametrize("how", ["elsewhere", "lost"])
def test_a_hang_stops_when_its_signal_reaches_another_thread(how):
    """A spinning item stops at its limit even when the timer's signal is
    delivered to a thread other than the one running it (CPython 3.11 then
    leaves it pending while the main thread spins) or does not arrive."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _SIGNAL_ELSEWHERE, how], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "timeout", r.stdout + r.stderr


def per_target_checker(seed: int, i: int) -> dict:
    """llvm on every item, cuda on even ones; item 3 mismatches on llvm."""
    targets = {"llvm": {"status": "mismatch" if i == 3 else "ok"}}
    if i % 2 == 0:
        targets["cuda"] = {"status": "ok" if i else "skipped"}
    return {"status": targets["llvm"]["status"], "targets": targets}


def test_summary_counts_each_targets_statuses(tmp_path):
    state = tmp_path / "t.jsonl"
    st = run_campaign("targets", per_target_checker, 6, 0, state=state)
    want = {"cuda": {"ok": 2, "skipped": 1}, "llvm": {"mismatch": 1, "ok": 5}}
    assert st.summary()["targets"] == want and st.summary()["bugs"] == 1
    assert load_state(state, "targets", 0, 6).summary()["targets"] == want
    assert "targets" not in run_campaign("sq", square_checker, 2, 0).summary()
