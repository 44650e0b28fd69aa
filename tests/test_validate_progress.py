"""Progress of long interpreter runs inside ``validate``: a reduce region that
runs long shows a row of its own under the validation bar (one display, not
two fighting over a line) at a terminal, predicted from its first iterations
when it has fewer than ``PROGRESS_MIN`` of them; CI logs and redirected
stderr get nothing."""

from __future__ import annotations

import io
import re
import sys
from contextlib import contextmanager

import numpy as np
import pytest

import tilenest as tn
from tilenest import f32, progress
from tilenest.interpreter import core

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@tn.kernel
def total_of_rows(x: tn.Tensor[f32, "N C"], total: tn.Tensor[f32, "1"]):  # noqa: F821
    """The sum of every element, one row per iteration of a reduce region
    (each row's own sum is a nested reduce, so the iterations run one by one)."""
    n, c = x.shape
    r, e = x.dims()
    total = total.with_dims(r)
    s = tn.zeros(f32, tn.shape(1), dims=(r,))
    for i in tn.reduce(tn.shape(n), contract=tn.add):
        row = x[tn.coord(i.index(), 0), tn.shape(1, c)]
        s = s + tn.reduce(row, e, tn.add)
    total(tn.coord(0), tn.shape(1)).store(s)


class _Terminal(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.fixture
def terminal(monkeypatch):
    """Installs (in the test's body: pytest's capture replaces stderr after
    fixtures run) a stderr that is a terminal, outside CI; returns it."""
    for v in ("CI", "TILENEST_PROGRESS", "TTY_COMPATIBLE", "FORCE_COLOR"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("TERM", "xterm")

    def install() -> _Terminal:
        err = _Terminal()
        monkeypatch.setattr(sys, "stderr", err)
        return err

    return install


def _inputs(n: int) -> list:
    return [[np.ones((n, 3), np.float32), np.zeros(1, np.float32)]]


def _lines(err: io.StringIO) -> list[str]:
    return ANSI.sub("", err.getvalue()).replace("\r", "\n").split("\n")


def test_a_long_reduce_shows_a_row_under_the_validation_bar(terminal, monkeypatch):
    err = terminal()
    monkeypatch.setattr(core, "PROGRESS_AFTER", 0.0)
    monkeypatch.setattr(core, "PROGRESS_PROBE", 0.0)
    rep = tn.validate(total_of_rows, inputs=_inputs(40))
    assert rep.ok, rep.summary()
    lines = _lines(err)
    rows = [i for i, s in enumerate(lines) if s.startswith("  interpreting reduce at "
                                                           "test_validate_progress.py:")]
    assert rows, lines
    # drawn as a second row of the validation display
    assert all(lines[i - 1].startswith("validate total_of_rows (llvm)") for i in rows), lines
    assert any("each contribution" in lines[i] for i in rows), lines  # the oracle's pass too


def test_nothing_is_drawn_in_ci_or_when_redirected(terminal, monkeypatch):
    err = terminal()
    monkeypatch.setattr(core, "PROGRESS_AFTER", 0.0)
    monkeypatch.setattr(core, "PROGRESS_PROBE", 0.0)
    monkeypatch.setenv("CI", "true")
    assert tn.validate(total_of_rows, inputs=_inputs(40)).ok
    assert err.getvalue() == ""
    monkeypatch.delenv("CI")
    redirected = io.StringIO()
    monkeypatch.setattr(sys, "stderr", redirected)
    assert tn.validate(total_of_rows, inputs=_inputs(40)).ok
    assert redirected.getvalue() == ""


@contextmanager
def _bars(monkeypatch):
    """Every bar opened through tilenest.progress.bar: [description, total,
    units advanced]."""
    bars: list[list] = []

    @contextmanager
    def bar(description, total):
        rec = [description, total, 0]
        bars.append(rec)

        def step(label: str = "", advance: int = 1) -> None:
            rec[2] += advance

        yield step

    monkeypatch.setattr(progress, "bar", bar)
    yield bars


def test_a_slow_region_is_predicted_from_its_first_iterations(terminal, monkeypatch):
    """A 300-iteration region whose iterations take 10 ms each (a clock that
    advances so) is predicted at 3 s: its bar opens part way, counting the
    iterations already done; at 1 ms each (0.3 s) no bar opens."""
    terminal()
    for per, shown in ((0.010, True), (0.001, False)):
        clock = iter(np.arange(0.0, 10.0, per))
        monkeypatch.setattr(core, "_now", lambda: float(next(clock)))
        with _bars(monkeypatch) as bars:
            tn.interpret(total_of_rows, *_inputs(300)[0])
        mine = [b for b in bars if b[0].startswith("interpreting reduce")]
        if shown:
            (b,) = mine
            assert b[1] == 300 and b[2] == 300, b
        else:
            assert mine == [], bars
