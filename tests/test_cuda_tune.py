"""Choosing a cuda schedule by measurement (``backends/cuda/tune.py``),
judged on the emulated device with a stand-in timer: the fastest legal,
validated candidate is chosen, every other one is reported with why, a
source identical to an earlier one is timed once, and a candidate whose
kernel disagrees with the interpreter is never chosen."""

from __future__ import annotations

import numpy as np
import pytest

import tilenest as tn
from tilenest.backends.cuda import tune as T
from tilenest.errors import NotAvailableError, TilenestError, UsageError
from tilenest.workloads import WORKLOADS


def _softmax():  # type: ignore[no-untyped-def]
    wl = WORKLOADS["softmax"]
    sz = wl.size("small")
    k = wl.kernel(tn.f32, {"rp": 1}, sz)
    return k, tuple(wl.args(sz, tn.f32).values())


def _timer(table):  # type: ignore[no-untyped-def]
    """A timer that runs the kernel once on copies (so a candidate that
    cannot run fails here) and returns ``table(schedule)`` seconds."""
    calls = []

    def timer(ck, arrays):  # type: ignore[no-untyped-def]
        ck(*(a.copy() if isinstance(a, np.ndarray) else a for a in arrays))
        calls.append(ck.schedule)
        return table(ck.schedule)

    timer.calls = calls  # type: ignore[attr-defined]
    return timer


def test_the_fastest_legal_candidate_is_chosen_and_every_one_reported():
    k, args = _softmax()
    before = [a.copy() for a in args]
    timer = _timer(lambda s: 1e-3 * (3 - s.stage_loads - (s.block_threads == 512) * 0.5))
    search = (*T.SEARCH, {"block_threads": 48})
    rep = tn.tune(k, *args, search=search, device="emulated", timer=timer, samples=3, cases=2)
    assert rep.schedule.stage_loads and rep.schedule.block_threads == 512
    assert rep.trials[rep.best].seconds == pytest.approx(1.5e-3)
    bad = rep.trials[-1]
    assert bad.status == "illegal" and "block_threads" in bad.reason
    assert rep.speedup(0) == pytest.approx(2.0)
    table = rep.table()
    assert table.count("\n* ") == 1 and "illegal" in table
    for a, b in zip(args, before):
        assert np.array_equal(a, b, equal_nan=True)  # the arguments were not written
    # the chosen kernel is the compiled candidate, and it validates
    assert tn.validate(k, "cuda", compiled=rep.compiled, cases=2).ok


def test_a_source_identical_to_an_earlier_one_is_timed_once():
    """An elementwise kernel reads no tile twice: staging changes nothing in
    its source, so that candidate is the default's."""
    wl = WORKLOADS["add"]
    k = wl.kernel(tn.f32, dict(wl.schedules[0]), wl.size("small"))
    args = tuple(wl.args(wl.size("small"), tn.f32).values())
    timer = _timer(lambda s: 1e-3)
    rep = T.tune(k, *args, search=({}, {"stage_loads": True}), device="emulated",
                 timer=timer, samples=2, cases=1)
    assert [t.status for t in rep.trials] == ["timed", "same"]
    assert rep.trials[1].same_as == 0 and rep.speedup(1) == 1.0
    assert len(timer.calls) == 2  # two samples of the one distinct candidate


def test_kernels_that_differ_only_in_prelude_calls_are_both_timed():
    """L2 policies change a row sum's store from ``tn_vstore`` to
    ``tn_vstore_stream``: two prelude functions, not generated names, so the
    two sources are different programs and both are timed."""
    wl = WORKLOADS["row_sum"]
    k = wl.kernel(tn.f32, dict(wl.schedules[0]), wl.size("small"))
    args = tuple(wl.args(wl.size("small"), tn.f32).values())
    rep = T.tune(k, *args, search=({"cache_hints": False}, {"cache_hints": True}),
                 device="emulated",
                 timer=_timer(lambda s: 1e-3 if s.cache_hints else 1e-2), samples=1, cases=1)
    assert "tn_vstore_stream" in rep.trials[1].compiled.source.text
    assert [t.status for t in rep.trials] == ["timed", "timed"]
    assert rep.best == 1


def test_a_candidate_that_disagrees_with_the_interpreter_is_never_chosen(monkeypatch):
    """The 512-thread candidate is made wrong (its outputs nudged after each
    run): validation reports it invalid and the tuner takes the next."""
    from tilenest.backends import cuda

    real = cuda.compile_program

    class Wrong:
        def __init__(self, ck):  # type: ignore[no-untyped-def]
            self.ck = ck

        def __getattr__(self, n):  # type: ignore[no-untyped-def]
            return getattr(self.ck, n)

        def __call__(self, *a, **kw):  # type: ignore[no-untyped-def]
            out = self.ck(*a, **kw)
            out += 1.0
            return out

    def compile_program(program, schedule=None, **kw):  # type: ignore[no-untyped-def]
        ck = real(program, schedule, **kw)
        return Wrong(ck) if schedule.block_threads == 512 else ck

    monkeypatch.setattr(cuda, "compile_program", compile_program)
    k, args = _softmax()
    rep = T.tune(k, *args, search=({"block_threads": 512}, {}), device="emulated",
                 timer=_timer(lambda s: 1e-3 if s.block_threads == 512 else 2e-3),
                 samples=1, cases=2)
    assert rep.trials[0].status == "invalid" and rep.trials[0].reason
    assert rep.best == 1


def test_no_timed_candidate_is_an_error_naming_each():
    k, args = _softmax()
    with pytest.raises(TilenestError) as e:
        T.tune(k, *args, search=({"block_threads": 48},), device="emulated",
               timer=_timer(lambda s: 1e-3))
    assert "block_threads=48: illegal" in e.value.hint


def test_a_call_the_signature_refuses_is_an_error_before_compiling(monkeypatch):
    from tilenest.backends import cuda

    def no_compile(*a, **kw):  # type: ignore[no-untyped-def]
        raise AssertionError("compiled a candidate for a call that cannot bind")

    monkeypatch.setattr(cuda, "compile_program", no_compile)
    k, args = _softmax()
    with pytest.raises(TilenestError) as e:
        T.tune(k, args[0][:, :3], *args[1:], device="emulated", timer=lambda c, a: 1.0)
    assert "extent C is 3 elsewhere but 'mask' has 13" in e.value.message


def test_only_cuda_is_tuned():
    k, args = _softmax()
    with pytest.raises(NotAvailableError):
        tn.tune(k, *args, target="llvm")


@pytest.mark.parametrize("kw,what", [
    ({"search": ({"block_thread": 512},)}, "'block_thread' is not a Schedule field"),
    ({"search": ()}, "empty search"),
    ({"samples": 0}, "samples >= 1"),
    ({"timer": None}, "needs a timer"),
    ({"search": ({"block_threads": "512"},)}, "takes int or None, got '512'"),
    ({"search": ({"stage_loads": 1},)}, "takes bool, got 1"),
    ({"search": ({"threads": 4},)}, "not used by the cuda target"),
    ({"device": "tpu"}, "unknown device"),
])
def test_bad_arguments_are_usage_errors(kw, what):
    k, args = _softmax()
    kw = {"device": "emulated", "timer": lambda c, a: 1.0, **kw}
    with pytest.raises(UsageError) as e:
        T.tune(k, *args, **kw)
    assert what in e.value.message


def test_a_recorded_tuning_is_returned_without_timing(tmp_path, monkeypatch):
    """``record=True`` keeps the outcome on disk: the same tuning again (any
    process) times nothing and compiles only the chosen candidate; other
    sizes are tuned afresh; without ``record`` everything is timed again."""
    monkeypatch.setenv("TILENEST_CACHE_DIR", str(tmp_path))
    k, args = _softmax()
    search = ({}, {"stage_loads": True}, {"block_threads": 48})
    table = lambda s: 1e-3 * (2 - s.stage_loads)  # noqa: E731
    first = _timer(table)
    a = T.tune(k, *args, search=search, device="emulated", timer=first, samples=2, cases=1,
               record=True)
    assert len(first.calls) == 4 and not a.recorded
    again = _timer(table)
    b = T.tune(k, *args, search=search, device="emulated", timer=again, samples=2, cases=1,
               record=True)
    assert again.calls == [] and b.recorded and "(recorded " in b.table()
    assert b.best == a.best == 1 and b.schedule.stage_loads
    assert [t.status for t in b.trials] == [t.status for t in a.trials]
    assert b.trials[1].seconds == a.trials[1].seconds and b.trials[2].reason == a.trials[2].reason
    assert tn.validate(k, "cuda", compiled=b.compiled, cases=1).ok
    # another size is another record
    wl = WORKLOADS["softmax"]
    other = tuple(wl.args({"R": 4, "C": 17}, tn.f32).values())
    fresh = _timer(table)
    T.tune(k, *other, search=search, device="emulated", timer=fresh, samples=1, cases=1,
           record=True)
    assert len(fresh.calls) == 2
    # without record=True the tuning is measured again
    plain = _timer(table)
    T.tune(k, *args, search=search, device="emulated", timer=plain, samples=1, cases=1)
    assert len(plain.calls) == 2


def test_a_record_of_another_search_is_not_used(tmp_path, monkeypatch):
    """The search is part of the key; and a record whose rows do not match
    the search it is read for (an entry of another format) is discarded."""
    monkeypatch.setenv("TILENEST_CACHE_DIR", str(tmp_path))
    k, args = _softmax()
    T.tune(k, *args, search=({}, {"stage_loads": True}), device="emulated",
           timer=_timer(lambda s: 1e-3), samples=1, cases=1, record=True)
    t = _timer(lambda s: 1e-3)
    T.tune(k, *args, search=({"stage_loads": True}, {}), device="emulated", timer=t,
           samples=1, cases=1, record=True)
    assert len(t.calls) == 2
    # corrupt every record's rows: the next read discards it and re-times
    for key in [p.stem for p in (tmp_path / "tune").glob("*.tnc")]:
        T._RECORDS.put(key, {"trials": [{"overrides": {"x": 1}}], "best": 0}, {})
    t2 = _timer(lambda s: 1e-3)
    rep = T.tune(k, *args, search=({}, {"stage_loads": True}), device="emulated", timer=t2,
                 samples=1, cases=1, record=True)
    assert len(t2.calls) == 2 and not rep.recorded
