"""How a benchmark is timed: warm-up, alternating samples, median and spread.

A *sample* of a function is one block of back-to-back calls lasting at least
``min_sample_s`` seconds (and at least ``min_calls`` calls), divided by its
number of calls: a short kernel is timed in steady state (caches warm,
threads awake), and the timer's own cost is spread over many calls. Before
each block the function is called once untimed (the warm-up: first-touch
page faults, lazy binding), after a pause of ``settle_s`` seconds that lets
the spinning worker threads of a BLAS go idle, so that they do not steal the
cycles of the next function.

The samples of several functions compared with each other are taken in
rounds, each round one sample of every function in turn, so that load drifting
in from other processes hits all of them alike. The reported time is the
median of the samples; the *spread* is ``(max - min) / median`` over them: a
ratio between two functions closer to 1 than their spreads is noise.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Timing:
    """Seconds per call of one function: ``median`` over ``samples`` samples,
    each the mean of ``calls`` calls (the smallest block); ``lo``/``hi`` the
    fastest and slowest sample."""

    median: float
    lo: float
    hi: float
    samples: int
    calls: int

    @property
    def spread(self) -> float:
        """``(hi - lo) / median``: 0 for one sample."""
        return (self.hi - self.lo) / self.median if self.median > 0 else 0.0

    def to_json(self) -> dict[str, float | int]:
        return {"median_s": self.median, "min_s": self.lo, "max_s": self.hi,
                "spread": self.spread, "samples": self.samples, "calls": self.calls}

    @staticmethod
    def of(values: Sequence[float], calls: int = 1) -> Timing:
        """The timing of a list of per-call sample times."""
        if not values:
            raise ValueError("a timing needs at least one sample")
        return Timing(statistics.median(values), min(values), max(values), len(values), calls)


@dataclass(frozen=True)
class Method:
    """The parameters of :func:`measure` (see the module docstring)."""

    samples: int = 5
    min_sample_s: float = 0.05
    min_calls: int = 1
    settle_s: float = 0.0
    #: warm up before every sample (True) or only before the first (slow functions)
    warm_each: bool = True


def _sample(fn: Callable[[], object], m: Method, first: bool) -> tuple[float, int]:
    """One sample of ``fn``: (seconds per call, calls in the block)."""
    if m.settle_s > 0:
        time.sleep(m.settle_s)
    if first or m.warm_each:
        fn()  # warm-up, untimed
    calls = 0
    start = time.perf_counter()
    while True:
        fn()
        calls += 1
        elapsed = time.perf_counter() - start
        if calls >= m.min_calls and elapsed >= m.min_sample_s:
            return elapsed / calls, calls


def measure(fns: Sequence[Callable[[], object]], method: Method = Method()) -> list[Timing]:
    """A :class:`Timing` per function, sampled in alternating rounds."""
    if method.samples < 1:
        raise ValueError("at least one sample per function")
    per: list[list[float]] = [[] for _ in fns]
    calls: list[int] = [0 for _ in fns]
    for r in range(method.samples):
        for i, fn in enumerate(fns):
            t, n = _sample(fn, method, r == 0)
            per[i].append(t)
            calls[i] = n if not calls[i] else min(calls[i], n)
    return [Timing.of(ts, c) for ts, c in zip(per, calls, strict=True)]
