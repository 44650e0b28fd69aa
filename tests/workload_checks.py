"""Judging a workload run (every target's workload tests): the interpreter's
oracle and the workload's own FP64 formula; and running a workload on an
emulated SIMT device (the ``cuda`` and ``metal`` targets' workload tests)
under rotating interleaving policies and shared-memory poisons."""

from __future__ import annotations

import numpy as np

import tilenest as tn
from tilenest.backends.simt.emulator import POISONS, POLICIES
from tilenest.lowering import default_schedule
from tilenest.targets import TARGETS
from tilenest.workloads import WORKLOADS
from tilenest.workloads.base import Result, Workload, check


def _copy(a):  # type: ignore[no-untyped-def]
    return a.copy() if isinstance(a, np.ndarray) else a


def assert_validates(r: Result, label: str = "", adm: tuple | None = None) -> tuple:
    """The outputs of ``r`` against the oracle (``adm``: the admitted sets,
    computed when not given; returned for reuse) and the FP64 formula."""
    tag = f"{r.workload.name} {r.size} {r.dtype.name} {r.schedule}" + (f" [{label}]" if label else "")
    if adm is None:
        got = tn.reference(r.kernel, *(_copy(a) for a in r.args.values()))
        adm = got if isinstance(got, tuple) else (got,)
    assert {a.name for a in adm} == set(r.outputs), tag
    for a in adm:
        v = a.admits(r.outputs[a.name])
        assert v, f"{tag}: oracle ({a.name}): {v}"
    checks = check(r)
    assert checks, tag
    for c in checks:
        assert c, f"{tag}: FP64 formula: {c}"
    return adm


def runs_for(i: int) -> list[tuple[str, str, int]]:
    """The two ``(policy, poison, seed)`` emulated runs of case ``i``:
    different policies and different poisons, rotating with ``i`` so that
    consecutive cases together use every policy and every poison."""
    return [(POLICIES[i % 4], POISONS[i % 3], 2 * i + 1),
            (POLICIES[(i + 2) % 4], POISONS[(i + 1) % 3], 2 * i + 2)]


def emulated_runs(target: str, wl: Workload, size: str, dtype, i: int,  # type: ignore[no-untyped-def]
                  schedule: dict | None = None, gpu: dict | None = None
                  ) -> list[tuple[str, Result]]:
    """Compile ``wl`` (tile schedule ``schedule``, else its first) for the
    emulated device of SIMT target ``target`` (``gpu``: ``Schedule``
    overrides) and run it on its seeded arguments once per run of
    :func:`runs_for`; each result labelled with its policy and poison."""
    sched = dict(wl.schedules[0] if schedule is None else schedule)
    sz = wl.size(size)
    k = wl.kernel(dtype, sched, sz)
    ck = TARGETS[target].compile(k.program, default_schedule(k.program, target, **(gpu or {})),
                                 device="emulated")
    args = wl.args(sz, dtype)
    out = []
    for policy, poison, seed in runs_for(i):
        work = {n: _copy(a) for n, a in args.items()}
        ck(*work.values(), policy=policy, poison=poison, seed=seed)
        out.append((f"{policy}/{poison}",
                    Result(wl, sz, dtype, sched, k, args, {n: work[n] for n in wl.outputs})))
    return out


def judge_emulated(target: str, name: str, size: str, dtype, i: int,  # type: ignore[no-untyped-def]
                   schedule: dict | None = None, gpu: dict | None = None) -> None:
    """Every run of :func:`emulated_runs` admitted by the oracle and within
    the FP64 formula's bound."""
    adm = None
    for label, r in emulated_runs(target, WORKLOADS[name], size, dtype, i, schedule, gpu):
        adm = assert_validates(r, label, adm)
