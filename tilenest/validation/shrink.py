"""Shrinking a campaign's failures to small reproducers, in the process that found them.

A campaign item is drawn from a seeded stream (:func:`tilenest.validation.fuzz.random_spec`,
:func:`tilenest.validation.fuzz_text.make_input`), so there is no hypothesis
run to shrink it; these shrinkers search greedily instead. From the failing
value they try simpler candidates, first the ones that remove the most, and
keep the first candidate on which the *same* failure persists (the caller's
``fails`` predicate decides what "same" means: the same status on the same
target, the same exception type); then they start again from it. They stop
at a fixpoint (no candidate fails: every single simplification of the result
makes the failure go away), or when their processor-time budget or their
number of tries runs out, and say which.

The budget is also bounded by the running campaign item's own limit
(:func:`tilenest.validation.campaign.remaining_cpu`): a shrink never turns a
found bug into a ``timeout``.

Candidates of a :class:`~tilenest.validation.fuzz.Spec`, in order: keep one
half of the steps, drop one step, splice a ``loop`` step's body in its place,
drop one step of a loop's body, a loop or carry of one trip; then
the spec's own choices: the default schedule, no narrow storage, no nested
level, zero-filled bounds, smaller tile extents. A candidate that no longer
renders or captures simply does not fail the same way, and is passed over.

Candidates of an input text: drop a run of lines (halves, then smaller runs),
then a run of tokens.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from . import campaign

#: processor seconds kept in hand before an item's own limit when shrinking
_MARGIN = 0.25


@dataclass
class Shrunk:
    """The outcome of a shrink: the smallest failing value found, how many
    candidates were tried and kept, the processor seconds spent, and why it
    stopped (``fixpoint``, ``budget``, ``tries`` or ``item-limit``)."""

    value: Any
    tries: int
    kept: int
    secs: float
    stopped: str


def _budget_end(budget_s: float) -> float:
    left = campaign.remaining_cpu()
    return time.process_time() + min(budget_s, max(0.0, left * (1 - _MARGIN)))


def greedy(value: Any, candidates: Callable[[Any], Iterator[Any]], fails: Callable[[Any], bool],
           budget_s: float = 60.0, max_tries: int = 400) -> Shrunk:
    """Shrink ``value`` by taking, over and over, the first candidate of
    :func:`candidates` on which ``fails`` holds. ``fails`` raising counts as
    not failing the same way (the candidate is malformed)."""
    t0 = time.process_time()
    end = _budget_end(budget_s)
    best, tries, kept, stopped = value, 0, 0, "fixpoint"
    try:
        moved = True
        while moved:
            moved = False
            for cand in candidates(best):
                if time.process_time() >= end:
                    stopped = "budget"
                    break
                if tries >= max_tries:
                    stopped = "tries"
                    break
                tries += 1
                try:
                    hit = fails(cand)
                except Exception:  # noqa: BLE001 - a malformed candidate is not a reproducer
                    hit = False
                if hit:
                    best, kept, moved = cand, kept + 1, True
                    break
            if stopped != "fixpoint":
                break
    except campaign.ItemTimeout:
        stopped = "item-limit"
    return Shrunk(best, tries, kept, round(time.process_time() - t0, 3), stopped)


# ---------------------------------------------------------------------------
# random program specs


def _step_lists(steps: list, top: bool) -> Iterator[list]:
    """Step lists one simplification smaller than ``steps`` (a loop body,
    ``top`` False, is never left empty)."""
    n = len(steps)
    if n > 3:
        yield steps[: n // 2]
        yield steps[n // 2:]
    for j in range(n):
        if n > 1 or top:
            yield steps[:j] + steps[j + 1:]
    for j, st in enumerate(steps):
        if st[0] == "loop":
            _, form, trips, inner = st
            yield steps[:j] + list(inner) + steps[j + 1:]
            for sub in _step_lists(list(inner), False):
                yield steps[:j] + [("loop", form, trips, sub)] + steps[j + 1:]
            if trips > 1:
                yield steps[:j] + [("loop", form, 1, inner)] + steps[j + 1:]
        elif st[0] in ("serial", "pipe") and st[1] > 1:
            yield steps[:j] + [(st[0], 1, *st[2:])] + steps[j + 1:]
        elif st[0] == "while" and st[1] > 1:
            yield steps[:j] + [("while", 1, st[2])] + steps[j + 1:]


def flat_size(steps: list) -> int:
    """Steps counted with the bodies of loops."""
    return sum(1 + (flat_size(st[3]) if st[0] == "loop" else 0) for st in steps)


def spec_candidates(s: Any) -> Iterator[Any]:
    """Specs one simplification away from ``s`` (see the module docstring)."""
    for steps in _step_lists(list(s.steps), True):
        yield dataclasses.replace(s, steps=steps)
    if s.sched != "default":
        yield dataclasses.replace(s, sched="default")
    if s.storage is not None:
        yield dataclasses.replace(s, storage=None)
    if s.nested:
        yield dataclasses.replace(s, nested=False)
    if s.fill:
        yield dataclasses.replace(s, fill=False)
    for ax, b in enumerate(s.block):
        for smaller in sorted({1, 2, 3, 4, b // 2} - {0}):
            if smaller < b:
                block = tuple(smaller if a == ax else x for a, x in enumerate(s.block))
                yield dataclasses.replace(s, block=block)


def shrink_spec(s: Any, fails: Callable[[Any], bool], budget_s: float = 60.0,
                max_tries: int = 400) -> Shrunk:
    """The smallest spec found on which ``fails`` still holds (``s`` itself
    when no candidate fails)."""
    return greedy(s, spec_candidates, fails, budget_s, max_tries)


# ---------------------------------------------------------------------------
# input texts


def _drop_runs(parts: list[str], joiner: str) -> Iterator[str]:
    n = len(parts)
    size = n // 2
    while size >= 1:
        for lo in range(0, n, size):
            rest = parts[:lo] + parts[lo + size:]
            if rest:
                yield joiner.join(rest)
        size //= 2


def text_candidates(text: str) -> Iterator[str]:
    """Texts with a run of lines, then a run of tokens, removed."""
    import re

    yield from _drop_runs(text.split("\n"), "\n")
    yield from _drop_runs(re.findall(r"\s+|\w+|[^\w\s]", text), "")


def shrink_text(text: str, fails: Callable[[str], bool], budget_s: float = 10.0,
                max_tries: int = 2000) -> Shrunk:
    """The shortest text found on which ``fails`` still holds."""
    return greedy(text, text_candidates, fails, budget_s, max_tries)
