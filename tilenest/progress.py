"""Progress bars for long commands, shown only to a person at a terminal.

A long command (``conformance``, ``validate``, a campaign, ``bench``) wraps
its loop in :func:`bar`::

    with progress.bar("conformance", total=len(cases)) as step:
        for case in cases:
            ...
            step(case.name)          # one unit done; the label is optional

The bar is drawn on standard error, and only when :func:`enabled` holds:
standard error is a terminal, ``CI`` is not set (CI systems set it, and some
of them attach a pseudo-terminal), and ``TILENEST_PROGRESS`` is not ``0``
(``TILENEST_PROGRESS=1`` forces it on). Otherwise ``step`` does nothing, so
logs and machine-read output (``--json``, JUnit) never contain bar frames.
A bar is transient: it is erased when its loop ends, leaving the command's
own report as the only output. A bar opened while another is drawn (a long
interpreter region inside ``validate``'s loop over cases) is a second row of
the same display, removed when its loop ends: two displays never fight over
one line.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

#: advances a bar by one unit, optionally naming what was just done
Step = Callable[..., None]


def enabled() -> bool:
    """Should progress be drawn: a terminal on stderr, not CI, not switched off?"""
    force = os.environ.get("TILENEST_PROGRESS")
    if force is not None:
        return force not in ("", "0")
    if os.environ.get("CI"):
        return False
    return sys.stderr.isatty()


def _quiet(label: str = "", advance: int = 1) -> None:
    """The step of a bar that is not drawn."""


#: the displays being drawn, innermost last (a nested bar joins the last one)
_LIVE: list[Any] = []


@contextmanager
def bar(description: str, total: int | None) -> Iterator[Step]:
    """A progress bar over ``total`` units (``None``: unknown), yielding its
    step function ``step(label="", advance=1)``; inside another bar, a row of
    that bar's display."""
    if not enabled():
        yield _quiet
        return
    if _LIVE:
        outer = _LIVE[-1]
        row = outer.add_task(f"  {description}", total=total, label="")
        outer.refresh()  # the row shows at once, not at the next timed refresh

        def step_row(label: str = "", advance: int = 1) -> None:
            outer.update(row, advance=advance, label=label)

        try:
            yield step_row
        finally:
            outer.remove_task(row)
        return
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)

    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
               TextColumn("{task.fields[label]}"))
    forced = os.environ.get("TILENEST_PROGRESS") not in (None, "", "0")
    console = Console(file=sys.stderr, force_terminal=True if forced else None)
    with Progress(*columns, console=console, transient=True) as p:
        task = p.add_task(description, total=total, label="")

        def step(label: str = "", advance: int = 1) -> None:
            p.update(task, advance=advance, label=label)

        _LIVE.append(p)
        try:
            yield step
        finally:
            _LIVE.remove(p)
