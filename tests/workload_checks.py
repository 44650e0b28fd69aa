"""Judging a workload run (every target's workload tests): the interpreter's
oracle and the workload's own FP64 formula."""

from __future__ import annotations

import numpy as np

import tilenest as tn
from tilenest.workloads.base import Result, check


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
