"""Campaigns on a Ray cluster (tilenest.validation.cluster) and shrinking on the worker.

One local Ray cluster of two CPUs serves the whole module (starting one takes
a few seconds); each campaign stops its own actors when it ends, so the next
finds both CPUs free.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tilenest.errors import NotAvailableError, TilenestError
from tilenest.validation import cluster, fuzz
from tilenest.validation.campaign import load_state, run_campaign
from tilenest.validation.shrink import flat_size, shrink_spec, shrink_text

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ray_session():
    import ray
    from ray import cloudpickle

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    # the checkers below are sent to the workers by value: they need not import this file
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield ray
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    ray.shutdown()


def square_checker(seed: int, i: int) -> dict:
    """A pure item: its value depends only on (seed, i)."""
    return {"status": "ok" if i % 7 else "odd", "value": (seed * 31 + i) ** 2}


def killing_checker(seed: int, i: int) -> dict:
    """Item 5 kills its own process, as a segfault in compiled code would."""
    if i == 5:
        os.kill(os.getpid(), signal.SIGKILL)
    return {"status": "ok", "pid": os.getpid()}


#: counts the set-ups of a process (in its environment: the checker and the
#: initializer travel to the worker as two separate copies of this module's globals)
_RUNS = "TILENEST_TEST_SETUP_RUNS"


def count_setup() -> None:
    os.environ[_RUNS] = str(int(os.environ.get(_RUNS, "0")) + 1)


def setup_checker(seed: int, i: int) -> dict:
    return {"status": "ok", "runs": int(os.environ.get(_RUNS, "0")), "pid": os.getpid()}


def _figures(st) -> dict:  # type: ignore[no-untyped-def]
    """The summary without its timings (which differ from run to run)."""
    return {k: v for k, v in st.summary().items() if k not in ("item_secs", "slowest_secs")}


# ---------------------------------------------------------------------------
# the merged report equals the local campaign's


def _same_on_ray_and_local(tmp_path: Path, targets: str, count: int, seed: int) -> dict:
    c = cluster.make_campaign("fuzz", targets, shrink_secs=0)
    on_ray = cluster.run(c, count, seed, ray=True, shard=4, state=tmp_path / "ray.jsonl")
    local = cluster.run(c, count, seed, workers=2, shard=4)
    assert sorted(on_ray.records) == list(range(count))
    assert {i: (r["status"], r["targets"]) for i, r in on_ray.records.items()} == \
        {i: (r["status"], r["targets"]) for i, r in local.records.items()}
    figs = _figures(on_ray)
    assert figs == _figures(local)
    assert sum(figs["targets"]["llvm"].values()) == count
    assert figs["statuses"].get("ok", 0) >= count * 3 // 4, figs
    # the state file alone gives the same report
    assert _figures(load_state(tmp_path / "ray.jsonl", c.name, seed, count)) == figs
    return figs


def test_fuzz_campaign_on_ray_equals_the_local_pool(ray_session, tmp_path):
    figs = _same_on_ray_and_local(tmp_path, "llvm", 10, 3)
    assert set(figs["targets"]) == {"llvm"}


@pytest.mark.slow
def test_fuzz_campaign_with_a_cuda_slice_on_ray_equals_the_local_pool(ray_session, tmp_path):
    figs = _same_on_ray_and_local(tmp_path, "llvm,cuda:8", 24, 4)
    assert sum(figs["targets"]["cuda"].values()) == 3  # items 0, 8 and 16


def test_text_campaign_on_ray_equals_the_local_run(ray_session):
    c = cluster.make_campaign("text")
    on_ray = cluster.run(c, 120, 5, ray=True, shard=40)
    local = cluster.run(c, 120, 5)
    assert {i: r["status"] for i, r in on_ray.records.items()} == \
        {i: r["status"] for i, r in local.records.items()}
    assert cluster.report(c, on_ray)["readers"] == cluster.report(c, local)["readers"]


# ---------------------------------------------------------------------------
# resuming


def test_stopped_campaign_resumes_without_recomputing(ray_session, tmp_path):
    state = tmp_path / "sq.jsonl"
    whole = run_campaign("sq", square_checker, 30, 4)
    seen: list[int] = []

    def stop_after_six(st, rec):  # type: ignore[no-untyped-def]
        seen.append(rec["i"])
        if len(seen) == 6:
            raise KeyboardInterrupt  # a Ctrl-C in the middle of the campaign

    with pytest.raises(KeyboardInterrupt):
        cluster.run_ray_campaign("sq", square_checker, 30, 4, state=state, shard=3,
                                 progress=stop_after_six)
    first = set(load_state(state, "sq", 4, 30).records)
    assert len(first) >= 6 and len(first) < 30
    again: list[int] = []
    st = cluster.run_ray_campaign("sq", square_checker, 30, 4, state=state, shard=3,
                                  progress=lambda st, rec: again.append(rec["i"]))
    assert sorted(again) == sorted(set(range(30)) - first), "resuming reran finished items"
    assert _figures(st) == _figures(whole)
    assert {i: r["value"] for i, r in st.records.items()} == \
        {i: r["value"] for i, r in whole.records.items()}
    # finished: neither runner runs anything, and both report the same
    none: list[int] = []
    for runner in (cluster.run_ray_campaign, run_campaign):
        st = runner("sq", square_checker, 30, 4, state=state,
                    progress=lambda st, rec: none.append(rec["i"]))
        assert _figures(st) == _figures(whole)
    assert none == []


def test_local_state_is_finished_on_ray(ray_session, tmp_path):
    state = tmp_path / "sq.jsonl"
    run_campaign("sq", square_checker, 9, 2, state=state)
    ran: list[int] = []
    st = cluster.run_ray_campaign("sq", square_checker, 20, 2, state=state,
                                  progress=lambda st, rec: ran.append(rec["i"]))
    assert sorted(ran) == list(range(9, 20))
    assert _figures(st) == _figures(run_campaign("sq", square_checker, 20, 2))
    with pytest.raises(TilenestError, match="seed 2"):  # another seed's state is refused
        cluster.run_ray_campaign("sq", square_checker, 20, 3, state=state)


# ---------------------------------------------------------------------------
# workers


def test_initializer_runs_once_in_each_worker(ray_session):
    st = cluster.run_ray_campaign("setup", setup_checker, 24, 0, shard=2, init=count_setup)
    pids = {r["pid"] for r in st.records.values()}
    assert os.getpid() not in pids and 1 <= len(pids) <= 2
    assert all(r["runs"] == 1 for r in st.records.values()), "set-up ran per item"


def test_a_dying_worker_costs_only_its_own_item(ray_session):
    st = cluster.run_ray_campaign("kill", killing_checker, 12, 0, shard=4)
    assert sorted(st.records) == list(range(12))
    assert st.records[5]["status"] == "crash" and "died" in st.records[5]["message"]
    assert all(r["status"] == "ok" for i, r in st.records.items() if i != 5)
    assert st.summary()["bugs"] == 1


# ---------------------------------------------------------------------------
# a deliberately broken target: found, and shrunk where it was found


def test_injected_bug_is_found_and_shrunk_on_the_worker(ray_session):
    """Programs compiled with a dropped reduction seed mismatch; the worker
    shrinks the failing program to a one-step kernel that still fails only
    under the injected bug."""
    c = cluster.make_campaign("fuzz", mutant="drop_reduce_seed", shrink_secs=30)
    st = cluster.run(c, 4, 5, ray=True, shard=2)
    bad = st.records[1]
    assert bad["status"] == "mismatch" and bad["target"] == "llvm", bad.get("message")
    assert [i for i, r in st.records.items() if r["status"] != "ok"] == [1]
    sh = bad["shrunk"]
    assert sh["pid"] != os.getpid(), "shrunk on the driver, not on the worker"
    assert sh["status"] == "mismatch" and sh["steps"] < sh["from_steps"] and sh["steps"] <= 1
    small = eval(sh["spec"], {"Spec": fuzz.Spec})  # our own record
    assert flat_size(small.steps) == sh["steps"]
    assert fuzz._on_target(small, 2, 5 + 1, "llvm", "drop_reduce_seed").status == "mismatch"
    assert fuzz.check_spec(small, 2, 5 + 1).status == "ok", "the shrunk program fails unmutated"
    rep = cluster.render_report(c, cluster.report(c, st))
    assert "shrunk to" in rep and "@tn.kernel" in rep


# ---------------------------------------------------------------------------
# the shrinkers themselves (no cluster)


def test_spec_shrinker_keeps_only_what_the_failure_needs():
    s = fuzz.Spec("f32", 2, (8, 16), True, True,
                  [("un", "exp"), ("loop", "serial", 3, [("binu", "add"),
                                                         ("red", 1, "add", "fold_left", "sub")]),
                   ("binc", "mul", 3.0), ("mma", True)], storage="f16", sched="v256")

    def has_reduction(c) -> bool:  # type: ignore[no-untyped-def]
        return any(st[0] == "red" for st in fuzz.flat_steps(c.steps))

    out = shrink_spec(s, has_reduction, budget_s=10)
    assert out.stopped == "fixpoint" and out.kept > 0
    assert out.value.steps == [("red", 1, "add", "fold_left", "sub")]
    assert out.value.block == (1, 1) and not out.value.nested and out.value.storage is None
    assert out.value.sched == "default" and not out.value.fill
    assert s.steps[1][0] == "loop", "the original spec was changed in place"


def test_shrinkers_respect_their_budget_and_skip_malformed_candidates():
    s = fuzz.random_spec(99)

    def raises(c) -> bool:  # type: ignore[no-untyped-def]
        raise ValueError("malformed")

    out = shrink_spec(s, raises, budget_s=5)
    assert out.value == s and out.kept == 0 and out.stopped == "fixpoint"
    out = shrink_spec(s, lambda c: True, budget_s=0)
    assert out.stopped == "budget" and out.tries == 0
    text = "\n".join(f"line {k} of noise" for k in range(40)) + "\nthe BAD token\n"
    out = shrink_text(text, lambda t: re.search(r"\bBAD\b", t) is not None)
    assert out.value == "BAD" and out.stopped == "fixpoint", out.value


def test_reader_crash_is_shrunk_to_the_text_that_causes_it(monkeypatch):
    """A reader that crashes on any input naming a dtype: the finding's input
    is shrunk to little more than that name."""
    from tilenest.validation import fuzz_text

    real = fuzz_text.read

    def broken(kind, text):  # type: ignore[no-untyped-def]
        if re.search(r"\bf32\b", text):
            raise KeyError("f32")
        return real(kind, text)

    monkeypatch.setattr(fuzz_text, "read", broken)
    cases = sorted((ROOT / "spec" / "conformance" / "cases").rglob("*.tile"))[:20]
    fuzz_text.init_worker([fuzz_text.Seed(c.name, "text", c.read_text()) for c in cases])
    try:
        rec = next(r for r in (fuzz_text.check_item(3, i, shrink_secs=10) for i in range(40))
                   if r["status"] == "crash")
    finally:
        fuzz_text._SEEDS = None
    sh = rec["shrunk"]
    assert "KeyError" in rec["message"] and sh["chars"] < sh["from_chars"]
    assert re.search(r"\bf32\b", sh["input"]) and len(sh["input"]) <= 8, sh["input"]


def test_target_plans():
    assert fuzz.parse_targets("llvm,cuda:50") == (("llvm", 1), ("cuda", 50))
    assert fuzz.plan_name(fuzz.parse_targets("llvm")) == "fuzz-llvm"  # the fuzz module's name
    assert fuzz.plan_name((("llvm", 1), ("cuda", 5)), 3, "flip_index") == \
        "fuzz-llvm+cuda:5-cases3-mutant:flip_index"
    for bad, why in (("nope", "no fuzz target"), ("cuda:5,llvm", "every program"),
                     ("llvm,cuda:0", "TARGET:K"), ("llvm,llvm", "twice"),
                     ("llvm,cuda:x", "TARGET:K")):
        with pytest.raises(TilenestError, match=why):
            fuzz.parse_targets(bad)
    with pytest.raises(TilenestError, match="no mutant"):
        cluster.make_campaign("fuzz", mutant="nope")
    with pytest.raises(TilenestError, match="no targets"):
        cluster.make_campaign("text", "llvm")


# ---------------------------------------------------------------------------
# the command


def test_campaign_command_on_ray_resumes(ray_session, tmp_path, capsys):
    from tilenest.cli import main

    state = tmp_path / "fz.jsonl"
    argv = ["campaign", "fuzz", "--count", "3", "--seed", "2", "--ray", "--state", str(state),
            "--json"]
    assert main(argv) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["run"]["on"] == "ray" and rep["run"]["new"] == 3 and rep["done"] == 3
    assert rep["bugs"] == 0 and rep["cases_compared"] > 0 and rep["targets"]["llvm"]
    assert main(argv[:-1]) == 0  # resumed: nothing new, the same figures as text
    out = capsys.readouterr().out
    assert "this run: 0 new programs" in out and "3 of 3 programs, 0 bugs" in out
    assert f"statuses: ok {rep['statuses'].get('ok', 0)}" in out


def test_campaign_command_without_ray_says_how_to_get_it(monkeypatch, capsys):
    from tilenest.cli import main

    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    with pytest.raises(NotAvailableError, match="not installed"):
        cluster.connect()
    assert main(["campaign", "fuzz", "--count", "1", "--seed", "0", "--ray"]) == 3
    err = capsys.readouterr().err
    assert "cluster extra" in err and "Traceback" not in err


def test_unreachable_cluster_is_an_error_with_a_hint():
    r = subprocess.run([sys.executable, "-m", "tilenest.cli", "campaign", "fuzz", "--count", "1",
                        "--seed", "0", "--ray", "127.0.0.1:9"], capture_output=True, text=True,
                       timeout=60, cwd=ROOT, check=False)
    assert r.returncode == 1, r.stderr
    assert "cannot connect to the Ray cluster at '127.0.0.1:9'" in r.stderr
    assert "ray start --head" in r.stderr and "Traceback" not in r.stderr
