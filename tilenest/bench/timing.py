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

Calibration: one slow sample (another process waking up) widens the spread
for good, so stability is judged by the *noise*, the interquartile range of
the samples over their median, which a few outliers do not move. While some
function's noise exceeds ``Method.max_noise`` (:data:`NOISE_LIMIT`, 10%),
another round is taken, up to ``Method.max_extra`` rounds (as many again as
``samples``); a timing still noisier than that afterwards is reported by
:func:`noisy` so that its ratio is read as uncertain.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

#: the noise (interquartile range / median) above which a function's samples
#: are calibrated further and, if still above it, reported as noisy
NOISE_LIMIT = 0.10


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
    #: the interquartile range of the samples over the median (module docstring)
    noise: float = 0.0

    @property
    def spread(self) -> float:
        """``(hi - lo) / median``: 0 for one sample."""
        return (self.hi - self.lo) / self.median if self.median > 0 else 0.0

    def to_json(self) -> dict[str, float | int]:
        return {"median_s": self.median, "min_s": self.lo, "max_s": self.hi,
                "spread": self.spread, "noise": self.noise, "samples": self.samples,
                "calls": self.calls}

    @staticmethod
    def of(values: Sequence[float], calls: int = 1) -> Timing:
        """The timing of a list of per-call sample times."""
        if not values:
            raise ValueError("a timing needs at least one sample")
        return Timing(statistics.median(values), min(values), max(values), len(values), calls,
                      noise(values))


def noise(values: Sequence[float]) -> float:
    """The interquartile range of ``values`` over their median (0 for fewer
    than two values, or a zero median)."""
    if len(values) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    med = statistics.median(values)
    return (q3 - q1) / med if med > 0 else 0.0


@dataclass(frozen=True)
class Method:
    """The parameters of :func:`measure` (see the module docstring)."""

    samples: int = 5
    min_sample_s: float = 0.05
    min_calls: int = 1
    settle_s: float = 0.0
    #: warm up before every sample (True) or only before the first (slow functions)
    warm_each: bool = True
    #: calibration: more rounds while some function's noise is above this ...
    max_noise: float = NOISE_LIMIT
    #: ... but at most this many more (None: as many as ``samples``)
    max_extra: int | None = None


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
    extra = method.samples if method.max_extra is None else method.max_extra
    r = 0
    while r < method.samples or (r < method.samples + extra
                                 and any(noise(ts) > method.max_noise for ts in per)):
        for i, fn in enumerate(fns):
            t, n = _sample(fn, method, r == 0)
            per[i].append(t)
            calls[i] = n if not calls[i] else min(calls[i], n)
        r += 1
    return [Timing.of(ts, c) for ts, c in zip(per, calls, strict=True)]


def _timings(row: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(name, timing JSON)`` of every timing in a benchmark row."""
    for key, v in row.items():
        if isinstance(v, dict) and "median_s" in v:
            yield key, v
        elif key == "baselines" and isinstance(v, dict):
            for b, t in v.items():
                if isinstance(t, dict) and "median_s" in t:
                    yield b, t


def noisy(rows: Sequence[dict[str, Any]], limit: float = NOISE_LIMIT) -> list[str]:
    """One warning per timing of ``rows`` whose noise is still above
    ``limit`` after calibration: its ratios are uncertain."""
    out = []
    for row in rows:
        label = row.get("workload", row.get("name", "?"))
        if row.get("threads") is not None:
            label = f"{label} @{row['threads']} threads"
        for name, t in _timings(row):
            if t.get("noise", 0.0) > limit:
                out.append(f"{label}: the {name} samples vary by {t['noise']:.0%} (interquartile "
                           f"range over the median of {t['samples']} samples, above "
                           f"{limit:.0%}); read its ratios as uncertain")
    return out


def plus_minus(stream: Any = None) -> str:
    """``±`` where ``stream`` (default: standard output) can encode it, else
    ``+-`` (``PYTHONIOENCODING=ascii``, a C locale)."""
    import sys

    enc = getattr(stream if stream is not None else sys.stdout, "encoding", None) or "ascii"
    try:
        "\u00b1".encode(enc)
    except (UnicodeEncodeError, LookupError):
        return "+-"
    return "\u00b1"
