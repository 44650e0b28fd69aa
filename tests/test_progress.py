"""Progress bars of long commands (tilenest.progress): drawn on stderr only at a
terminal and outside CI, forced by TILENEST_PROGRESS=1; one step per
conformance case and per validation case; machine-read output (--json, JUnit)
never holds a frame."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from tilenest import conformance, progress
from tilenest.validation.validate import validate

ROOT = Path(__file__).resolve().parent.parent
#: a few fast conformance cases (four in the suite)
CASES = ("E01", "E02")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class _Terminal(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.fixture
def clean_env(monkeypatch):
    for v in ("CI", "TILENEST_PROGRESS", "TTY_COMPATIBLE", "FORCE_COLOR"):
        monkeypatch.delenv(v, raising=False)
    return monkeypatch


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("CI", "TILENEST_PROGRESS", "TTY_COMPATIBLE", "FORCE_COLOR")}
    env.update(extra)
    return env


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tilenest.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def _select() -> list[str]:
    return [a for c in CASES for a in ("--case", c)]


# ------------------------------------------------------------------ when it draws
def test_enabled_only_on_a_terminal_outside_ci(clean_env):
    clean_env.setattr(sys, "stderr", io.StringIO())
    assert not progress.enabled()                       # redirected
    clean_env.setattr(sys, "stderr", _Terminal())
    assert progress.enabled()                           # a person at a terminal
    clean_env.setenv("CI", "true")
    assert not progress.enabled()                       # CI, even with a (pseudo-)terminal
    clean_env.setenv("TILENEST_PROGRESS", "1")
    assert progress.enabled()                           # forced on
    clean_env.setenv("TILENEST_PROGRESS", "0")
    clean_env.delenv("CI")
    assert not progress.enabled()                       # switched off at a terminal


def test_bar_is_silent_when_stderr_is_not_a_terminal(clean_env):
    err = io.StringIO()
    clean_env.setattr(sys, "stderr", err)
    with progress.bar("work", 3) as step:
        for i in range(3):
            step(f"item {i}")
    assert err.getvalue() == ""


def test_bar_is_silent_in_ci_even_on_a_terminal(clean_env):
    err = _Terminal()
    clean_env.setattr(sys, "stderr", err)
    clean_env.setenv("CI", "1")
    with progress.bar("work", 2) as step:
        step("a")
        step("b")
    assert err.getvalue() == ""


def test_bar_draws_on_a_terminal(clean_env):
    err = _Terminal()
    clean_env.setattr(sys, "stderr", err)
    clean_env.setenv("TERM", "xterm")
    with progress.bar("work", 3) as step:
        for label in ("a", "b", "c"):
            step(label)
    text = ANSI.sub("", err.getvalue())
    assert "work" in text and "3/3" in text


# ------------------------------------------------------------ one step per unit
@contextmanager
def _counting(monkeypatch):
    """Record every bar opened through tilenest.progress.bar: (description,
    total, labels stepped)."""
    bars: list[tuple[str, int | None, list[str]]] = []
    real = progress.bar

    @contextmanager
    def bar(description, total):
        labels: list[str] = []
        bars.append((description, total, labels))
        with real(description, total) as step:
            def counted(label: str = "", advance: int = 1) -> None:
                labels.append(label)
                step(label, advance)
            yield counted

    monkeypatch.setattr(progress, "bar", bar)
    yield bars


def test_conformance_steps_once_per_case(clean_env):
    cases = conformance.load_suite(None, CASES)
    assert len(cases) >= 2
    with _counting(clean_env) as bars:
        report = conformance.run_suite(cases, conformance.Interpreter())
    assert len(bars) == 1
    desc, total, labels = bars[0]
    assert desc.startswith("conformance") and total == len(cases)
    assert labels == [c.name for c in cases] == [r.case.name for r in report.results]


def test_validate_steps_once_per_case(clean_env):
    from softmax import row_softmax

    with _counting(clean_env) as bars:
        report = validate(row_softmax, "llvm", cases=3, seed=0)
    assert len(bars) == 1
    _, total, labels = bars[0]
    assert total == len(report.results) == len(labels) > 0
    assert labels == [r.label for r in report.results]


# ------------------------------------------------------- the command line, forced
def _frames(stderr: str) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in re.findall(r"(\d+)/(\d+)", ANSI.sub("", stderr))]


def test_conformance_json_stays_json_with_the_bar_forced_on(tmp_path):
    junit = tmp_path / "report.xml"
    # TTY_COMPATIBLE=1 has rich draw into the pipe as it would on a terminal
    r = _cli("conformance", *_select(), "--json", "--junit", str(junit),
             env=_env(TILENEST_PROGRESS="1", TTY_COMPATIBLE="1", TERM="xterm"))
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)                       # no frame on stdout
    n = report["summary"]["cases"]
    frames = _frames(r.stderr)
    assert frames and frames[-1] == (n, n)              # the bar counted every case
    assert all(total == n for _, total in frames)
    assert report["cases"][-1]["name"] in ANSI.sub("", r.stderr)   # labelled by case
    xml = junit.read_text()
    assert "\x1b" not in xml and "━" not in xml


def test_conformance_is_quiet_when_redirected(tmp_path):
    r = _cli("conformance", *_select(), "--json", env=_env(TERM="xterm"))
    assert r.returncode == 0, r.stderr
    json.loads(r.stdout)
    assert r.stderr == ""


def test_validate_json_stays_json_with_the_bar_forced_on():
    r = _cli("validate", "examples/softmax.py", "--cases", "2", "--json",
             env=_env(TILENEST_PROGRESS="1", TTY_COMPATIBLE="1", TERM="xterm"))
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    n = len(out["reports"][0]["cases"])
    frames = _frames(r.stderr)
    assert frames and frames[-1] == (n, n)
