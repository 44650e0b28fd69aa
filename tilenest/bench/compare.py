"""``tilenest bench --compare FILE``: this run's ratios against those recorded
in ``FILE`` (what ``tilenest bench --json`` or ``--save`` wrote).

A ratio is baseline time / tilenest time, both measured in one run, so it
carries over between runs far better than a time does: a slower machine slows
the baseline too. Rows are matched by their identity (:func:`row_key`): the
benchmark's name, its problem shape and its thread count. For every baseline
a row has in both runs, the *change* is ``now / recorded``; the row
*regressed* when some change is below ``1 - max_drop`` (by default: a ratio
fell by more than 25%), and *improved* when every change is above
``1 / (1 - max_drop)``. Rows only in the run, only in ``FILE``, or failed in
the run are reported, never dropped; a row whose samples in this run spread
wider than ``max_drop`` gets a note (its change may be noise). Differences
between the two runs' machines or software (CPU, core count, versions, size,
samples) are warnings: they do not stop the comparison but explain a change.

:func:`compare` is a pure function of the two documents; :func:`load` reads
and checks a file; :func:`table` and :func:`summary` render the result.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import TilenestError

#: a ratio that fell by more than this fraction is a regression
MAX_DROP = 0.25
#: the exit status of ``tilenest bench --compare`` when a row regressed
EXIT_REGRESSED = 4
#: environment entries whose difference is worth a warning
_ENV_KEYS = ("cpu", "cpus", "vector_bits", "machine", "python", "numpy", "torch", "llvmlite", "tilenest")


def row_key(row: dict[str, Any]) -> str:
    """A row's identity: name, shape (the label when a suite has none) and
    thread count, e.g. ``gemm 1024x1024x1024 @2``."""
    shape = row.get("shape", row.get("workload", ""))
    threads = row.get("threads")
    return f"{row['name']} {shape}" + (f" @{threads}" if threads is not None else "")


@dataclass(frozen=True)
class Change:
    """One baseline's ratio of one row: as recorded, now, and ``now / recorded``."""

    baseline: str
    recorded: float
    now: float

    @property
    def change(self) -> float:
        return self.now / self.recorded if self.recorded > 0 else float("inf")


@dataclass(frozen=True)
class RowResult:
    """The verdict on one row present in the run: ``status`` is ``regressed``,
    ``improved``, ``same``, ``error`` (failed in this run), ``new`` (not in
    the file, or failed when recorded) or ``incomparable`` (no baseline in
    common); ``notes`` say what else differs (a baseline measured only once)."""

    key: str
    workload: str
    status: str
    changes: tuple[Change, ...] = ()
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Comparison:
    """The whole comparison: one result per row of the run, the rows of the
    file that this run did not produce, and warnings about the two runs."""

    rows: tuple[RowResult, ...]
    not_run: tuple[str, ...]
    warnings: tuple[str, ...]
    max_drop: float = MAX_DROP
    baselines: tuple[str, ...] = field(default=())

    @property
    def regressed(self) -> tuple[RowResult, ...]:
        return tuple(r for r in self.rows if r.status == "regressed")

    def to_json(self) -> dict[str, Any]:
        """The comparison as plain data (the ``comparison`` entry of ``--json``)."""
        return {"max_drop": self.max_drop, "warnings": list(self.warnings),
                "not_run": list(self.not_run),
                "regressed": [r.key for r in self.regressed],
                "rows": [{"key": r.key, "workload": r.workload, "status": r.status,
                          "notes": list(r.notes),
                          "ratios": {c.baseline: {"recorded": c.recorded, "now": c.now,
                                                  "change": c.change} for c in r.changes}}
                         for r in self.rows]}


def _verdict(changes: list[Change], max_drop: float) -> str:
    if not changes:
        return "incomparable"
    if any(c.change < 1 - max_drop for c in changes):
        return "regressed"
    if all(c.change > 1 / (1 - max_drop) for c in changes):
        return "improved"
    return "same"


def _warnings(recorded: dict[str, Any], run: dict[str, Any]) -> list[str]:
    """What differs between the two runs' setups, one sentence each."""
    out = []
    for key in ("size", "samples", "target"):
        a, b = recorded.get(key), run.get(key)
        if a is not None and b is not None and a != b:
            out.append(f"{key} differs: recorded {a}, now {b}")
    ea, eb = recorded.get("environment", {}), run.get("environment", {})
    for key in _ENV_KEYS:
        a, b = ea.get(key), eb.get(key)
        if a != b and (a is not None or b is not None):
            what = ("the machine" if key in ("cpu", "cpus", "vector_bits", "machine")
                    else "the software")
            out.append(f"{what} differs: {key} recorded {a}, now {b}")
    return out


def _spread(row: dict[str, Any]) -> float:
    """The largest spread of the row's timings in this run (0 when it has none)."""
    timings = [row.get("tilenest"), *row.get("baselines", {}).values()]
    return max((t.get("spread", 0.0) for t in timings if isinstance(t, dict)), default=0.0)


def compare(recorded: dict[str, Any], run: dict[str, Any],
            max_drop: float = MAX_DROP) -> Comparison:
    """Compare the run's rows with the recorded ones (both documents in the
    ``--json`` form); pure, no timing."""
    if not 0 < max_drop < 1:
        raise ValueError("max_drop is a fraction between 0 and 1")
    old = {row_key(r): r for r in recorded.get("benchmarks", [])}
    results: list[RowResult] = []
    seen: set[str] = set()
    for r in run.get("benchmarks", []):
        key = row_key(r)
        seen.add(key)
        was = old.get(key)
        if "error" in r:
            results.append(RowResult(key, r["workload"], "error", notes=(r["error"],)))
            continue
        if was is None:
            results.append(RowResult(key, r["workload"], "new", notes=("not in the file",)))
            continue
        if "error" in was:
            results.append(RowResult(key, r["workload"], "new",
                                     notes=("it failed when the file was recorded",)))
            continue
        now_r, old_r = r.get("ratios", {}), was.get("ratios", {})
        changes = [Change(b, float(old_r[b]), float(now_r[b]))
                   for b in now_r if b in old_r]
        notes = [f"{b}: only measured now" for b in now_r if b not in old_r]
        notes += [f"{b}: only in the file" for b in old_r if b not in now_r]
        spread = _spread(r)
        if spread > max_drop:
            notes.append(f"noisy: samples spread {spread:.0%}")
        results.append(RowResult(key, r["workload"], _verdict(changes, max_drop),
                                 tuple(changes), tuple(notes)))
    not_run = tuple(k for k in old if k not in seen)
    names = {c.baseline for res in results for c in res.changes}
    ordered = tuple(sorted(names, key=lambda b: (b != "numpy", b)))
    return Comparison(tuple(results), not_run, tuple(_warnings(recorded, run)), max_drop,
                      ordered)


def load(path: str | Path, suite: str) -> dict[str, Any]:
    """The document in ``path``, checked to be a ``tilenest bench --json``
    output of ``suite``; a missing or malformed file is a TilenestError."""
    from . import SCHEMA

    hint = ("FILE is what 'tilenest bench --json > FILE' or 'tilenest bench --save FILE' "
            "wrote")
    from ..userfiles import read_bytes

    data = read_bytes(path, "benchmark record", hint)  # a regular file, of bounded size
    try:
        doc = json.loads(data.decode("utf-8", errors="replace"))
    except json.JSONDecodeError as e:
        raise TilenestError(f"{path} is not JSON: {e.msg} (line {e.lineno}, column "
                            f"{e.colno})", hint=hint) from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA \
            or not isinstance(doc.get("benchmarks"), list):
        found = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise TilenestError(f"{path} is not a benchmark record of schema {SCHEMA} "
                            f"(found {found!r})", hint=hint)
    if doc.get("suite") != suite:
        raise TilenestError(f"{path} records the {doc.get('suite')} suite, this run is the "
                            f"{suite} suite", hint=f"pass --suite {doc.get('suite')}")
    bad = [i for i, r in enumerate(doc["benchmarks"])
           if not isinstance(r, dict) or "name" not in r
           or ("error" not in r and not isinstance(r.get("ratios"), dict))]
    if bad:
        raise TilenestError(f"{path}: benchmark row {bad[0]} has no name or no ratios",
                            hint=hint)
    return doc


_MARK = {"regressed": "[bold red]REGRESSED[/bold red]", "improved": "[green]improved[/green]",
         "same": "ok", "error": "[bold red]error[/bold red]", "new": "[yellow]new[/yellow]",
         "incomparable": "[yellow]no common baseline[/yellow]"}


def table(cmp: Comparison, path: str) -> Any:
    """A rich Table: per row and baseline the ratio now, as recorded, and the
    change; a status column marks the regressions."""
    from rich.table import Table

    t = Table(title=f"ratios now vs {path} (a drop of more than {cmp.max_drop:.0%} is a "
                    "regression; @N: N threads)")
    t.add_column("benchmark", no_wrap=True)
    for b in cmp.baselines:
        for c in (f"{b} now", f"{b} recorded", "change"):
            t.add_column(c, justify="right", no_wrap=True)
    t.add_column("status", no_wrap=True)
    t.add_column("notes")
    for r in cmp.rows:
        by = {c.baseline: c for c in r.changes}
        cells = [r.key]
        for b in cmp.baselines:
            c = by.get(b)
            if c is None:
                cells += ["-", "-", ""]
                continue
            pct = f"{c.change - 1:+.0%}"
            if c.change < 1 - cmp.max_drop:
                pct = f"[bold red]{pct}[/bold red]"
            cells += [f"{c.now:.2f}x", f"{c.recorded:.2f}x", pct]
        cells += [_MARK[r.status], "; ".join(n[:60] for n in r.notes)]
        t.add_row(*cells)
    return t


def summary(cmp: Comparison, path: str) -> list[str]:
    """The lines printed under the table: warnings, rows not run, and the verdict."""
    lines = [f"warning: {w}" for w in cmp.warnings]
    if cmp.not_run:
        lines.append(f"{len(cmp.not_run)} row(s) of {path} not run now: "
                     + ", ".join(cmp.not_run))
    new = [r.key for r in cmp.rows if r.status in ("new", "incomparable")]
    if new:
        lines.append(f"{len(new)} row(s) without a recorded ratio to compare: "
                     + ", ".join(new))
    failed = [r.key for r in cmp.rows if r.status == "error"]
    if failed:
        lines.append(f"{len(failed)} row(s) failed now: " + ", ".join(failed))
    if cmp.regressed:
        lines.append(f"REGRESSED: {len(cmp.regressed)} row(s) whose ratio fell by more than "
                     f"{cmp.max_drop:.0%}: " + ", ".join(r.key for r in cmp.regressed))
    else:
        compared = sum(1 for r in cmp.rows if r.changes)
        lines.append(f"no regression: {compared} row(s) compared, none fell by more than "
                     f"{cmp.max_drop:.0%}")
    return lines


__all__ = ["EXIT_REGRESSED", "MAX_DROP", "Change", "Comparison", "RowResult", "compare",
           "load", "row_key", "summary", "table"]
