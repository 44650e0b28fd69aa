"""Campaigns on a Ray cluster: the items of a seeded campaign as Ray work.

:func:`run_ray_campaign` runs the same campaign as
:func:`tilenest.validation.campaign.run_campaign` (the same checkers, items
``(seed, i) -> record``, the same state file of JSON lines, the same
summary), with the items split into *shards* of consecutive indices run by
Ray actors, one actor per CPU it is given. Because item ``i`` is a pure
function of ``(seed, i)``, it does not matter which host runs it, or in
which order; a state file started by a local run can be finished on a
cluster and the other way round.

* **Set-up once per worker.** Each actor is one worker process: it imports
  the checker's module and runs the campaign's initializer (a corpus, the
  compilers' first use) when it starts, never inside an item. An
  initializer that fails makes every item of that actor a ``crash`` naming
  it, as in the local pool.
* **Streaming.** Each actor has at most two shards queued, so the driver
  holds only a few results at a time; a finished shard's records are
  appended to the state file as it arrives, so a campaign stopped at any
  point (a kill, Ctrl-C, a lost cluster) keeps every shard that came back,
  and running the same command again runs only the rest.
* **Failures.** Checkers turn exceptions and runs past the time limit into
  records on the worker (:func:`tilenest.validation.campaign.run_item`); a
  failing item is shrunk there too, by the checker. A worker that dies (a
  signal in compiled code) loses its queued shards: their items are run
  again one at a time on a fresh actor with nothing else queued, so an item
  that kills that actor too is known to be the cause, and is recorded as a
  ``crash``.
* **Recycling.** An actor is replaced after :data:`RECYCLE` shards, so that a
  long campaign's JIT-compiled code does not pile up in one process.

The cluster is the one ``address`` names (``ray.init(address=...)``: a head
started with ``ray start --head``), or a local one of ``workers`` CPUs that
this call starts and stops; a Ray session already open in this process (as
in tests) is used as it is and left open.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import NotAvailableError, TilenestError
from .campaign import CampaignState, Checker, Journal, Progress, _init_guard, _run_chunk

#: shards an actor runs before it is replaced by a fresh process
RECYCLE = 50
#: shards queued on one actor (one running, one waiting: no idle gap between them)
QUEUED = 2


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise NotAvailableError(
            "Ray is not installed, so a campaign cannot run on a cluster",
            hint="install the cluster extra (pip install 'tilenest[cluster]'), or run "
                 "without --ray on local worker processes") from None
    return ray


@dataclass
class Session:
    """A connection to a Ray cluster: ``started`` is true when this process
    started it (and so stops it), ``cpus`` the CPUs the cluster has."""

    started: bool
    cpus: int
    address: str | None = None

    def close(self) -> None:
        if self.started:
            _ray().shutdown()


def connect(address: str | None = None, workers: int | None = None) -> Session:
    """Join the cluster at ``address`` (``HOST:PORT`` of a head, or ``auto``),
    or start a local one of ``workers`` CPUs (default: this machine's); a
    session already open in this process is used as it is. A cluster that
    cannot be reached is a :class:`~tilenest.errors.TilenestError` naming the
    address."""
    ray = _ray()
    if ray.is_initialized():
        return Session(False, int(ray.cluster_resources().get("CPU", 1)))
    opts: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                            "configure_logging": False}
    try:
        if address is None:
            ray.init(num_cpus=workers or os.cpu_count() or 1, **opts)
        else:
            _probe(address)
            ray.init(address=address, **opts)
    except (ConnectionError, RuntimeError, ValueError, TimeoutError, OSError) as e:
        ray.shutdown()
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TilenestError(f"cannot connect to the Ray cluster at {address!r}: {first}",
                            hint=_CONNECT_HINT) from None
    return Session(True, int(ray.cluster_resources().get("CPU", 1)), address)


_CONNECT_HINT = ("start the cluster's head with 'ray start --head' (it prints its address, "
                 "HOST:6379), join this host with 'ray start --address=HOST:6379', and pass "
                 "that address to --ray; or give --ray alone for a local cluster")


def _probe(address: str) -> None:
    """Fail fast on a ``HOST:PORT`` nothing listens on (``ray.init`` itself
    retries for minutes); ``auto`` and ``ray://`` addresses are left to Ray."""
    import socket

    if address == "auto" or "://" in address:
        return
    host, colon, port = address.rpartition(":")
    if not colon or not port.isdigit() or not host:
        raise ValueError(f"{address!r} is not HOST:PORT")
    with socket.create_connection((host, int(port)), timeout=5.0):
        pass


class _Worker:
    """One campaign worker process (a Ray actor): set up once, then shards."""

    def __init__(self, check: Checker, seed: int, time_limit: float,
                 init: Callable[..., None] | None, init_args: tuple[Any, ...]):
        self.check, self.seed, self.time_limit = check, seed, time_limit
        _init_guard(init, init_args)

    def run(self, items: list[int]) -> list[dict[str, Any]]:
        """The records of ``items``, in order."""
        return _run_chunk(self.check, self.seed, items, self.time_limit)

    def pid(self) -> int:
        return os.getpid()


@dataclass
class _Slot:
    """A driver-side actor: its handle, its queued shards, shards it ran."""

    actor: Any
    queued: dict[Any, list[int]] = field(default_factory=dict)
    ran: int = 0
    #: running a suspect item alone: nothing else may be queued on it
    alone: bool = False


def run_ray_campaign(name: str, check: Checker, count: int, seed: int, *,
                     state: Path | None = None, workers: int | None = None,
                     address: str | None = None, shard: int = 8, time_limit: float = 60.0,
                     progress: Progress | None = None, init: Callable[..., None] | None = None,
                     init_args: tuple[Any, ...] = ()) -> CampaignState:
    """Run items ``0..count-1`` not yet recorded in ``state`` on Ray, ``shard``
    items a task, on ``workers`` actors (default: one per CPU of the
    cluster), appending each record to ``state`` as its shard comes back;
    the arguments mean what they mean for
    :func:`~tilenest.validation.campaign.run_campaign` (``check`` and
    ``init`` must be importable by the workers: module-level functions or
    ``functools.partial`` of them). Returns the whole campaign's state."""
    if shard < 1:
        raise TilenestError(f"a shard of {shard} items", hint="give a shard size >= 1")
    with Journal(name, count, seed, state, progress) as j:
        if not j.todo:
            return j.state
        session = connect(address, workers)
        driver = None
        try:
            driver = _Driver(check, seed, time_limit, init, init_args,
                             workers or session.cpus, j.record)
            driver.run([j.todo[k:k + shard] for k in range(0, len(j.todo), shard)])
        finally:
            if driver is not None:
                driver.close()
            session.close()
    return j.state


class _Driver:
    """Hands shards to actors and records what comes back (see the module
    docstring for the failure rules)."""

    def __init__(self, check: Checker, seed: int, time_limit: float,
                 init: Callable[..., None] | None, init_args: tuple[Any, ...], n: int,
                 record: Callable[[dict[str, Any]], None]):
        ray = _ray()
        self.ray = ray
        self.record = record
        self.cls = ray.remote(num_cpus=1, max_restarts=0, max_task_retries=0)(_Worker)
        # the checker and initializer go to the object store once, not with every actor
        self.args = (ray.put(check), seed, time_limit, ray.put(init), init_args)
        self.slots = [self._new() for _ in range(max(1, n))]

    def _new(self) -> _Slot:
        return _Slot(self.cls.remote(*self.args))

    def _retire(self, slot: _Slot) -> None:
        self.ray.kill(slot.actor, no_restart=True)
        self.slots[self.slots.index(slot)] = self._new()

    def close(self) -> None:
        """Stop this campaign's actors (their CPUs go back to the cluster, which
        may outlive the campaign)."""
        for slot in self.slots:
            self.ray.kill(slot.actor, no_restart=True)
        self.slots = []

    def run(self, shards: list[list[int]]) -> None:
        ray = self.ray
        suspects: list[int] = []
        while shards or suspects or any(s.queued for s in self.slots):
            for slot in self.slots:  # fill: suspects alone on an idle actor, else shards
                if slot.ran >= RECYCLE and not slot.queued:
                    self._retire(slot)
            for slot in list(self.slots):
                if suspects and not slot.queued:
                    i = suspects.pop(0)
                    slot.alone = True
                    slot.queued[slot.actor.run.remote([i])] = [i]
                while shards and not slot.alone and len(slot.queued) < QUEUED \
                        and slot.ran + len(slot.queued) < RECYCLE:
                    c = shards.pop(0)
                    slot.queued[slot.actor.run.remote(c)] = c
            refs = [r for s in self.slots for r in s.queued]
            if not refs:
                continue
            done: list = []
            while not done:  # in steps, so that Ctrl-C reaches Python between them
                done, _ = ray.wait(refs, num_returns=1, timeout=1.0)
            for ref in done:
                slot = next(s for s in self.slots if ref in s.queued)
                items = slot.queued.pop(ref)
                try:
                    recs = ray.get(ref)
                except ray.exceptions.RayActorError as e:
                    if e.actor_init_failed:  # the worker could not even be set up
                        raise _setup_failed(e) from None
                    # the actor died: every shard queued on it is lost
                    lost = [items] + list(slot.queued.values())
                    alone = slot.alone
                    slot.queued.clear()
                    self.slots[self.slots.index(slot)] = self._new()
                    if alone:
                        self.record(_died(items[0]))
                    else:
                        suspects.extend(i for c in lost for i in c)
                    continue
                slot.ran += 1
                slot.alone = False
                for rec in recs:
                    self.record(rec)


def _setup_failed(e: Exception) -> TilenestError:
    lines = [ln for ln in str(e).splitlines() if ln.strip()]
    cause = next((ln.strip() for ln in reversed(lines) if "Error" in ln), lines[-1] if lines
                 else type(e).__name__)
    return TilenestError(f"a campaign worker could not start on the cluster: {cause}",
                         hint="every host of the cluster needs tilenest installed in the "
                              "Python that runs Ray (the same version as here)")


def _died(i: int) -> dict[str, Any]:
    return {"i": i, "status": "crash", "secs": 0.0, "cpu_secs": 0.0,
            "message": "the worker process died (a signal in compiled code?)"}


# ---------------------------------------------------------------------------
# the campaigns `tilenest campaign` runs

#: campaign kinds: differential programs, reader mutations
KINDS = ("fuzz", "text")


@dataclass(frozen=True)
class Campaign:
    """A runnable campaign: the name its state file records, its checker and
    per-process initializer, items per shard, and what it calls an item."""

    kind: str
    name: str
    check: Checker
    init: Callable[..., None] | None = None
    init_args: tuple[Any, ...] = ()
    shard: int = 8
    unit: str = "programs"


def make_campaign(kind: str, targets: str | None = None, cases: int = 2,
                  mutant: str | None = None, shrink_secs: float = 60.0) -> Campaign:
    """The campaign of ``kind`` (:data:`KINDS`): ``fuzz`` validates random
    programs on the targets of ``targets`` (``llvm,cuda:50``, see
    :func:`tilenest.validation.fuzz.parse_targets`; default ``llvm``),
    ``text`` mutates reader inputs. Failures are shrunk on the worker for up
    to ``shrink_secs`` processor seconds (0: not at all)."""
    import functools

    if kind == "fuzz":
        from . import fuzz

        plan = fuzz.parse_targets(targets or "llvm")
        for t, _ in plan:
            _require_host_run(t)
        if mutant is not None:
            from .mutants import MUTATIONS

            if mutant not in MUTATIONS:
                raise TilenestError(f"no mutant '{mutant}'", hint="mutants: " +
                                    ", ".join(MUTATIONS))
        check = functools.partial(fuzz.check_item, cases=cases, targets=plan, mutant=mutant,
                                  shrink_secs=shrink_secs)
        return Campaign(kind, fuzz.plan_name(plan, cases, mutant), check, fuzz.init_worker,
                        (plan,))
    if kind == "text":
        from . import fuzz_text

        if targets is not None or mutant is not None:
            raise TilenestError("the text campaign reads IR; it has no targets or mutants",
                                hint="drop --targets and --mutant, or use the fuzz campaign")
        check = functools.partial(fuzz_text.check_item, shrink_secs=min(shrink_secs, 10.0))
        # the corpus is built once, here, and sent to every worker with its set-up
        seeds = fuzz_text.corpus()
        if not seeds:
            raise TilenestError(f"the text campaign found no corpus under {fuzz_text.ROOT}",
                                hint="it mutates the programs of spec/conformance/cases and "
                                     "examples/: run it from a source checkout of tilenest")
        return Campaign(kind, fuzz_text.CAMPAIGN, check, fuzz_text.init_worker, (seeds,),
                        fuzz_text.CHUNK, "inputs")
    raise TilenestError(f"no campaign kind '{kind}'", hint="kinds: " + ", ".join(KINDS))


def _require_host_run(target: str) -> None:
    """Check, before any item, that ``target`` can run here the way the
    fuzzer runs it (its backend's ``require_host_run``, where it has one:
    ``cuda`` on the emulated device needs NVRTC and a host C++ compiler), so
    that a missing toolchain is one error, not every program ``unsupported``."""
    from ..targets import compiler

    check = getattr(compiler(target).load(), "require_host_run", None)
    if check is not None:
        check()


def run(c: Campaign, count: int, seed: int, *, state: Path | None = None, workers: int = 1,
        ray: bool = False, address: str | None = None, shard: int | None = None,
        time_limit: float = 120.0, progress: Progress | None = None) -> CampaignState:
    """Run ``c`` on local worker processes, or with ``ray`` on a Ray cluster
    (the one at ``address``, else a local one of ``workers`` CPUs)."""
    from .campaign import run_campaign

    k = shard or c.shard
    if ray:
        return run_ray_campaign(c.name, c.check, count, seed, state=state,
                                workers=None if address else workers, address=address,
                                shard=k, time_limit=time_limit, progress=progress,
                                init=c.init, init_args=c.init_args)
    return run_campaign(c.name, c.check, count, seed, state=state, workers=workers,
                        time_limit=time_limit, chunk=k, progress=progress, init=c.init,
                        init_args=c.init_args)


def report(c: Campaign, st: CampaignState) -> dict[str, Any]:
    """The merged report of a campaign, from its records alone: the summary of
    :meth:`CampaignState.summary` (statuses, per-target counts, bugs), cases
    compared and skipped (fuzz) or the readers' tally (text), and the bug
    records (with their shrunk reproducers)."""
    out = st.summary()
    recs = st.records.values()
    if c.kind == "fuzz":
        out["cases_compared"] = sum(r.get("compared", 0) for r in recs)
        out["cases_skipped"] = sum(r.get("skipped", 0) for r in recs)
    else:
        from . import fuzz_text

        out["readers"] = fuzz_text.tally(st, c.init_args[0] if c.init_args else None).counts
    out["findings"] = st.bugs()
    return out


def render_report(c: Campaign, rep: dict[str, Any], limit: int = 20) -> str:
    """:func:`report` as text: one line of figures, a line per target, and
    each finding with its shrunk reproducer (the first ``limit``)."""
    def counts(d: dict[str, int]) -> str:
        return ", ".join(f"{k} {v}" for k, v in d.items()) or "none"

    head = (f"campaign {rep['campaign']} seed {rep['seed']}: {rep['done']} of {rep['count']} "
            f"{c.unit}, {rep['bugs']} bugs")
    lines = [head, f"  statuses: {counts(rep['statuses'])}"]
    for t, d in rep.get("targets", {}).items():
        lines.append(f"  {t}: {sum(d.values())} {c.unit}: {counts(d)}")
    if c.kind == "fuzz":
        lines.append(f"  cases compared {rep['cases_compared']}, skipped {rep['cases_skipped']}")
    else:
        lines.append(f"  readers: {counts(rep['readers'])}")
    lines.append(f"  item time {rep['item_secs']} s, slowest item {rep['slowest_secs']} s")
    for f in rep["findings"][:limit]:
        where = f" on {f['target']}" if "target" in f else ""
        msg = (f.get("message") or "").splitlines()
        lines.append(f"  [{f['status']}] #{f['i']}{where}: {msg[0] if msg else ''}")
        sh = f.get("shrunk")
        if sh:
            size = (f"{sh['steps']} of {sh['from_steps']} steps" if "steps" in sh else
                    f"{sh['chars']} of {sh['from_chars']} characters")
            lines.append(f"    shrunk to {size} on {sh['host']} (pid {sh['pid']}), "
                         f"{sh['tries']} tries, {sh['cpu_secs']} s, stopped: {sh['stopped']}")
            body = sh.get("source") or sh.get("input") or ""
            lines += ["      " + ln for ln in body.splitlines()]
    if len(rep["findings"]) > limit:
        lines.append(f"  ... and {len(rep['findings']) - limit} more in the state file")
    return "\n".join(lines)
