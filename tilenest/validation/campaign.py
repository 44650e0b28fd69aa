"""Seeded, resumable, sharded campaigns.

A campaign checks the items ``0 .. count-1`` of a seeded stream (random
programs, mutated IR texts, ...). Item ``i`` is a pure function of
``(seed, i)``, so a campaign is reproducible item by item, can be split over
worker processes in any order, and can be stopped and resumed: every finished
item is appended, as one JSON line, to a *state file* whose first line names
the campaign and its seed. Resuming reads the file, skips the items it
records and runs the rest; the summary is always computed from the whole
file, so a resumed campaign reports exactly what an uninterrupted one would.

Each item yields a record ``{"i": i, "status": ..., "secs": ..., "cpu_secs": ...}``
plus whatever the checker adds (a message, the failing input). A record is a
*bug* when its status is one of :data:`BUG_STATUSES` or the checker marked it
``"bug": true`` (a campaign with statuses of its own, such as a reader's
``unlocated`` error, says so in the record, so the state file alone decides
the summary). A checker that raises, or runs past the per-item time limit, is
recorded as ``crash`` or ``timeout``: the campaign itself never stops on an
item.

A checker that needs costly set-up (a corpus, a compiler) names an
initializer: it runs once in every process that runs items (the campaign's
own when ``workers`` is 1, else each worker as it starts), never inside an
item's time.

A campaign's programs are compiled once and never again, so campaigns run
in the persistent cache's no-store mode (``tilenest.diskcache.no_store``):
they read the cache but keep no per-program entry in it (tilenest's own
runtime is still kept), in their own process and in every worker.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import _thread
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from ..errors import TilenestError

#: a checker: (seed, index) -> record fields (at least "status")
Checker = Callable[[int, int], dict[str, Any]]

#: statuses that count as a bug found by the campaign
BUG_STATUSES = ("mismatch", "error", "crash", "timeout", "slow")


def is_bug(rec: dict[str, Any]) -> bool:
    """Does this record count as a bug: a status in :data:`BUG_STATUSES`, or
    the checker's own ``"bug": true`` mark?"""
    return rec["status"] in BUG_STATUSES or rec.get("bug") is True


class _ItemTimeout(BaseException):
    """Raised by the per-item alarm; a BaseException so that checked code
    which turns every ``Exception`` into a verdict cannot swallow it."""


#: what a checker may catch to stop work of its own (a shrinker) at the item's limit
ItemTimeout = _ItemTimeout

#: the process time at which the running item's limit falls (None: no limit)
_DEADLINE: float | None = None


def remaining_cpu() -> float:
    """Processor seconds the running item has left before its time limit
    (infinity outside an item or without a limit). A checker that does
    optional work after its verdict (shrinking a failure) bounds it by this,
    so the verdict is never lost to a ``timeout``."""
    if _DEADLINE is None:
        return float("inf")
    return _DEADLINE - time.process_time()


def _on_alarm(signum: int, frame: Any) -> None:
    if _DEADLINE is not None:  # a signal handled after its item ended is dropped
        raise _ItemTimeout()


class _Watchdog:
    """A thread beside one time-limited item. Each time it wakes it takes the
    interpreter lock, which makes the main thread stop at its next bytecode
    and run the handlers of signals marked pending, wherever they were
    delivered; and once the process's processor time is past the item's
    deadline by ``grace`` seconds without the timer's signal having acted, it
    raises the signal in the main thread itself."""

    def __init__(self, deadline: float, limit: float) -> None:
        self._deadline = deadline
        self._grace = max(0.25, limit / 2)
        self._period = min(0.05, limit / 4)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="tilenest-item-watchdog",
                                        daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        late = False
        while not self._done.wait(self._period):
            if not late and time.process_time() > self._deadline + self._grace:
                late = True
                _thread.interrupt_main(signal.SIGPROF)

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


def run_item(check: Checker, seed: int, i: int, time_limit: float) -> dict[str, Any]:
    """One item, timed; an exception or a run past ``time_limit`` seconds of
    CPU time becomes a ``crash`` / ``timeout`` record instead of escaping. The
    limit counts the process's CPU time (``ITIMER_PROF``), not wall time, so
    a campaign run at low priority on a busy machine does not report slow
    scheduling as slow programs. (Checked code that blocks without computing
    is not stopped by it; the checkers here only compute.) The record keeps
    both clocks: ``secs`` (wall) and ``cpu_secs`` (this process's processor
    time).

    The kernel delivers the timer's signal to any thread of the process that
    does not block it: a native thread (an OpenBLAS or compiled-code worker)
    as often as the one running the item. CPython before 3.12 then only marks
    the signal pending and does not interrupt the main thread's loop, so an
    item spinning in pure Python would never see it; a :class:`_Watchdog`
    thread runs beside every limited item to make the main thread act on it
    (and raises the timeout itself should the timer's signal be lost)."""
    global _DEADLINE
    t0 = time.perf_counter()
    c0 = time.process_time()
    use_alarm = time_limit > 0 and hasattr(signal, "SIGPROF")
    if use_alarm:
        old = signal.signal(signal.SIGPROF, _on_alarm)
        _DEADLINE = c0 + time_limit
        watchdog = _Watchdog(_DEADLINE, time_limit)
        signal.setitimer(signal.ITIMER_PROF, time_limit)
    try:
        rec = dict(check(seed, i))
    except _ItemTimeout:
        rec = {"status": "timeout", "message": f"ran past {time_limit:g} s"}
    except Exception as e:  # noqa: BLE001 - a crash of the checked code is a finding
        import traceback

        rec = {"status": "crash", "message": f"{type(e).__name__}: {e}",
               "traceback": traceback.format_exc(limit=20)}
    finally:
        if use_alarm:
            signal.setitimer(signal.ITIMER_PROF, 0)
            _DEADLINE = None
            watchdog.stop()
            signal.signal(signal.SIGPROF, old)
    rec["i"] = i
    rec["secs"] = round(time.perf_counter() - t0, 4)
    rec["cpu_secs"] = round(time.process_time() - c0, 4)
    return rec


#: in a worker process: why its initializer failed (None when it succeeded)
_INIT_ERROR: str | None = None


def _init_guard(init: Callable[..., None] | None, args: tuple[Any, ...]) -> None:
    """A worker's initializer. A failure is kept, not raised: raising would
    break the pool, and every item would then be re-run alone and misreported
    as a dead worker; instead each item of this worker records it."""
    global _INIT_ERROR
    from ..diskcache import set_no_store

    set_no_store(True)  # a worker compiles one-off programs: nothing of them is kept
    if init is None:
        return
    try:
        init(*args)
    except Exception as e:  # noqa: BLE001 - reported on every item this worker takes
        import traceback

        _INIT_ERROR = f"the worker's initializer failed: {type(e).__name__}: {e}\n" + \
            traceback.format_exc(limit=20)


def _run_chunk(check: Checker, seed: int, items: list[int], time_limit: float
               ) -> list[dict[str, Any]]:
    if _INIT_ERROR is not None:
        return [{"i": i, "status": "crash", "secs": 0.0, "cpu_secs": 0.0,
                 "message": _INIT_ERROR.splitlines()[0], "traceback": _INIT_ERROR}
                for i in items]
    return [run_item(check, seed, i, time_limit) for i in items]


@dataclass
class CampaignState:
    """What a state file records: the campaign's identity and its finished items."""

    name: str
    seed: int
    count: int
    records: dict[int, dict[str, Any]] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """Counts per status over the finished items, total item time, the
        number of bugs (records for which :func:`is_bug` holds) and, when the
        records carry them, the counts per target (:meth:`target_statuses`)."""
        counts: dict[str, int] = {}
        for r in self.records.values():
            counts[r["status"]] = counts.get(r["status"], 0) + 1
        out = {"campaign": self.name, "seed": self.seed, "count": self.count,
               "done": len(self.records), "statuses": dict(sorted(counts.items())),
               "bugs": sum(is_bug(r) for r in self.records.values()),
               "item_secs": round(sum(r.get("secs", 0.0) for r in self.records.values()), 1),
               "slowest_secs": max((r.get("secs", 0.0) for r in self.records.values()),
                                   default=0.0)}
        per = self.target_statuses()
        if per:
            out["targets"] = per
        return out

    def target_statuses(self) -> dict[str, dict[str, int]]:
        """Counts per status on each target, for records that say what each
        target gave (``"targets": {name: {"status": ...}}``); empty when none do."""
        per: dict[str, dict[str, int]] = {}
        for r in self.records.values():
            for t, tr in (r.get("targets") or {}).items():
                c = per.setdefault(t, {})
                c[tr["status"]] = c.get(tr["status"], 0) + 1
        return {t: dict(sorted(c.items())) for t, c in sorted(per.items())}

    def bugs(self) -> list[dict[str, Any]]:
        """The bug records, in item order."""
        return [self.records[i] for i in sorted(self.records) if is_bug(self.records[i])]


def load_state(path: Path, name: str, seed: int, count: int) -> CampaignState:
    """Read a state file (or start one): it must belong to the same campaign
    and seed, else resuming would mix two streams.

    The file is a regular file of JSON lines: a head object naming the
    campaign and seed, then one record object per item with an integer ``i``
    and a string ``status``. Anything else is a located error naming the line.
    Records of items at or past ``count`` (a campaign resumed with a smaller
    ``--count``: item ``i`` is the same in both) stay in the file but are not
    this campaign's: they are not read, so the report never counts more items
    than the campaign has. A last line cut short by a kill is skipped (that
    item simply runs again)."""
    from ..userfiles import read_bytes

    st = CampaignState(name, seed, count)
    if not path.exists():
        return st
    hint = "pass a new --state path, or delete this file"
    lines = read_bytes(path, "campaign state file", hint).decode(
        "utf-8", errors="replace").splitlines()
    if not lines:
        return st
    try:
        head = json.loads(lines[0])
    except json.JSONDecodeError:
        head = None
    if not isinstance(head, dict) or "campaign" not in head:
        raise TilenestError(f"{path}:1: not a campaign state file (its first line is not a "
                            "head naming the campaign and seed)", hint=hint) from None
    if head.get("campaign") != name or head.get("seed") != seed:
        raise TilenestError(
            f"{path}: state of campaign {head.get('campaign')!r} seed {head.get('seed')}, "
            f"not {name!r} seed {seed}", hint="resume with the same campaign and seed, or "
            "use another --state file")
    for ln, line in enumerate(lines[1:], start=2):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            # a line cut short by a kill: the item is simply run again
            if ln == len(lines):
                continue
            raise TilenestError(f"{path}:{ln}: corrupt record (not JSON)", hint=hint) from None
        why = _record_problem(rec)
        if why is not None:
            raise TilenestError(f"{path}:{ln}: corrupt record ({why})", hint=hint)
        if rec["i"] < count:
            st.records[rec["i"]] = rec
    return st


def _record_problem(rec: Any) -> str | None:
    """Why ``rec`` is not an item record of a state file, or None."""
    if not isinstance(rec, dict):
        return f"a JSON {type(rec).__name__}, not an object"
    i = rec.get("i")
    if not isinstance(i, int) or isinstance(i, bool) or i < 0:
        return f"its item index 'i' is {i!r}, not a non-negative integer"
    if not isinstance(rec.get("status"), str):
        return f"its 'status' is {rec.get('status')!r}, not a name"
    targets = rec.get("targets")
    if targets is not None and not (isinstance(targets, dict) and all(
            isinstance(t, dict) and isinstance(t.get("status"), str) for t in targets.values())):
        return "its 'targets' is not an object of per-target records with a 'status'"
    for key in ("secs", "cpu_secs"):
        if key in rec and (not isinstance(rec[key], (int, float)) or isinstance(rec[key], bool)):
            return f"its {key!r} is {rec[key]!r}, not a number"
    return None


#: called after each record is kept: (the campaign so far, the new record)
Progress = Callable[[CampaignState, dict[str, Any]], None]


class Journal:
    """A campaign's state as it runs: the records so far (read back from the
    state file when resuming) and the file they are appended to, one JSON line
    each, flushed as it arrives. Every runner (the local pool,
    :mod:`tilenest.validation.cluster`) keeps its records through one, so a
    state file written by one can be resumed by another.

    Use it as a context manager; :attr:`todo` is the items not yet recorded."""

    def __init__(self, name: str, count: int, seed: int, state: Path | None = None,
                 progress: Progress | None = None):
        self.state = load_state(state, name, seed, count) if state is not None else \
            CampaignState(name, seed, count)
        self.todo = [i for i in range(count) if i not in self.state.records]
        self._path = state
        self._progress = progress
        self._out: Any = None

    def __enter__(self) -> Self:
        if self._path is not None:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            fresh = not self._path.exists() or self._path.stat().st_size == 0
            self._out = self._path.open("a")
            if fresh:
                self._out.write(json.dumps({"campaign": self.state.name,
                                            "seed": self.state.seed}) + "\n")
                self._out.flush()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None

    def record(self, rec: dict[str, Any]) -> None:
        """Keep one finished item's record (a later record of the same item
        replaces it, in memory and, when the file is read back, on disk)."""
        self.state.records[rec["i"]] = rec
        if self._out is not None:
            self._out.write(json.dumps(rec) + "\n")
            self._out.flush()
        if self._progress is not None:
            self._progress(self.state, rec)


def run_campaign(name: str, check: Checker, count: int, seed: int, *,
                 state: Path | None = None, workers: int = 1, time_limit: float = 60.0,
                 chunk: int = 8, progress: Progress | None = None,
                 init: Callable[..., None] | None = None, init_args: tuple[Any, ...] = ()
                 ) -> CampaignState:
    """Run items ``0..count-1`` not yet recorded in ``state``, appending each
    record as it finishes. ``check`` (and ``init``) must be module-level
    functions: they are sent to worker processes by name. ``init(*init_args)``
    runs once in each process that runs items, before its first item (and
    again in a worker that replaces a recycled or dead one); with one worker
    its exception propagates, in a pool every item of that worker is a
    ``crash`` naming it."""
    from ..diskcache import no_store

    setup = _Setup(init, init_args)
    with no_store(), Journal(name, count, seed, state, progress) as j:
        if workers <= 1:
            if j.todo and init is not None:
                init(*init_args)
            for i in j.todo:
                j.record(run_item(check, seed, i, time_limit))
        elif j.todo:
            _run_pooled(check, seed, j.todo, workers, chunk, time_limit, j.record, setup)
    return j.state


@dataclass(frozen=True)
class _Setup:
    """The per-process initializer of a pool (``init`` is None when there is none)."""

    init: Callable[..., None] | None
    args: tuple[Any, ...]

    def pool(self, workers: int, ctx: Any, **kw: Any) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_guard,
                                   initargs=(self.init, self.args), **kw)


def _run_pooled(check: Checker, seed: int, todo: list[int], workers: int, chunk: int,
                time_limit: float, record: Callable[[dict[str, Any]], None],
                setup: _Setup) -> None:
    """Run ``todo`` on a pool of ``workers`` processes, ``chunk`` items a task.
    A worker that dies (a segfault in compiled code) breaks the pool: the
    unfinished chunks are re-run one item a task on a new pool, an item that
    fails again is re-run alone, and one that kills its worker alone is
    recorded as a ``crash``."""
    ctx = multiprocessing.get_context("forkserver" if os.name == "posix" else "spawn")
    queue = [todo[k:k + chunk] for k in range(0, len(todo), chunk)]
    while queue:
        failed: list[list[int]] = []
        # workers are recycled so a long campaign's JIT memory stays bounded
        with setup.pool(workers, ctx, max_tasks_per_child=50) as ex:
            pending: dict[Any, list[int]] = {}

            def submit(ex: Any = ex, pending: dict[Any, list[int]] = pending) -> None:
                while queue and len(pending) < 2 * workers:
                    fut = ex.submit(_run_chunk, check, seed, queue[0], time_limit)
                    pending[fut] = queue.pop(0)

            try:
                submit()
                while pending:
                    done, _ = wait(list(pending), return_when=FIRST_COMPLETED)
                    for fut in done:
                        c = pending.pop(fut)
                        try:
                            recs = fut.result()
                        except BrokenProcessPool:
                            failed.append(c)
                            continue
                        for rec in recs:
                            record(rec)
                    submit()
            except BrokenProcessPool:
                pass
            failed.extend(pending.values())
        for c in failed:
            if len(c) == 1:
                _run_isolated(check, seed, c[0], time_limit, ctx, record, setup)
            else:
                queue[:0] = [[i] for i in c]


def _run_isolated(check: Checker, seed: int, i: int, time_limit: float, ctx: Any,
                  record: Callable[[dict[str, Any]], None], setup: _Setup) -> None:
    """Item ``i`` alone in a fresh one-worker pool: if its worker dies now,
    nothing else was running, so the item is the cause (``crash``)."""
    with setup.pool(1, ctx) as ex:
        try:
            recs = ex.submit(_run_chunk, check, seed, [i], time_limit).result()
        except BrokenProcessPool:
            recs = [{"i": i, "status": "crash", "secs": 0.0, "cpu_secs": 0.0,
                     "message": "the worker process died (a signal in compiled code?)"}]
    for rec in recs:
        record(rec)
