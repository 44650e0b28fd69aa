"""Run the device test suite under NVIDIA's ``compute-sanitizer``, sharded.

    python tests/device_sanitizer.py [--tools memcheck,racecheck,synccheck]
        [--workers N] [--chunk K] [--deadline SECONDS] [--timeout SECONDS]
        [--log-dir DIR] [-k EXPR] [--slow] [PATH ...]

Every test marked ``device`` under the given paths (default ``tests``, the
whole device suite; ``--slow`` adds the exhaustive ``slow`` ones), except
the ``metal`` ones (no CUDA process to follow), runs under each tool. A sanitizer
slows every kernel by one to three orders of magnitude and instruments
every module a process loads, so the tests are cut into chunks of ``--chunk``
test ids and each (tool, chunk) pair is one process,
``compute-sanitizer --tool T python -m pytest -p no:xdist IDS`` (the
sanitizer follows one process; an ``xdist`` worker it would not see), with
``--workers`` of them at a time sharing the GPU. The slowest tool's chunks
go first.

A chunk counts as checked only when its pytest run finished and the
sanitizer printed its summary; a chunk past ``--timeout`` is killed with
every process it started; the report gives, per tool, the tests run
and passed, the errors (memcheck, synccheck) or hazards (racecheck) found,
and every chunk that failed, timed out or was never started because the
``--deadline`` came first. The exit status is 0 only when every test of every
tool ran, passed and was reported clean.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUITE = ("tests",)
TOOLS = ("racecheck", "memcheck", "synccheck")  # slowest first

#: the sanitizer's closing line: ``ERROR SUMMARY: 3 errors`` (memcheck,
#: synccheck) or ``RACECHECK SUMMARY: 2 hazards displayed (1 error, 1 warning)``
_SUMMARY = re.compile(r"(?:ERROR SUMMARY: (\d+) errors?|RACECHECK SUMMARY: (\d+) hazards?)")
_PYTEST_COUNTS = re.compile(r"(\d+) (passed|failed|error|errors|skipped|deselected)")


@dataclass
class Chunk:
    """One sanitizer process: ``tool`` over the test ids ``ids``."""

    tool: str
    index: int
    ids: list[str]
    #: clean | findings | failed | incomplete (...) | timed out | no summary | not started
    status: str = "not started"
    passed: int = 0
    failed: int = 0
    findings: int = 0
    seconds: float = 0.0
    log: Path | None = None
    notes: list[str] = field(default_factory=list)


def collect(paths: list[str], kexpr: str | None, slow: bool) -> list[str]:
    """The ids of the CUDA device tests under ``paths`` (no GPU is needed
    to collect them)."""
    # Metal kernels are no CUDA process for compute-sanitizer to follow
    marker = "device and not metal" + ("" if slow else " and not slow")
    cmd = [sys.executable, "-m", "pytest", *paths, "-m", marker, "--collect-only", "-q",
           "-o", "addopts=", "-p", "no:xdist", "-p", "no:cacheprovider"]
    if kexpr:
        cmd += ["-k", kexpr]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    ids = [ln.strip() for ln in out.stdout.splitlines() if "::" in ln]
    if out.returncode not in (0, 5) or not ids:
        sys.exit(f"tilenest: collecting {' '.join(paths)} failed (exit {out.returncode}):\n"
                 f"{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return ids


def chunks(ids: list[str], size: int, tools: list[str]) -> list[Chunk]:
    """(tool, chunk) pairs: a test that runs a whole suite (conformance) on
    its own, the rest ``size`` at a time; every tool gets the same chunks."""
    heavy = [i for i in ids if "conformance" in i]
    rest = [i for i in ids if i not in heavy]
    groups = [[i] for i in heavy] + [rest[j:j + size] for j in range(0, len(rest), size)]
    return [Chunk(t, n, g) for t in tools for n, g in enumerate(groups)]


def run_chunk(c: Chunk, log_dir: Path, timeout: float, deadline: float) -> Chunk:
    """Run one chunk under its tool (unless the deadline has passed) and read
    the outcome from its log. A chunk past ``timeout`` is killed with every
    process it started (its own session)."""
    if time.monotonic() > deadline:
        return c
    c.log = log_dir / f"{c.tool}_{c.index:03d}.log"
    cmd = ["compute-sanitizer", "--tool", c.tool, "--target-processes", "all",
           sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider",
           "-o", "addopts=", "-m", "device", "-rfE", *c.ids]
    t0 = time.monotonic()
    with open(c.log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = None
    c.seconds = time.monotonic() - t0
    text = c.log.read_text(errors="replace")
    summaries = [int(a or b) for a, b in _SUMMARY.findall(text)]
    # pytest's closing line, e.g. ``==== 3 passed, 1 failed in 12.0s ====``
    tail = [ln for ln in text.splitlines() if " in " in ln and _PYTEST_COUNTS.search(ln)]
    counts = {k: int(n) for n, k in _PYTEST_COUNTS.findall(tail[-1])} if tail else {}
    c.passed = counts.get("passed", 0)
    c.failed = counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)
    c.findings = sum(summaries)
    if rc is None:
        c.status = "timed out"
    elif not summaries:
        c.status = "no summary"
    elif c.failed:
        c.status = "failed"
    elif c.passed != len(c.ids):
        c.status = f"incomplete ({c.passed} of {len(c.ids)} passed)"
    else:
        c.status = "findings" if c.findings else "clean"
    return c


def report(cs: list[Chunk], tools: list[str], n_ids: int) -> bool:
    """Print the per-tool table and every chunk that is not clean; True
    when all is clean."""
    ok = True
    print(f"{'tool':<10} {'tests':>6} {'passed':>7} {'failed':>7} {'findings':>9} "
          f"{'unchecked':>10} {'seconds':>8}")
    for t in tools:
        mine = [c for c in cs if c.tool == t]
        done = [c for c in mine if c.status in ("clean", "findings", "failed")
                or c.status.startswith("incomplete")]
        unchecked = sum(len(c.ids) for c in mine if c not in done)
        row = (sum(c.passed for c in mine), sum(c.failed for c in mine),
               sum(c.findings for c in mine), unchecked)
        ok &= row[1] == 0 and row[2] == 0 and unchecked == 0 and all(
            c.status == "clean" for c in mine)
        print(f"{t:<10} {n_ids:>6} {row[0]:>7} {row[1]:>7} {row[2]:>9} {row[3]:>10} "
              f"{sum(c.seconds for c in mine):>8.0f}")
    for c in cs:
        if c.status != "clean":
            print(f"  {c.tool} chunk {c.index}: {c.status} ({c.log or 'no log'}): "
                  f"{', '.join(i.split('::')[-1] for i in c.ids)}")
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tools", default=",".join(TOOLS),
                    help="comma-separated compute-sanitizer tools (default: all three)")
    ap.add_argument("--workers", type=int, default=max(1, min(16, (os.cpu_count() or 2) - 2)),
                    help="sanitizer processes at a time, all on the one GPU")
    ap.add_argument("--chunk", type=int, default=4, help="test ids per process")
    ap.add_argument("--deadline", type=float, default=3600.0,
                    help="start no chunk after this many seconds (running ones finish)")
    ap.add_argument("--timeout", type=float, default=900.0, help="limit per chunk, seconds")
    ap.add_argument("--log-dir", type=Path, default=Path("sanitizer-logs"))
    ap.add_argument("-k", dest="kexpr", help="pytest -k expression selecting tests")
    ap.add_argument("--slow", action="store_true", help="include the slow exhaustive tests")
    ap.add_argument("paths", nargs="*", default=list(SUITE),
                    help="test files or folders (default: tests, the whole device suite)")
    a = ap.parse_args(argv)
    tools = [t for t in a.tools.split(",") if t]
    bad = [t for t in tools if t not in TOOLS]
    if bad:
        ap.error(f"unknown tool {bad[0]!r}; choose from {', '.join(TOOLS)}")
    if shutil.which("compute-sanitizer") is None:
        print("tilenest: compute-sanitizer is not on PATH (it comes with the CUDA toolkit)",
              file=sys.stderr)
        return 2
    ids = collect(a.paths, a.kexpr, a.slow)
    a.log_dir.mkdir(parents=True, exist_ok=True)
    work = sorted(chunks(ids, a.chunk, tools), key=lambda c: TOOLS.index(c.tool))
    deadline = time.monotonic() + a.deadline
    print(f"{len(ids)} tests x {len(tools)} tools in {len(work)} processes, "
          f"{a.workers} at a time", flush=True)
    with ThreadPoolExecutor(a.workers) as ex:
        done = list(ex.map(lambda c: run_chunk(c, a.log_dir, a.timeout, deadline), work))
    return 0 if report(done, tools, len(ids)) else 1


if __name__ == "__main__":
    sys.exit(main())
