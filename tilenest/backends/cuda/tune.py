"""Choosing a ``cuda`` schedule by measurement on the device.

The fastest threads per block, staging and L2 policies differ per kernel,
dtype and size (an H200 at 8192^2: softmax f32 wants its rows staged in
shared memory, LayerNorm f32 512 threads and L2 policies, LayerNorm bf16
none of them; the defaults are 14 points of the copy bandwidth behind the
best for the first two, spec/lowering.md). :func:`tune` compiles every
candidate of a search (schedule overrides over the program's default
schedule), keeps only the legal ones, validates each distinct one against
the interpreter, times them on one call's arguments and returns the
fastest, with a report of every candidate and why it was or was not timed.

The meaning of the kernel is the same for every candidate: a schedule
decides how, not what (each is lowered under its own proved obligations),
and a candidate whose generated source is an earlier one's up to the
names of its variables is timed once. The arguments are never written:
the candidates run on copies.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from ...errors import NotAvailableError, TilenestError, UsageError
from ...lowering import Schedule, default_schedule

#: the schedule overrides tried by default, over the program's default cuda
#: schedule: threads per block, tiles read more than once staged in shared
#: memory, L2 policies (the search ``benchmarks/cuda.py`` also runs)
SEARCH: tuple[dict[str, Any], ...] = (
    {}, {"block_threads": 512}, {"stage_loads": True},
    {"block_threads": 512, "stage_loads": True}, {"cache_hints": True},
    {"block_threads": 512, "cache_hints": True})

#: a timed sample lasts at least this many seconds of device time
SAMPLE_S = 2e-3


@dataclass
class Trial:
    """One candidate: its overrides and what became of it. ``status`` is
    ``"timed"``, ``"same"`` (its source is candidate ``same_as``'s up to
    names),
    ``"illegal"`` (its schedule or lowering was refused), ``"invalid"`` (its
    kernel disagreed with the interpreter: a compiler bug, reported) or
    ``"failed"`` (it raised when run)."""

    overrides: dict[str, Any]
    status: str = "untried"
    schedule: Schedule | None = None
    compiled: Any = None
    seconds: float | None = None
    samples: list[float] = field(default_factory=list)
    same_as: int | None = None
    reason: str = ""
    #: the launch bound on device copies of the arguments (GPU timing)
    bound: Any = field(default=None, repr=False)

    @property
    def label(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.overrides.items()) or "default"


@dataclass
class TuneReport:
    """Every candidate of a search and the fastest: ``compiled`` is its
    kernel, ``schedule`` its schedule, ``trials[best]`` its record."""

    trials: list[Trial]
    best: int

    @property
    def compiled(self) -> Any:
        return self.trials[self.best].compiled

    @property
    def schedule(self) -> Schedule:
        s = self.trials[self.best].schedule
        assert s is not None
        return s

    def speedup(self, i: int = 0) -> float | None:
        """Candidate ``i``'s time over the best's (1.0 for the best itself);
        None when ``i`` was not timed."""
        t = self._time(i)
        return None if t is None else t / self.trials[self.best].seconds  # type: ignore[operator]

    def _time(self, i: int) -> float | None:
        tr = self.trials[i]
        if tr.status == "same" and tr.same_as is not None:
            return self.trials[tr.same_as].seconds
        return tr.seconds

    def table(self) -> str:
        """One line per candidate: overrides, microseconds per call (median of
        the samples), its time over the best's, and the status."""
        w = max(len(t.label) for t in self.trials)
        lines = [f"  {'candidate':<{w}}  {'us/call':>9}  {'x best':>7}  status"]
        for i, t in enumerate(self.trials):
            sec = self._time(i)
            us = f"{sec * 1e6:9.2f}" if sec is not None else f"{'-':>9}"
            rel = self.speedup(i)
            rx = f"{rel:7.3f}" if rel is not None else f"{'-':>7}"
            what = {"timed": "timed", "same": f"same source as {self.trials[t.same_as or 0].label}",
                    }.get(t.status, f"{t.status}: {t.reason}")
            mark = "*" if i == self.best else " "
            lines.append(f"{mark} {t.label:<{w}}  {us}  {rx}  {what}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def tune(kernel: Any, *arrays: Any, params: dict[str, int] | None = None,
         search: Sequence[dict[str, Any]] = SEARCH, base: dict[str, Any] | None = None,
         device: str = "gpu", samples: int = 5, cases: int = 4, seed: int = 0,
         timer: Callable[[Any, tuple], float] | None = None) -> TuneReport:
    """The fastest ``cuda`` schedule of ``kernel`` (a ``tn.kernel`` or a
    ``TileProgram``) among ``search``, measured on one call's ``arrays``.

    Each entry of ``search`` is a set of ``Schedule`` overrides applied, after
    ``base``, to the program's default cuda schedule. A candidate whose
    schedule or lowering is refused is reported ``illegal`` with the reason;
    the legal ones are compiled for ``device`` and each distinct generated
    source is validated on ``cases`` generated calls (``tn.validate``, seed
    ``seed``) -- one that disagrees is reported ``invalid`` and never chosen --
    and timed: ``samples`` rounds alternating between the candidates, each a
    batch of back-to-back launches between CUDA events lasting at least
    :data:`SAMPLE_S`; a candidate's time is its median. ``timer(kernel,
    arrays) -> seconds`` replaces that measurement (it must be given for the
    emulated device, whose times say nothing about a GPU's). ``arrays`` are
    never written: each candidate runs on copies (device arrays are copied on
    the device). Raises ``TilenestError`` when no candidate could be timed."""
    from . import compile_program
    from ...validation import validate

    program = getattr(kernel, "program", kernel)
    if device not in ("gpu", "emulated"):
        raise UsageError(f"unknown device '{device}'", hint="device='gpu' or 'emulated'")
    if device == "gpu" and timer is None:
        from .runtime import gpu_available

        if not gpu_available():
            raise NotAvailableError("tuning for the GPU needs a usable CUDA GPU (CuPy and a "
                                    "driver)", hint="run on a machine with an NVIDIA GPU")
    if device == "emulated" and timer is None:
        raise UsageError("tuning on the emulated device needs a timer",
                         hint="the emulator's run times say nothing about a GPU's; tune with "
                              "device='gpu', or pass timer= (for tests)")
    if samples < 1 or cases < 1:
        raise UsageError("tune needs samples >= 1 and cases >= 1",
                         hint="every candidate is validated and timed before one is chosen")
    if not search:
        raise UsageError("tune got an empty search", hint="pass at least one set of overrides")
    known = {f.name for f in fields(Schedule)}
    for o in [base or {}, *search]:
        bad = sorted(set(o) - known)
        if bad:
            raise UsageError(f"'{bad[0]}' is not a Schedule field",
                             hint=f"fields: {', '.join(sorted(known))}")
    trials = [Trial(dict(o)) for o in search]
    sources: dict[str, int] = {}
    for i, t in enumerate(trials):
        try:
            t.schedule = default_schedule(program, "cuda", **{**(base or {}), **t.overrides})
            t.compiled = compile_program(program, t.schedule, device=device)
        except TilenestError as e:
            t.status, t.reason = "illegal", e.message
            continue
        # the source up to names, and the launch facts (a grid cap, say, is
        # not in the text)
        text = _alpha(t.compiled.source.text) + repr(t.compiled.source.kernels)
        if text in sources:
            t.status, t.same_as = "same", sources[text]
            continue
        sources[text] = i
        rep = validate(kernel, "cuda", compiled=t.compiled, cases=cases, seed=seed)
        if not rep.ok:
            t.status, t.reason = "invalid", rep.summary().splitlines()[0]
            continue
        t.status = "timed"
    timed = [t for t in trials if t.status == "timed"]
    if not timed:
        raise TilenestError("no candidate schedule could be timed",
                            hint="\n".join(f"{t.label}: {t.status}: {t.reason}" for t in trials))
    measure = timer or _gpu_timer()
    for _ in range(samples):
        for t in timed:
            try:
                got = arrays if timer else _bind(t, arrays, params)
                t.samples.append(measure(t.compiled, got))
            except TilenestError as e:
                t.status, t.reason = "failed", e.message
        timed = [t for t in timed if t.status == "timed"]
    for t in timed:
        t.seconds = statistics.median(t.samples)
    if not timed:
        raise TilenestError("every candidate schedule failed when run",
                            hint="\n".join(f"{t.label}: {t.reason}" for t in trials))
    best = min(timed, key=lambda t: t.seconds)  # type: ignore[arg-type,return-value]
    return TuneReport(trials, trials.index(best))


def _alpha(text: str) -> str:
    """``text`` with its generated names (``v_*``, ``b_*``, ``tn_*``) renamed
    in order of first appearance: two sources equal after this differ only in
    the names the lowering happened to draw, a consistent renaming, so they
    are the same program."""
    names: dict[str, str] = {}

    def canon(m: re.Match) -> str:
        return names.setdefault(m.group(0), f"n{len(names)}")

    return _NAME.sub(canon, text)


_NAME = re.compile(r"\b(?:v|b|tn)_\w+")


def _bind(t: Trial, arrays: tuple, params: dict[str, int] | None) -> tuple:
    """``(launch, copies)``: trial ``t``'s call bound on device copies of
    ``arrays``, made once and kept on the trial; its first launch is checked
    (a nonzero status is an error before anything is timed)."""
    if t.bound is None:
        import cupy as cp
        import numpy as np

        copies = tuple(cp.array(a, copy=True) if isinstance(a, np.ndarray) or
                       hasattr(a, "__cuda_array_interface__") else a for a in arrays)
        bl = t.compiled.bound(*copies, params=params)
        bl.launch()
        bl.check()
        t.bound = (bl, copies)
    return t.bound  # type: ignore[no-any-return]


def _gpu_timer() -> Callable[[Any, tuple], float]:
    """Device seconds per call: a batch of back-to-back launches of the bound
    call between two CUDA events, sized to last :data:`SAMPLE_S` (the size
    estimated once per kernel from a single launch)."""
    import cupy as cp

    inner: dict[int, int] = {}

    def batch(bl: Any, n: int) -> float:
        a, b = cp.cuda.Event(), cp.cuda.Event()
        bl.launch()  # keeps the device busy while the start is recorded
        a.record()
        for _ in range(n):
            bl.launch()
        b.record()
        b.synchronize()
        return cp.cuda.get_elapsed_time(a, b) * 1e-3 / n

    def measure(ck: Any, bound: tuple) -> float:
        bl = bound[0]
        if id(ck) not in inner:
            inner[id(ck)] = max(1, min(1000, math.ceil(SAMPLE_S / max(batch(bl, 1), 1e-7))))
        sec = batch(bl, inner[id(ck)])
        bl.check()
        return sec

    return measure
