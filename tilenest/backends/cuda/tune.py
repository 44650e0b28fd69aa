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

import functools
import math
import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import NotAvailableError, TilenestError, UsageError
from ...diskcache import Store
from ...lowering import Schedule, default_schedule

#: the schedule overrides tried by default, over the program's default cuda
#: schedule: threads per block, tiles read more than once staged in shared
#: memory, L2 policies (the search ``benchmarks/cuda.py`` also runs) and rows
#: in registers (``row_registers``: with the input cached, the fastest softmax
#: on the H200, spec/lowering.md L-4), alone and together. Each entry names
#: every field it needs, so that it means one schedule whatever the defaults
#: (a program with no ``mma`` has rows in registers and L2 policies by
#: default, one with an ``mma`` neither).
SEARCH: tuple[dict[str, Any], ...] = tuple(
    {"row_registers": rr, "cache_hints": hints, **more}
    for rr, hints, more in (
        (32, True, {}), (32, False, {}), (0, True, {}), (0, True, {"block_threads": 512}),
        (0, False, {}), (0, False, {"block_threads": 512}), (0, False, {"stage_loads": True}),
        (0, False, {"block_threads": 512, "stage_loads": True})))

#: a timed sample lasts at least this many seconds of device time
SAMPLE_S = 2e-3

#: recorded tunings (``tune(record=True)``), in the persistent cache
_RECORDS = Store("tune")


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
    #: its launches were enqueued no faster than they ran: the time is the
    #: host's enqueue rate, not the kernel's
    launch_bound: bool = False
    #: the launch bound on device copies of the arguments, while timed
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
    #: when the outcome comes from a record (``tune(record=True)``): the
    #: date it was measured; else empty
    recorded: str = ""

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
        lines = [f"  (recorded {self.recorded})"] if self.recorded else []
        lines.append(f"  {'candidate':<{w}}  {'us/call':>9}  {'x best':>7}  status")
        for i, t in enumerate(self.trials):
            sec = self._time(i)
            us = f"{sec * 1e6:9.2f}" if sec is not None else f"{'-':>9}"
            rel = self.speedup(i)
            rx = f"{rel:7.3f}" if rel is not None else f"{'-':>7}"
            what = {"timed": "timed" + (" (launch-bound)" if t.launch_bound else ""),
                    "same": f"same source as {self.trials[t.same_as or 0].label}",
                    }.get(t.status, f"{t.status}: {t.reason}")
            mark = "*" if i == self.best else " "
            lines.append(f"{mark} {t.label:<{w}}  {us}  {rx}  {what}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def tune(kernel: Any, *arrays: Any, params: dict[str, int] | None = None,
         search: Sequence[dict[str, Any]] = SEARCH, base: dict[str, Any] | None = None,
         device: str = "gpu", samples: int = 5, cases: int = 4, seed: int = 0,
         timer: Callable[[Any, tuple], float] | None = None, record: bool = False
         ) -> TuneReport:
    """The fastest ``cuda`` schedule of ``kernel`` (a ``tn.kernel`` or a
    ``TileProgram``) among ``search``, measured on one call's ``arrays``.

    Each entry of ``search`` is a set of ``Schedule`` overrides applied, after
    ``base``, to the program's default cuda schedule; a field that is not a
    ``Schedule`` field, has a value of the wrong type or is not read by the
    cuda target is a ``UsageError`` before anything is compiled, as is a call
    the kernel's signature refuses. A candidate whose lowering is refused is
    reported ``illegal`` with the reason; the legal ones are compiled for
    ``device`` and each distinct generated source is validated against the
    interpreter on ``cases`` generated calls (``tn.validate``, seed ``seed``;
    sizes of its own choosing, not the call's) -- one that disagrees is
    reported ``invalid`` and never chosen -- and timed on the call: one set of
    device copies of ``arrays`` (the caller's arrays are never written) is
    bound once per candidate and checked, then ``samples`` rounds alternate
    between the candidates, each a batch of back-to-back launches between
    CUDA events lasting at least :data:`SAMPLE_S` (at most 1000 launches); a
    candidate's time is the median of its rounds. A candidate whose launches
    are enqueued no faster than they run is marked launch-bound: its time is
    the host's enqueue rate, not the kernel's. ``timer(kernel, arrays) ->
    seconds`` replaces the measurement and receives the caller's arrays
    themselves (required on the emulated device, whose times say nothing
    about a GPU's). Raises ``TilenestError`` when no candidate could be
    timed.

    ``record=True`` keeps the outcome in the persistent cache (namespace
    ``tune``) under the program, its default schedule with ``base``, the
    search, the call's sizes, the device (GPU name and driver version, or
    the emulator) and tilenest's version; a later tuning with all of these
    equal, in any process, returns the recorded outcome without timing
    anything (``report.recorded`` is its date) and compiles only the chosen
    candidate. A measurement can go stale where a compiled artifact cannot
    (other load on the GPU, other clocks): the record is opt-in."""
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
    trials = [Trial(dict(o)) for o in search]
    for t in trials:  # a user's mistake, before anything is compiled
        t.schedule = default_schedule(program, "cuda", **{**(base or {}), **t.overrides})
    env = _check_call(program, arrays, params)
    key = _record_key(program, base, search, env, device) if record else None
    if key is not None:
        recalled = _recalled(key, trials, program, device)
        if recalled is not None:
            return recalled
    sources: dict[str, int] = {}
    for i, t in enumerate(trials):
        try:
            t.compiled = compile_program(program, t.schedule, device=device)
        except TilenestError as e:
            t.status, t.reason = "illegal", e.message
            continue
        text = same_code_key(t.compiled)
        if text in sources:
            t.status, t.same_as = "same", sources[text]
            continue
        sources[text] = i
        verdict = validate(kernel, "cuda", compiled=t.compiled, cases=cases, seed=seed)
        if not verdict.ok:
            t.status, t.reason = "invalid", verdict.summary().splitlines()[0]
            continue
        t.status = "timed"
    timed = [t for t in trials if t.status == "timed"]
    if not timed:
        raise TilenestError("no candidate schedule could be timed",
                            hint="\n".join(f"{t.label}: {t.status}: {t.reason}" for t in trials))
    copies = arrays if timer else _device_copies(arrays)
    measure = timer or _gpu_timer()
    try:
        for _ in range(samples):
            for t in timed:
                try:
                    got = arrays if timer else _bind(t, copies, params)
                    t.samples.append(measure(t.compiled, got))
                except Exception as e:  # a launch that fails (out of memory, a status...)
                    t.status = "failed"
                    t.reason = e.message if isinstance(e, TilenestError) else \
                        f"{type(e).__name__}: {e}"
            timed = [t for t in timed if t.status == "timed"]
    finally:
        for t in trials:
            t.bound = None  # the device copies are not kept with the report
    host = measure.host if isinstance(measure, _GpuTimer) else {}
    for t in timed:
        t.seconds = statistics.median(t.samples)
        if id(t.compiled) in host:
            t.launch_bound = statistics.median(host[id(t.compiled)]) >= 0.9 * t.seconds
    if not timed:
        raise TilenestError("every candidate schedule failed when run",
                            hint="\n".join(f"{t.label}: {t.reason}" for t in trials))
    best = min(timed, key=lambda t: t.seconds)  # type: ignore[arg-type,return-value]
    rep = TuneReport(trials, trials.index(best))
    if key is not None:
        _remember(key, rep)
    return rep


def _check_call(program: Any, arrays: tuple, params: dict[str, int] | None) -> dict:
    """Bind the call as every candidate will (shapes, dtypes, arity), so a
    call the signature refuses is an error now, not a failure per candidate;
    the symbol values of the call."""
    import numpy as np

    from ...semantics import arrays as A
    from ...semantics.signature import bind_call

    metas = tuple(A.stand_in(a) if hasattr(a, "__cuda_array_interface__") and
                  not isinstance(a, np.ndarray) else a for a in arrays)
    return bind_call(program, metas, params)


# ------------------------------------------------------------------------------ records
#: the fields of a trial a record keeps
_KEPT = ("overrides", "status", "seconds", "samples", "same_as", "reason", "launch_bound")


def _device_identity(device: str) -> list:
    if device == "emulated":
        return ["emulated"]
    import cupy as cp

    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return [name, cp.cuda.runtime.driverGetVersion()]


def _record_key(program: Any, base: dict[str, Any] | None, search: Sequence[dict[str, Any]],
                env: dict, device: str) -> str:
    """The record's key: the kernel's disk key under its default schedule with
    ``base``, the search, the call's symbol values and the device."""
    from . import disk_key
    from ...diskcache import key_of

    s = default_schedule(program, "cuda", **(base or {}))
    syms = sorted((str(k), int(v)) for k, v in env.items())
    return key_of(["tune", 1, disk_key(program, s), [sorted(o.items()) for o in search],
                   syms, _device_identity(device)])


def _recalled(key: str, trials: list[Trial], program: Any, device: str) -> TuneReport | None:
    """The recorded outcome of this tuning, the chosen candidate compiled;
    None when there is none (an entry this reader cannot use is discarded)."""
    from . import compile_program

    got = _RECORDS.get(key)
    if got is None:
        return None
    meta, _ = got
    try:
        rows, best = meta["trials"], int(meta["best"])
        if [r["overrides"] for r in rows] != [t.overrides for t in trials] or \
                rows[best]["status"] != "timed":
            raise ValueError("another search")
        for t, r in zip(trials, rows, strict=True):
            for f in _KEPT[1:]:
                setattr(t, f, r[f])
    except (KeyError, TypeError, ValueError, IndexError):
        _RECORDS.discard(key)
        return None
    trials[best].compiled = compile_program(program, trials[best].schedule, device=device)
    return TuneReport(trials, best, recorded=str(meta.get("date", "")))


def _remember(key: str, rep: TuneReport) -> None:
    import datetime

    rows = [{f: (t.overrides if f == "overrides" else getattr(t, f)) for f in _KEPT}
            for t in rep.trials]
    _RECORDS.put(key, {"trials": rows, "best": rep.best,
                       "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
                           timespec="seconds")}, {})


def _device_copies(arrays: tuple) -> tuple:
    """C-contiguous device copies of the array arguments (numpy or device
    arrays), made once and shared by the candidates; other arguments as
    given."""
    import cupy as cp
    import numpy as np

    return tuple(cp.array(a, copy=True, order="C") if isinstance(a, np.ndarray) or
                 hasattr(a, "__cuda_array_interface__") else a for a in arrays)


def same_code_key(compiled: Any) -> str:
    """A key equal for two compiled kernels exactly when they are the same
    code: the generated source without its comments (which quote loop-IR
    names) up to the names it declares itself (:func:`_alpha`), and the
    launch facts (a grid cap, say, is not in the text)."""
    text = _COMMENT.sub("", compiled.source.text)
    return _alpha(text) + repr(compiled.source.kernels)


_COMMENT = re.compile(r"//[^\n]*")


def _alpha(text: str) -> str:
    """``text`` with the names it declares itself renamed in order of first
    appearance: the buffers, locals and temporaries of the generated code
    (``v_*``, ``b_*``, ``tn_*`` not named in the prelude). The prelude's own
    names (functions such as ``tn_vstore`` and ``tn_vstore_stream``, types)
    are kept, so two sources equal after this differ only by a consistent
    renaming of what the lowering happened to name: the same program."""
    names: dict[str, str] = {}
    keep = _prelude_names()

    def canon(m: re.Match) -> str:
        w = m.group(0)
        return w if w in keep else names.setdefault(w, f"n{len(names)}")

    return _NAME.sub(canon, text)


_NAME = re.compile(r"\b(?:v|b|tn)_\w+")


@functools.cache
def _prelude_names() -> frozenset[str]:
    """Every identifier of the prelude headers that a generated name could
    be mistaken for."""
    from . import prelude_files

    out: set[str] = set()
    for f in prelude_files():
        out |= set(_NAME.findall(Path(f).read_text()))
    return frozenset(out)


def _bind(t: Trial, copies: tuple, params: dict[str, int] | None) -> tuple:
    """``(launch, copies)``: trial ``t``'s call bound on the device copies,
    made once and kept on the trial while it is timed; its first launch is
    checked (a nonzero status is an error before anything is timed)."""
    if t.bound is None:
        bl = t.compiled.bound(*copies, params=params)
        bl.launch()
        bl.check()
        t.bound = (bl, copies)
    return t.bound  # type: ignore[no-any-return]


class _GpuTimer:
    """Device seconds per call: a batch of back-to-back launches of the bound
    call between two CUDA events, sized to last :data:`SAMPLE_S` (at most
    1000 launches; the size estimated once per kernel from a single launch).
    ``host`` keeps, per kernel, the host seconds per call of enqueuing each
    batch (launch-bound when they match the device's)."""

    def __init__(self) -> None:
        self.inner: dict[int, int] = {}
        self.host: dict[int, list[float]] = {}

    @staticmethod
    def batch(bl: Any, n: int) -> tuple[float, float]:
        import time

        import cupy as cp

        a, b = cp.cuda.Event(), cp.cuda.Event()
        bl.launch()  # keeps the device busy while the start is recorded
        a.record()
        t0 = time.perf_counter()
        for _ in range(n):
            bl.launch()
        host = time.perf_counter() - t0
        b.record()
        b.synchronize()
        return cp.cuda.get_elapsed_time(a, b) * 1e-3 / n, host / n

    def __call__(self, ck: Any, bound: tuple) -> float:
        bl = bound[0]
        if id(ck) not in self.inner:
            once = self.batch(bl, 1)[0]
            self.inner[id(ck)] = max(1, min(1000, math.ceil(SAMPLE_S / max(once, 1e-7))))
        dev, host = self.batch(bl, self.inner[id(ck)])
        bl.check()
        self.host.setdefault(id(ck), []).append(host)
        return dev


#: the measurement ``tune`` uses without a ``timer``
_gpu_timer = _GpuTimer
