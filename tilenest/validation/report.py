"""What ``tilenest validate`` prints: a progress bar, a summary table, and for
every mismatch the smallest failing case (its sizes, the first offending
element and why, and the kernel's TileIR).

Exit status: 0 when every case of every kernel is admitted (or both reject
it, or the program is invalid on it), 1 on any mismatch (or a user error), 3
when no mismatch was found but some kernel cannot be compiled for the target.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Callable

from ..errors import NotAvailableError
from .validate import Report, validate


def table(reports: list[Report]) -> Any:
    """A rich Table summarizing ``reports`` (one row per kernel)."""
    from rich.table import Table

    t = Table(title="translation validation")
    t.add_column("kernel", no_wrap=True)
    t.add_column("target")
    for col in ("cases", "ok", "mismatch", "both reject", "skipped", "compile s", "total s"):
        t.add_column(col, justify="right")
    for r in reports:
        t.add_row(r.kernel, r.target, str(len(r.results)), str(r.count("ok")),
                  f"[red]{r.count('mismatch')}[/red]" if r.count("mismatch") else "0",
                  str(r.count("rejected")), str(r.count("skipped")),
                  f"{r.compile_seconds:.2f}", f"{r.seconds:.2f}")
    return t


def to_json(r: Report) -> dict:
    return {
        "kernel": r.kernel, "target": r.target, "ok": r.ok,
        "counts": {s: r.count(s) for s in ("ok", "mismatch", "rejected", "skipped")},
        "mismatches": [{"case": m.index, "label": m.label, "output": m.output,
                        "element": list(m.element) if m.element else None,
                        "message": m.message} for m in r.mismatches],
        "compile_seconds": r.compile_seconds, "seconds": r.seconds,
    }


def run_cli(progs: list[tuple[str, Any]], a: Any, schedule_for: Callable) -> int:
    """Validate every program of a file; print the table (or JSON)."""
    from rich.console import Console
    from rich.progress import Progress

    console = Console(file=sys.stdout, width=None if sys.stdout.isatty() else 120)
    reports: list[Report] = []
    sources: list[Any] = []
    unavailable: list[str] = []
    with Progress(console=console, transient=True, disable=a.json) as bar:
        for name, p in progs:
            task = bar.add_task(f"validating {name}", total=a.cases)
            try:
                r = validate(p, a.target, cases=a.cases, seed=a.seed, limit=a.limit,
                             schedule=schedule_for(a, p),
                             progress=lambda i, n, task=task: bar.update(task, completed=i,
                                                                          total=n))
            except NotAvailableError as e:
                unavailable.append(f"{name}: {e.message}")
                continue
            reports.append(r)
            sources.append(p)
    if a.json:
        print(json.dumps({"reports": [to_json(r) for r in reports],
                          "unavailable": unavailable}, indent=2))
    else:
        if reports:
            console.print(table(reports))
        for u in unavailable:
            console.print(f"[yellow]not available[/yellow] {u}")
        for p, r in zip(sources, reports, strict=True):
            f = r.smallest_failure()
            if f is None:
                continue
            console.print(f"[red]mismatch[/red] {r.kernel}: case #{f.index} ({f.label})")
            console.print(f"  {f.message}")
            console.print("  kernel TileIR:")
            console.print(str(p), markup=False, highlight=False)
    if any(not r.ok for r in reports):
        return 1
    return 3 if unavailable else 0
