"""Real kernels written in the DSL, each with an independent FP64 oracle.

See :mod:`tilenest.workloads.base` for what a workload is. ``WORKLOADS`` maps
each name to its :class:`~tilenest.workloads.base.Workload`."""

from __future__ import annotations

from . import attention, elementwise, embedding, gemm, losses, norms, rows, scans, selection, softmax
from .base import Result, Workload, admitted, check, reference, run

WORKLOADS: dict[str, Workload] = {w.name: w for m in (gemm, elementwise, rows, softmax, norms, losses,
                                                      attention, scans, selection, embedding) for w in m.WORKLOADS}

__all__ = ["WORKLOADS", "Workload", "Result", "run", "check", "admitted", "reference"]
