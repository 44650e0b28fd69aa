"""What ``tilenest validate`` prints: a summary table, and for
every mismatch the smallest failing case (its sizes, the first offending
element and why, and the kernel's TileIR).

Every kernel of the file gets a verdict line: ``validated`` (with the number of
cases compared, the sizes and the schedules), ``MISMATCH``, ``NOTHING
COMPARED`` (no case could be compared: nothing was validated), ``UNREACHED``
(the kernel's assumptions keep a required size path, such as three tiles and
a ragged tail, out of reach; ``--accept-unreached`` accepts that), or
``refused`` with the compiler's reason; a refusal does not stop the other
kernels. Size paths no compared case took are listed under the verdict.

Exit status, the worst over the kernels: 70 when compiling a kernel hit a bug
of tilenest itself (an ``InternalError``); else 1 on any mismatch, any kernel with
nothing compared or with an unaccepted unreached path, or any kernel refused
for a reason other than a missing capability (an illegal program, a user
error); else 3 when some kernel needs a capability this build lacks; else 0.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Callable

from ..errors import InternalError, NotAvailableError, TilenestError
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
        "kernel": r.kernel, "target": r.target, "ok": r.ok, "status": r.status,
        "counts": {s: r.count(s) for s in ("ok", "mismatch", "rejected", "skipped")},
        "compared": r.compared,
        "sizes": r.sizes(),
        "cases": [{"case": c.index, "label": c.label, "status": c.status} for c in r.results],
        "schedules": {"compiled": r.compile_schedule, "reference": r.reference_schedule},
        "nothing_compared": r.why_nothing() or None,
        "unreached": [{"symbol": u.path.sym, "path": u.path.text(), "cause": u.cause,
                       "why": u.why, "blocking": u.blocking,
                       "accepted": u.blocking and r.accept_unreached} for u in r.unreached],
        "mismatches": [{"case": m.index, "label": m.label, "output": m.output,
                        "element": list(m.element) if m.element else None,
                        "message": m.message} for m in r.mismatches],
        "compile_seconds": r.compile_seconds, "seconds": r.seconds,
    }


def verdict_line(r: Report) -> str:
    """The one-line verdict of a validated kernel."""
    if r.status == "ok":
        head = f"[green]validated[/green] {r.kernel}: {r.compared} case(s) compared"
    elif r.status == "mismatch":
        head = (f"[red]MISMATCH[/red] {r.kernel}: {r.count('mismatch')} of {r.compared} "
                "compared case(s)")
    elif r.status == "unreached":
        head = (f"[red]UNREACHED[/red] {r.kernel}: {r.compared} case(s) compared, but the "
                "kernel's size space keeps a required path out of reach")
    else:
        head = f"[red]NOTHING COMPARED[/red] {r.kernel}: {r.why_nothing()}"
    tail = "".join(f"\n  {line}" for line in r.unreached_lines())
    if r.status == "unreached":
        tail += ("\n  hint: the compiled kernel is untested on that path; when its callers "
                 "never take it, accept the gap with --accept-unreached "
                 "(tn.validate(..., accept_unreached=True))")
    return (f"{head}\n  sizes: {r.sizes_text()}\n  schedules: compiled {r.compile_schedule}; "
            f"reference {r.reference_schedule}{tail}")


def run_cli(progs: list[tuple[str, Any]], a: Any, schedule_for: Callable) -> int:
    """Validate every program of a file, each to its own verdict (a kernel the
    compiler refuses does not stop the others); print the table and a line per
    kernel (or JSON); return the worst exit status (module docstring)."""
    from rich.console import Console

    console = Console(file=sys.stdout, width=None if sys.stdout.isatty() else 120)
    reports: list[Report] = []
    sources: list[Any] = []
    refused: list[tuple[str, TilenestError]] = []
    order: list[tuple[str, Any]] = []
    # validate() draws the progress bar (tilenest.progress: on a terminal only)
    for name, p in progs:
        try:
            r = validate(p, a.target, cases=a.cases, seed=a.seed, limit=a.limit,
                         compile_schedule=schedule_for(a, p),
                         accept_unreached=getattr(a, "accept_unreached", False))
        except TilenestError as e:  # the compiler (or its legality gate) refuses it
            refused.append((name, e))
            order.append(("refused", (name, e)))
            continue
        reports.append(r)
        sources.append(p)
        order.append(("report", r))
    if a.json:
        print(json.dumps({
            "reports": [to_json(r) for r in reports],
            "refused": [{"kernel": n, "unavailable": isinstance(e, NotAvailableError),
                         "error": e.to_json()} for n, e in refused],
            "unavailable": [f"{n}: {e.message}" for n, e in refused
                            if isinstance(e, NotAvailableError)],
        }, indent=2))
    else:
        if reports:
            console.print(table(reports))
        for what, x in order:
            if what == "report":
                console.print(verdict_line(x), highlight=False)
            else:
                n, err = x
                tag = "not available" if isinstance(err, NotAvailableError) else "refused"
                console.print(f"[yellow]{tag}[/yellow] {n}: {err.kind}: {err.message}",
                              highlight=False)
                for site in err.sites[:1]:
                    console.print(f"  --> {site}", highlight=False, markup=False)
                if err.hint:
                    console.print(f"  hint: {err.hint}", highlight=False, markup=False)
        for p, r in zip(sources, reports, strict=True):
            f = r.smallest_failure()
            if f is None:
                continue
            console.print(f"[red]mismatch[/red] {r.kernel}: case #{f.index} ({f.label})")
            console.print(f"  {f.message}", markup=False, highlight=False)
            console.print("  kernel TileIR:")
            console.print(str(p), markup=False, highlight=False)
    if any(isinstance(e, InternalError) for _, e in refused):
        return 70  # a bug of tilenest (the CLI's internal-error status)
    if any(not r.ok for r in reports) or any(not isinstance(e, NotAvailableError)
                                             for _, e in refused):
        return 1
    return 3 if refused else 0
