"""The device-suite sanitizer driver (``tests/device_sanitizer.py``) judged
without a GPU: a stand-in ``compute-sanitizer`` on ``PATH`` prints what the
real one prints (pytest's closing line, then the tool's summary), and the
driver must count a chunk as clean only when both say so."""

from __future__ import annotations

import importlib.util
import os
import stat
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: a stand-in for compute-sanitizer: ``--tool T`` then the command; it prints
#: a pytest closing line for the test ids given and the tool's summary, with
#: the findings, failures or missing summary that FAKE_SANITIZER asks for
FAKE = r'''#!PYTHON
import os, sys
args = sys.argv[1:]
tool = args[args.index("--tool") + 1]
ids = [a for a in args if "::" in a]
mode = os.environ.get("FAKE_SANITIZER", "clean")
hit = mode.startswith(tool + ":") and any(mode.split(":", 1)[1] in i for i in ids)
kind = os.environ.get("FAKE_KIND", "")
if hit and kind == "hang":  # a test process that never ends, started by the sanitizer
    import subprocess, time
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    time.sleep(60)
failed = 1 if (hit and kind == "fail") else 0
skipped = 1 if (hit and kind == "skip") else 0
print("========= COMPUTE-SANITIZER")
print(f"==== {len(ids) - failed - skipped} passed" + (f", {failed} failed" if failed else "")
      + (f", {skipped} skipped" if skipped else "") + " in 0.1s ====")
if hit and kind == "nosummary":
    sys.exit(1)
n = 2 if (hit and kind == "finding") else 0
if tool == "racecheck":
    print(f"========= RACECHECK SUMMARY: {n} hazards displayed ({n} errors, 0 warnings)")
else:
    print(f"========= ERROR SUMMARY: {n} errors")
sys.exit(1 if n or failed else 0)
'''


@pytest.fixture(scope="module")
def driver():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("device_sanitizer",
                                                  ROOT / "tests" / "device_sanitizer.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


#: the device tests the driver runs here: the CUDA examples' (collecting one
#: file takes a fraction of the whole suite's collection, which every run of
#: the driver does first)
PATHS = ["tests/test_cuda_device.py"]


@pytest.fixture(scope="module")
def n_examples(driver):  # type: ignore[no-untyped-def]
    """How many device tests ``-k example`` selects in :data:`PATHS` (one
    per example file)."""
    return len(driver.collect(PATHS, "example", False))


@pytest.fixture
def fake(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "compute-sanitizer"
    exe.write_text(FAKE.replace("PYTHON", sys.executable, 1))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return tmp_path


def _run(driver, fake, capsys, *extra):  # type: ignore[no-untyped-def]
    rc = driver.main(["-k", "example", "--workers", "3", "--chunk", "3",
                      "--log-dir", str(fake / "logs"), *extra, *PATHS])
    return rc, capsys.readouterr().out


def test_every_chunk_clean_exits_zero(driver, fake, capsys, monkeypatch, n_examples):
    monkeypatch.setenv("FAKE_SANITIZER", "clean")
    rc, out = _run(driver, fake, capsys)
    assert rc == 0, out
    n = n_examples
    assert n >= 3
    for tool in ("memcheck", "racecheck", "synccheck"):
        row = next(ln.split() for ln in out.splitlines() if ln.startswith(tool))
        assert row[1:6] == [str(n), str(n), "0", "0", "0"], out


@pytest.mark.parametrize("kind,status", [("finding", "findings"), ("nosummary", "no summary"),
                                         ("fail", "failed"), ("skip", "incomplete"),
                                         ("hang", "timed out")])
def test_a_finding_a_lost_summary_or_a_failed_test_fails_the_run(driver, fake, capsys,
                                                                 monkeypatch, kind, status):
    monkeypatch.setenv("FAKE_SANITIZER", "racecheck:gemm")
    monkeypatch.setenv("FAKE_KIND", kind)
    t0 = time.monotonic()
    rc, out = _run(driver, fake, capsys, "--timeout", "5")
    assert time.monotonic() - t0 < 40  # a hung chunk is killed at its timeout
    assert rc == 1, out
    bad = [ln for ln in out.splitlines() if ln.startswith("  racecheck chunk")]
    assert bad and all(f": {status}" in ln for ln in bad) and "gemm" in bad[0], out
    assert not any(ln.startswith("  memcheck") for ln in out.splitlines()), out


def test_chunks_never_started_are_reported_unchecked(driver, fake, capsys, monkeypatch,
                                                      n_examples):
    monkeypatch.setenv("FAKE_SANITIZER", "clean")
    rc, out = _run(driver, fake, capsys, "--deadline", "0", "--tools", "memcheck")
    n = n_examples
    assert rc == 1
    row = next(ln.split() for ln in out.splitlines() if ln.startswith("memcheck"))
    assert row[1:6] == [str(n), "0", "0", "0", str(n)], out
    assert "not started" in out


def test_unknown_tool_is_a_usage_error(driver, fake, capsys):
    with pytest.raises(SystemExit) as e:
        driver.main(["--tools", "initcheck"])
    assert e.value.code == 2
    assert "unknown tool 'initcheck'" in capsys.readouterr().err
